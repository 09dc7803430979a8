"""``movie_sentiment``: 10,605 movie-review sentences with human sentiment scores.

Source: the VADER paper's ground truth (Hutto & Gilbert, ICWSM 2014) shipped in the PyPI sdist
``vadersentiment==3.3.2`` as ``additional_resources/hutto_ICWSM_2014.tar.gz`` →
``movieReviewSnippets_GroundTruth.txt``: tab-separated ``id, mean score, sentence``; the
sentences are Pang & Lee's rotten-tomatoes snippets, the score the mean of 20 raters on
[-4, 4]. ``label = 1 if score > 0 else 0`` (5,242 positive, 5,363 non-positive of which 37 are
exactly 0). ``text`` is the sentence with whitespace runs collapsed to one space; ``id`` the
file's id (``"1"`` … ``"10605"``); ``score`` the mean rating.

Splits by hash of id, 80/10/10 (larger evaluation sets for classification):
train 8,495 · validation 1,034 · test 1,076.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from jaxformer.data import fetch
from jaxformer.data.builders import base

ARTIFACT = fetch.Artifact(
    kind="pypi", name="vadersentiment", version="3.3.2", filename="vaderSentiment-3.3.2.tar.gz",
    sha256="5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9")
INNER_ARCHIVE = "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz"
MEMBER = "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"


def ground_truth_rows(data: bytes) -> Iterator[tuple[str, float, str]]:
    """``(file id, mean score, raw text)`` per line of a ``*_GroundTruth.txt`` file (UTF-8,
    tab-separated ``id, mean score, text``; also read by ``review_snippets``)."""
    for line in data.decode("utf-8").splitlines():
        key, score, text = line.split("\t")
        yield key, float(score), text


class MovieSentiment(base.LocalBuilder, skip_registration=True):
    """Binary sentiment of movie-review sentences (see module docstring)."""

    ARTIFACTS = (ARTIFACT,)
    SPLIT_FRACTIONS = (0.8, 0.1, 0.1)
    DESCRIPTION = "Movie-review sentences labelled positive when the mean human score is > 0."
    HOMEPAGE = "https://github.com/cjhutto/vaderSentiment"
    CITATION = ("Hutto, C.J. & Gilbert, E.E. (2014). VADER: A Parsimonious Rule-based Model for "
                "Sentiment Analysis of Social Media Text. ICWSM-14.")

    def _features(self) -> tfds.features.FeaturesDict:
        return tfds.features.FeaturesDict({
            "text": tfds.features.Text(),
            "label": tfds.features.ClassLabel(names=["negative", "positive"]),
            "id": tfds.features.Text(), "score": tfds.features.Scalar(dtype=np.float32)})

    def _examples(self, archives: Sequence[pathlib.Path]) -> Iterator[tuple[str, dict[str, Any]]]:
        inner = fetch.read_tar_member(archives[0], INNER_ARCHIVE)
        for key, score, sentence in ground_truth_rows(fetch.read_tar_member(inner, MEMBER)):
            yield key, {"text": " ".join(sentence.split()), "label": int(score > 0),
                        "id": key, "score": score}
