"""Pre-tokenized shards (`jaxformer.data.token_shards`, ``jaxformer-tokenize``): the packed rows of
``tokens:DIR`` are byte-equal to tokenizing on the fly; a manifest of another tokenizer is refused."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxformer.data.packing import unpack_row
from jaxformer.data.pipeline import DataSettings, check_data_config, make_dataset
from jaxformer.data.sources import get_source, source_splits
from jaxformer.data.token_shards import read_manifest, write_token_shards
from jaxformer.data.tokenizer import Tokenizer, TokenizerSettings, train_sentencepiece

ROOT = Path(__file__).resolve().parents[1]
WORDS = "the king and queen rode out at dawn with their men to the sea where ships lay".split()


def _corpus(path: Path, lines: int = 300, seed: int = 0) -> Path:
    r = np.random.default_rng(seed)
    text = [" ".join(r.choice(WORDS, size=r.integers(1, 30))) for _ in range(lines)]
    text[5] = "ünïcödé 🙂 bytes"  # byte-fallback pieces
    path.write_text("\n".join(text) + "\n")
    return path


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(text settings, tokens settings, tokenizer, manifest): shards of a corpus in 3 files."""
    d = tmp_path_factory.mktemp("tokens")
    corpus = _corpus(d / "corpus.txt")
    tok = Tokenizer(train_sentencepiece(corpus.read_text().splitlines(), vocab_size=320))
    tok.save(d / "tok.model")
    text = DataSettings(source=f"files:{corpus}", seq_len=32, batch_size=4,
                        tokenizer=TokenizerSettings(path=str(d / "tok.model")))
    manifest = write_token_shards(text, tok, d / "out", ["train", "validation"], num_shards=3)
    tokens = DataSettings(source=f"tokens:{d / 'out'}", seq_len=32, batch_size=4,
                          tokenizer=TokenizerSettings(path=str(d / "tok.model")))
    return text, tokens, tok, manifest


def _rows(settings, tok, *, objective="clm", num_epochs=1, n=None, **kw):
    it = iter(make_dataset(settings, "train", tok, seed=3, objective=objective,
                           num_epochs=num_epochs, process_index=0, process_count=1, **kw))
    rows = [next(it) for _ in range(n)] if n else list(it)
    it.close()
    return rows


def _assert_byte_equal(a, b):
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        assert sorted(x) == sorted(y)
        for k in x:
            assert x[k].dtype == y[k].dtype and x[k].tobytes() == y[k].tobytes(), k


def test_manifest_counts_and_record_order(made):
    text, tokens, tok, manifest = made
    train = get_source(text, "train")
    split = manifest["splits"]["train"]
    assert manifest["dtype"] == "uint16" and manifest["vocab_size"] == tok.vocab_size
    assert split["records"] == len(train) == sum(s["records"] for s in split["shards"])
    assert len(split["shards"]) == 3
    ids = [tok.encode(r["text"]) for r in train]
    assert split["tokens"] == sum(map(len, ids))
    source = get_source(tokens, "train")
    assert len(source) == len(train)
    for i in (0, 5, len(train) - 1):  # record i is the text source's record i, tokenized
        np.testing.assert_array_equal(source[i]["inputs"], ids[i])
    assert source_splits(tokens) == ["train", "validation"]


@pytest.mark.parametrize("objective, kw", [
    ("clm", {}), ("clm", dict(packing=False)), ("mlm", dict(long_examples="split")),
])
def test_packed_rows_are_byte_equal_to_on_the_fly(made, objective, kw):
    text, tokens, tok, _ = made
    text, tokens = (dataclasses.replace(s, **kw) for s in (text, tokens))
    _assert_byte_equal(_rows(tokens, tok, objective=objective),
                       _rows(text, tok, objective=objective))


@pytest.mark.parametrize("objective", ["clm", "span_corruption"])  # packed in blocks; by Grain
def test_training_stream_and_resume_are_byte_equal(made, objective):
    text, tokens, tok, _ = made
    want = _rows(text, tok, num_epochs=None, n=40, objective=objective)  # > 1 epoch
    _assert_byte_equal(_rows(tokens, tok, num_epochs=None, n=40, objective=objective), want)
    for cut in (1, 17, 39):
        it = iter(make_dataset(tokens, "train", tok, seed=3, objective=objective,
                               process_index=0, process_count=1))
        for _ in range(cut):
            next(it)
        state = json.loads(json.dumps(it.get_state()))
        it.close()
        fresh = iter(make_dataset(tokens, "train", tok, seed=3, objective=objective,
                                  process_index=0, process_count=1))
        fresh.set_state(state)
        _assert_byte_equal([next(fresh) for _ in range(40 - cut)], want[cut:])
        fresh.close()


