"""Built-in corpora: local TFDS builders over real text shipped in registry packages.

=================  ==========================================  ================================
name               contents                                    fields
=================  ==========================================  ================================
shakespeare        complete works, one example per paragraph   text, id, work
kjv_bible          King James Bible, one example per verse     text, id, book, chapter, verse
movie_sentiment    10,605 movie-review sentences, label>0      text, label, id, score
bible_en_es        30,886 English/Spanish verse pairs          source, target, id
review_snippets    13,098 review/editorial/tweet snippets      text, id, kind, score
=================  ==========================================  ================================

Each is fetched once per machine into the cache (`jaxformer.data.fetch`), built into
array_record files and read back as a random-access TFDS data source.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jaxformer.data.builders.base import (
    SPLITS,
    LocalBuilder,
    hash_split,
    load,
    no_tempdir_leak,
    prepared_builder,
    require_build_dependencies,
)
from jaxformer.data.builders.bible_en_es import BibleEnEs
from jaxformer.data.builders.kjv_bible import KjvBible
from jaxformer.data.builders.movie_sentiment import MovieSentiment
from jaxformer.data.builders.review_snippets import ReviewSnippets
from jaxformer.data.builders.shakespeare import Shakespeare

BUILDERS: dict[str, type[LocalBuilder]] = {
    "shakespeare": Shakespeare,
    "kjv_bible": KjvBible,
    "movie_sentiment": MovieSentiment,
    "bible_en_es": BibleEnEs,
    "review_snippets": ReviewSnippets,
}


def builtin_source(name: str, split: str) -> Sequence[dict[str, Any]]:
    """Random-access TFDS data source of a built-in corpus' split (records hold bytes/numpy)."""
    if name not in BUILDERS:
        raise ValueError(f"unknown built-in dataset {name!r}; choose one of {sorted(BUILDERS)}")
    return load(BUILDERS[name], split)


__all__ = ["BUILDERS", "SPLITS", "BibleEnEs", "KjvBible", "LocalBuilder", "MovieSentiment",
           "ReviewSnippets", "Shakespeare", "builtin_source", "hash_split", "load",
           "no_tempdir_leak", "prepared_builder", "require_build_dependencies"]
