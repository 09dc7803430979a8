"""The ``review_snippets`` corpus against its raw files, and as MLM text beside ``movie_sentiment``.

The raw ground-truth files are read here straight from the cached sdist with `tarfile` and byte
operations (not the builder's helpers), so counts, ids and scores are checked independently.
"""

from __future__ import annotations

import collections
import io
import re
import tarfile

import numpy as np
import pytest

from jaxformer.data import fetch
from jaxformer.data.builders import ReviewSnippets, hash_split, no_tempdir_leak
from jaxformer.data.builders.movie_sentiment import ARTIFACT, INNER_ARCHIVE
from jaxformer.data.pipeline import DataSettings, default_data_config, make_dataset
from jaxformer.data.sources import SourceSettings, get_source, source_texts
from jaxformer.data.tokenizer import Tokenizer, train_sentencepiece
from jaxformer.settings import read

SPLITS = ("train", "validation", "test")
RAW_FILES = {"amazon": "amazonReviewSnippets_GroundTruth.txt",
             "nyt": "nytEditorialSnippets_GroundTruth.txt", "tweets": "tweets_GroundTruth.txt"}


@pytest.fixture(scope="module")
def raw() -> dict[str, list[list[bytes]]]:
    """``kind`` → the raw file's rows, each ``[id, score, text]`` as bytes (CRLF lines)."""
    with tarfile.open(fetch.fetch(ARTIFACT, dataset="review_snippets")) as sdist:
        inner = sdist.extractfile(INNER_ARCHIVE).read()
    with tarfile.open(fileobj=io.BytesIO(inner)) as tar:
        files = {kind: tar.extractfile(f"hutto_ICWSM_2014/{name}").read()
                 for kind, name in RAW_FILES.items()}
    return {kind: [line.split(b"\t") for line in data.split(b"\r\n")]
            for kind, data in files.items()}


@pytest.fixture(scope="module")
def records() -> dict[str, list[dict]]:
    """Split → the corpus' raw TFDS records (bytes/numpy: ``kind`` and ``score`` included)."""
    out = {}
    for split in SPLITS:
        base = get_source(SourceSettings(source="review_snippets"), split).base
        out[split] = base.__getitems__(list(range(len(base))))
    return out


def test_every_raw_line_is_one_example_with_its_score(raw, records):
    assert {kind: len(rows) for kind, rows in raw.items()} == {
        "amazon": 3_708, "nyt": 5_190, "tweets": 4_200}
    assert all(len(row) == 3 for rows in raw.values() for row in rows)
    every = [r for split in SPLITS for r in records[split]]
    per_kind = collections.Counter(r["kind"].decode() for r in every)
    assert per_kind == {kind: len(rows) for kind, rows in raw.items()}
    ids = [r["id"].decode() for r in every]
    assert len(ids) == len(set(ids)) == 13_098
    expected = {f"{kind}.{row[0].decode()}": float(row[1]) for kind, rows in raw.items()
                for row in rows}
    assert set(ids) == set(expected)  # the movie-review file is not in it
    for r in every:
        assert r["id"].decode().startswith(r["kind"].decode() + ".")
        assert r["score"] == np.float32(expected[r["id"].decode()])


def test_splits_are_disjoint_hash_splits_covering_everything(records):
    ids = {split: {r["id"].decode() for r in records[split]} for split in SPLITS}
    assert {s: len(v) for s, v in ids.items()} == {"train": 11_814, "validation": 622, "test": 662}
    assert not (ids["train"] & ids["validation"] or ids["train"] & ids["test"]
                or ids["validation"] & ids["test"])
    assert all(hash_split(i, (0.9, 0.05, 0.05)) == split for split in SPLITS for i in ids[split])


def test_texts_are_unescaped_whitespace_normalised_and_not_movie_reviews(raw, records):
    texts = {r["id"].decode(): r["text"].decode() for split in SPLITS for r in records[split]}
    assert all(t and t == " ".join(t.split()) for t in texts.values())
    # Every "&" of the raw files begins an escape, some escaped twice ("&amp;amp;"): none is left.
    assert all(re.fullmatch(rb"&(amp|lt|gt);", m) for rows in raw.values() for row in rows
               for m in re.findall(rb"&[#\w]*;?", row[2]))
    assert not any(re.search(r"&[#\w]+;|\ufffd", t) for t in texts.values())
    assert "Hirschl & Adler gallery" in texts["nyt.29_4"]
    assert "an at & t subscriber" in texts["amazon.206_2"]
    assert sum(len(t.split()) for t in texts.values()) == 208_830
    # Known raw lines: an HTML escape, doubled spaces, the two non-ASCII characters (UTF-8).
    assert raw["tweets"][216][2].endswith(b"So cute! Lol &lt;3")
    assert texts["tweets.217"].endswith("So cute! Lol <3")
    assert b"!!!!!!!!  Oh" in raw["tweets"][3516][2]
    assert texts["tweets.3517"] == "@anonymous cierra la puerta!!!!!!!! Oh yeaaaah... Clases de español ;)"
    assert "with me & £1000 homewares" in texts["tweets.1241"]
    assert texts["amazon.1_1"] == "troubleshooting ad-2500 and ad-2600 no picture scrolling b/w."
    movie = set(source_texts(get_source(SourceSettings(source="movie_sentiment"), "validation")))
    assert not movie & set(texts.values())


def test_building_again_gives_the_same_records(tmp_path, records):
    with no_tempdir_leak():
        builder = ReviewSnippets(data_dir=str(tmp_path), file_format="array_record")
        builder.download_and_prepare(download_dir=str(tmp_path / "downloads"))
    for split in SPLITS:
        again = builder.as_data_source(split=split)
        assert again.__getitems__(list(range(len(again)))) == records[split]


def test_concat_with_movie_sentiment_is_mlm_text():
    spec = {"source": "concat:movie_sentiment,review_snippets"}
    mixed = get_source(read(SourceSettings, spec), "validation")
    movie = get_source(SourceSettings(source="movie_sentiment"), "validation")
    snippets = get_source(SourceSettings(source="review_snippets"), "validation")
    assert len(mixed) == len(movie) + len(snippets) == 1_034 + 622
    assert set(mixed[0]) == {"text", "label", "id"} and mixed[0] == movie[0]
    assert set(mixed[len(movie)]) == {"text", "id"} and mixed[len(movie)] == snippets[0]
    for split in SPLITS:
        assert len(get_source(read(SourceSettings, spec), split)) == sum(
            len(get_source(SourceSettings(source=name), split)) for name in ("movie_sentiment",
                                                                  "review_snippets"))
    # MLM reads only "text": one [CLS] text [SEP] row per example of both corpora.
    tok = Tokenizer(train_sentencepiece(list(source_texts(mixed))[::4], vocab_size=500))
    cfg = default_data_config()
    cfg.update(dict(spec, seq_len=32, batch_size=64, packing=False, shuffle=False))
    rows = 0
    for batch in make_dataset(read(DataSettings, cfg), "validation", tok, seed=0, objective="mlm",
                              num_epochs=1,
                              report=False):
        real = batch["inputs_segment_ids"][:, 0] > 0
        assert (batch["inputs"][real, 0] == tok.special.cls_id).all()
        rows += int(real.sum())
    assert rows == len(mixed)
