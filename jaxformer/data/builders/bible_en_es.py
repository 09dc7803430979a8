"""``bible_en_es``: English↔Spanish verse pairs (KJV ↔ Reina-Valera 1909), aligned by reference.

Source: the Debian packages ``sword-text-kjv 14.3-1`` (SWORD module ``engKJV2006eb``) and
``sword-text-sparv 2.60-1`` (``spaRV1909eb``), zText modules in KJV versification (see
`sword`). Verse text is the OSIS markup with notes and non-canonical titles removed and all
tags stripped (`sword.osis_to_text`).

Both modules tag words with Strong's numbers, which makes alignment checkable. RV1909 numbers
some chapters as the Hebrew Bible does (e.g. KJV Jonah 1:17 is its Jonah 2:1), and those
chapters were put into KJV slots by verse number, so they are shifted against the English.
A pair is kept when, with ``J(i, j)`` the Jaccard overlap of the Strong's numbers of English
verse ``i`` and Spanish verse ``j`` (verses in canonical order):

- ``J(i, i) >= 0.2``, and
- offset 0 scores highest among offsets ``o`` in [-3, 3] summed over a 5-verse window:
  ``sum_{|k-i|<=2} J(k, k) >= sum_{|k-i|<=2} J(k, k+o)``.

This keeps 30,886 of 31,102 verses; it drops the 18 verses empty in RV1909, the shifted
chapters (Numbers 13 and 30, 1 Samuel 24, 1 Chronicles 21, 2 Chronicles 33, Job 39–40,
Hosea 12, Jonah 2, the end of 1 Kings 22) and ~40 loosely translated single verses.

Fields: ``source`` (English), ``target`` (Spanish), ``id`` (OSIS reference, ``Gen.1.1``).
Splits by hash of id, 90/5/5 (as ``kjv_bible``): train 27,781 · validation 1,529 · test 1,576.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from jaxformer.data import fetch
from jaxformer.data.builders import base, sword

KJV = fetch.Artifact(
    kind="deb", name="sword-text-kjv", version="14.3-1", filename="sword-text-kjv_14.3-1_all.deb",
    sha256="9f463f28ce665f6f528fc723179722bced880a4c5485f7a41bf742838315de57")
SPARV = fetch.Artifact(
    kind="deb", name="sword-text-sparv", version="2.60-1",
    filename="sword-text-sparv_2.60-1_all.deb",
    sha256="5c87f9b2bc97457e8a872f5bae7ea7ce59cb3de1dcee73e4d4740451863694cf")
MODULES = "usr/share/sword/modules/texts/ztext/"
KJV_MODULE = MODULES + "engKJV2006eb"
SPARV_MODULE = MODULES + "spaRV1909eb"
MIN_OVERLAP = 0.2
MAX_SHIFT = 3
WINDOW = 5


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def aligned(source_lemmas: Sequence[frozenset[str]], target_lemmas: Sequence[frozenset[str]]
            ) -> np.ndarray:
    """Boolean ``[num_verses]`` mask of the verse pairs kept (rule in the module docstring)."""
    n = len(source_lemmas)
    offsets = range(-MAX_SHIFT, MAX_SHIFT + 1)
    overlap = np.zeros((len(offsets), n))  # [offset, verse]
    for row, o in enumerate(offsets):
        for i in range(max(0, -o), min(n, n - o)):
            overlap[row, i] = _jaccard(source_lemmas[i], target_lemmas[i + o])
    windowed = np.stack([np.convolve(r, np.ones(WINDOW), mode="same") for r in overlap])
    zero = MAX_SHIFT
    return (overlap[zero] >= MIN_OVERLAP) & (windowed[zero] >= windowed.max(axis=0))


class BibleEnEs(base.LocalBuilder, skip_registration=True):
    """Aligned English/Spanish Bible verses (see module docstring)."""

    ARTIFACTS = (KJV, SPARV)
    SPLIT_FRACTIONS = (0.9, 0.05, 0.05)
    DESCRIPTION = "KJV English / Reina-Valera 1909 Spanish verse pairs aligned by reference."
    HOMEPAGE = "https://www.crosswire.org/sword/"

    def _features(self) -> tfds.features.FeaturesDict:
        return tfds.features.FeaturesDict({"source": tfds.features.Text(),
                                           "target": tfds.features.Text(),
                                           "id": tfds.features.Text()})

    def _examples(self, archives: Sequence[pathlib.Path]) -> Iterator[tuple[str, dict[str, Any]]]:
        english = sword.read_module(fetch.read_deb_members(archives[0], KJV_MODULE), KJV_MODULE)
        spanish = sword.read_module(fetch.read_deb_members(archives[1], SPARV_MODULE),
                                    SPARV_MODULE)
        ids = list(english)
        keep = aligned([sword.strongs_numbers(english[k]) for k in ids],
                       [sword.strongs_numbers(spanish[k]) for k in ids])
        for key, ok in zip(ids, keep):
            source, target = sword.osis_to_text(english[key]), sword.osis_to_text(spanish[key])
            if ok and source and target:
                yield key, {"source": source, "target": target, "id": key}
