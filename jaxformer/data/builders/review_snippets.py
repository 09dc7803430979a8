"""``review_snippets``: 13,098 product-review, editorial and tweet snippets (unlabelled-text use).

In-domain text for MLM pretraining before ``movie_sentiment`` fine-tuning. Source: the other
three ground-truth files of the VADER paper (Hutto & Gilbert, ICWSM 2014) in the same PyPI
sdist as ``movie_sentiment`` (``vadersentiment==3.3.2``,
``additional_resources/hutto_ICWSM_2014.tar.gz``); the movie-review file is left out (that is
``movie_sentiment``):

==========  ===========================================  =========  =====================
kind        file (in ``hutto_ICWSM_2014/``)               snippets   file ids
==========  ===========================================  =========  =====================
amazon      ``amazonReviewSnippets_GroundTruth.txt``       3,708    ``<review>_<k>``
nyt         ``nytEditorialSnippets_GroundTruth.txt``       5,190    ``<editorial>_<k>``
tweets      ``tweets_GroundTruth.txt``                     4,200    ``1`` … ``4200``
==========  ===========================================  =========  =====================

Each file is tab-separated ``id, mean score, text`` with CRLF line ends, valid UTF-8 (amazon and
nyt are pure ASCII; the tweets hold two non-ASCII characters, ``£`` and ``ñ``) and is decoded
strictly: the archive is pinned by sha256, so a decoding error would mean a different file and
is raised, never papered over with replacement characters. The texts are HTML-escaped: every
``&``, ``<``, ``>`` of them (``&amp;`` 197×, ``&lt;`` 29×, ``&gt;`` 14×, e.g. the tweets'
``&lt;3``), 16 snippets twice (``&amp;amp;`` in 8 NYT, ``&amp;#38;`` in 7 Amazon, ``&amp;#39;`` in 1
tweet); they are unescaped with `html.unescape` until nothing changes. Then whitespace runs are
collapsed to one space as in ``movie_sentiment``.

Features: ``text``; ``id`` = ``<kind>.<file id>`` (``amazon.1_1``, ``tweets.17``); ``kind``;
``score`` = the mean sentiment of at least 20 raters on [-4, 4] (unused by MLM; kept so the snippets
can also serve as a regression or polarity set). 208,830 whitespace words in all.

Splits by hash of id, 90/5/5 like the other pretraining text corpora (``shakespeare``,
``kjv_bible``): train 11,814 · validation 622 · test 662. Snippets of one Amazon review or NYT
editorial can fall in different splits (the id is per snippet).
"""

from __future__ import annotations

import html
import pathlib
import posixpath
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from jaxformer.data import fetch
from jaxformer.data.builders import base, movie_sentiment

# ``kind`` → ground-truth file, in the directory of movie_sentiment's file.
MEMBERS = {kind: posixpath.join(posixpath.dirname(movie_sentiment.MEMBER), name) for kind, name in
           (("amazon", "amazonReviewSnippets_GroundTruth.txt"),
            ("nyt", "nytEditorialSnippets_GroundTruth.txt"),
            ("tweets", "tweets_GroundTruth.txt"))}


def snippet_text(raw: str) -> str:
    """A snippet as stored: HTML escapes undone (repeatedly: some were escaped twice), whitespace
    runs collapsed to one space."""
    text = html.unescape(raw)
    while (again := html.unescape(text)) != text:
        text = again
    return " ".join(text.split())


class ReviewSnippets(base.LocalBuilder, skip_registration=True):
    """Amazon-review, NYT-editorial and tweet snippets as plain text (see module docstring)."""

    ARTIFACTS = (movie_sentiment.ARTIFACT,)
    SPLIT_FRACTIONS = (0.9, 0.05, 0.05)
    DESCRIPTION = ("Amazon-review, NYT-editorial and tweet snippets with mean human sentiment "
                   "scores (VADER ground truth), for in-domain language-model pretraining.")
    HOMEPAGE = movie_sentiment.MovieSentiment.HOMEPAGE
    CITATION = movie_sentiment.MovieSentiment.CITATION

    def _features(self) -> tfds.features.FeaturesDict:
        return tfds.features.FeaturesDict({
            "text": tfds.features.Text(), "id": tfds.features.Text(),
            "kind": tfds.features.Text(), "score": tfds.features.Scalar(dtype=np.float32)})

    def _examples(self, archives: Sequence[pathlib.Path]) -> Iterator[tuple[str, dict[str, Any]]]:
        inner = fetch.read_tar_member(archives[0], movie_sentiment.INNER_ARCHIVE)
        for kind, member in MEMBERS.items():
            rows = movie_sentiment.ground_truth_rows(fetch.read_tar_member(inner, member))
            for file_id, score, raw in rows:
                key = f"{kind}.{file_id}"
                yield key, {"text": snippet_text(raw), "id": key, "kind": kind, "score": score}