def test_pre_tokenized_text_is_packed_in_blocks(made):
    """clm on tokens: takes the block packer (`jaxformer.data.block_packing`); its rows are Grain's."""
    from jaxformer.data.block_packing import PackedTokenRows
    text, tokens, tok, _ = made
    ds = make_dataset(dataclasses.replace(tokens, prefetch=0), "train", tok, seed=3,
                      objective="clm", process_index=0, process_count=1)
    assert isinstance(ds._parent._parent, PackedTokenRows)  # batch → rows
    for kw in (dict(batch_size=8, packing_bins=3), dict(seq_len=8, long_examples="split")):
        _assert_byte_equal(_rows(dataclasses.replace(tokens, **kw), tok, num_epochs=2),
                           _rows(dataclasses.replace(text, **kw), tok, num_epochs=2))


def test_process_slices_are_disjoint_and_complete(made):
    """Two processes' slices of the shards: every record of an epoch exactly once."""
    _, tokens, tok, _ = made
    seen = []
    for pi in range(2):
        rows = make_dataset(tokens, "train", tok, seed=0, objective="clm", num_epochs=1,
                            process_index=pi, process_count=2)
        seen.append([tuple(x) for b in rows for r in range(len(b["inputs"]))
                     for x in unpack_row({k: v[r] for k, v in b.items()}, "inputs")])
    source, eos = get_source(tokens, "train"), tok.special.eos_id
    everything = [tuple([*source[i]["inputs"], eos][:32]) for i in range(len(source))
                  if len(source[i]["inputs"])]
    assert not set(seen[0]) & set(seen[1]) or len(set(everything)) < len(everything)
    assert sorted(seen[0] + seen[1]) == sorted(everything)


def test_another_tokenizer_is_refused_in_one_line(made, tmp_path):
    _, tokens, tok, _ = made
    other = Tokenizer(train_sentencepiece(["some other text entirely"] * 50 + WORDS, vocab_size=320))
    with pytest.raises(ValueError, match=r"tokenized with tokenizer sha256 .* not the run's") as e:
        make_dataset(tokens, "train", other, seed=0, process_index=0, process_count=1)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="data.tokenizer.path"):
        check_data_config(dataclasses.replace(tokens, tokenizer=TokenizerSettings()))
    with pytest.raises(ValueError, match="cannot read"):
        make_dataset(tokens, "train", tok, seed=0, objective="seq2seq", process_index=0,
                     process_count=1)
    with pytest.raises(ValueError, match="no manifest.json"):
        read_manifest(tmp_path)


def test_processes_write_the_same_shards(made, tmp_path):
    """Shards written by 2 worker processes are the same bytes as by one."""
    text, _, tok, manifest = made
    two = write_token_shards(text, tok, tmp_path, ["train"], num_shards=3, processes=2)
    assert two["splits"]["train"] == manifest["splits"]["train"]
    one_dir = Path(get_source(made[1], "train").base.files[0]).parent
    for s in two["splits"]["train"]["shards"]:
        assert (tmp_path / s["file"]).read_bytes() == (one_dir / s["file"]).read_bytes()


@pytest.mark.slow  # worker processes start in ~10 s each here
def test_block_packing_in_worker_processes_equals_grains(made):
    """2 worker processes, each packing its slice of the examples: the same rows as Grain's."""
    text, tokens, tok, _ = made
    _assert_byte_equal(_rows(dataclasses.replace(tokens, worker_count=2), tok, num_epochs=None, n=12),
                       _rows(dataclasses.replace(text, worker_count=2), tok, num_epochs=None, n=12))


@pytest.mark.slow
def test_the_console_command(tmp_path):
    corpus = _corpus(tmp_path / "c.txt")
    out = subprocess.run(
        [sys.executable, "-m", "jaxformer.cli.tokenize", "--config",
         str(ROOT / "configs/gpt_pretrain_tiny.py"), "--out", str(tmp_path / "t"),
         f"--config.data.source=files:{corpus}", "--config.data.tokenizer.vocab_size=320",
         "--shards=2"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "wrote" in out.stdout
    manifest = read_manifest(tmp_path / "t")
    assert set(manifest["splits"]) == {"train", "validation", "test"}
    assert (tmp_path / "t" / "tokenizer.model").exists()
