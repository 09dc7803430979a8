"""Weighted mixtures (`jaxformer.data.mixture`, ``data.source='mix:a@w,b@w'``): proportions,
determinism per seed, bit-for-bit resume, a changed weight on resume, tokens per component."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from jaxformer.data.mixture import COMPONENT_FEATURE, mixture_components, tokens_per_component
from jaxformer.data.pipeline import DataSettings, make_dataset
from jaxformer.data.sources import get_source
from jaxformer.data.tokenizer import Tokenizer, train_sentencepiece

A_WORDS = "alpha beta gamma delta epsilon zeta eta theta".split()
B_WORDS = "one two three four five six seven eight nine ten".split()


def _lines(words, n, seed):
    r = np.random.default_rng(seed)
    return [" ".join(r.choice(words, size=r.integers(1, 12))) for _ in range(n)]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    d = tmp_path_factory.mktemp("mix")
    a, b = _lines(A_WORDS, 300, 0), _lines(B_WORDS, 170, 1)
    (d / "a.txt").write_text("\n".join(a) + "\n")
    (d / "b.txt").write_text("\n".join(b) + "\n")
    tok = Tokenizer(train_sentencepiece(a + b, vocab_size=320))
    return d, tok


def _settings(d: Path, wa=0.7, wb=0.3, **kw) -> DataSettings:
    return DataSettings(**{"source": f"mix:files:{d}/a.txt@{wa},files:{d}/b.txt@{wb}",
                           "seq_len": 32, "batch_size": 4, **kw})


def _it(settings, tok, seed=0, pi=0, pc=1, num_epochs=None):
    return iter(make_dataset(settings, "train", tok, seed=seed, objective="clm",
                             process_index=pi, process_count=pc, num_epochs=num_epochs))


def _take(it, n):
    out = [next(it) for _ in range(n)]
    it.close()
    return out


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert sorted(x) == sorted(y)
        for k in x:
            assert x[k].tobytes() == y[k].tobytes(), k


def test_spec_is_parsed_and_checked():
    assert mixture_components("mix:shakespeare@0.7,files:x/{split}.txt@0.3") == [
        ("shakespeare", 0.7), ("files:x/{split}.txt", 0.3)]
    assert mixture_components("mix:a@3,b@1") == [("a", 0.75), ("b", 0.25)]
    for bad, match in (("mix:shakespeare", "positive weight"), ("mix:a@0,b@1", "positive weight"),
                       ("mix:a@x", "positive weight"), ("mix:concat:a@1", "may not be"),
                       ("mix:a@1,a@2", "named twice"), ("mix:", "needs components")):
        with pytest.raises(ValueError, match=match):
            mixture_components(bad)
    with pytest.raises(ValueError, match="positive weight"):  # before anything is read
        get_source(DataSettings(source="mix:shakespeare@-1"), "train")


def test_proportions_within_one_percent_over_10k_examples(corpora):
    """Unpacked rows hold one example each: 10,000 of them, 70/30 by their component."""
    d, tok = corpora
    rows = _take(_it(_settings(d, packing=False, batch_size=200), tok), 50)
    component = np.concatenate([r[COMPONENT_FEATURE][:, 0] for r in rows])
    assert component.size == 10_000 and set(np.unique(component)) == {1, 2}
    assert abs(np.mean(component == 1) - 0.7) < 0.01
    # each component is a (re-shuffled, repeated) pass over its own texts
    a_ids = {tuple([*tok.encode(t), tok.special.eos_id][:32])
             for t in (d / "a.txt").read_text().splitlines()}
    inputs = np.concatenate([r["inputs"] for r in rows])
    seg = np.concatenate([r["inputs_segment_ids"] for r in rows])
    for i in range(0, 10_000, 997):
        ids = tuple(inputs[i][seg[i] > 0])
        assert (ids in a_ids) == (component[i] == 1)


def test_tokens_per_component_count_every_token(corpora):
    d, tok = corpora
    rows = _take(_it(_settings(d), tok), 20)  # packed: components share rows
    names = ["a", "b"]
    total = {"a": 0, "b": 0}
    for r in rows:
        for k, v in tokens_per_component(r[COMPONENT_FEATURE], names).items():
            total[k] += v
        np.testing.assert_array_equal(r[COMPONENT_FEATURE] > 0, r["inputs_segment_ids"] > 0)
        for seg, comp in zip(r["inputs_segment_ids"], r[COMPONENT_FEATURE]):  # one per segment
            for s in np.unique(seg[seg > 0]):
                assert len(np.unique(comp[seg == s])) == 1
    assert sum(total.values()) == sum(int(np.sum(r["inputs_segment_ids"] > 0)) for r in rows)
    assert total["a"] > total["b"] > 0


def test_same_seed_same_stream_other_seed_other_stream(corpora):
    d, tok = corpora
    _same(_take(_it(_settings(d), tok, seed=1), 10), _take(_it(_settings(d), tok, seed=1), 10))
    a, b = _take(_it(_settings(d), tok, seed=1), 3), _take(_it(_settings(d), tok, seed=2), 3)
    assert a[0]["inputs"].tobytes() != b[0]["inputs"].tobytes()


def test_resume_is_bit_for_bit(corpora):
    d, tok = corpora
    want = _take(_it(_settings(d), tok), 120)  # past the end of b's shard: its next epoch
    it = _it(_settings(d), tok)
    for _ in range(47):
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    it.close()
    fresh = _it(_settings(d), tok)
    fresh.set_state(state)
    _same(_take(fresh, 73), want[47:])


def test_changed_weights_on_resume_are_allowed_and_logged(corpora, capsys):
    d, tok = corpora
    it = _it(_settings(d, packing=False, batch_size=100), tok)
    for _ in range(2):
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    it.close()
    capsys.readouterr()
    fresh = _it(_settings(d, wa=0.2, wb=0.8, packing=False, batch_size=100), tok)
    fresh.set_state(state)
    err = capsys.readouterr()
    line = err.out + err.err
    assert "checkpoint's weights were" in line and "@0.2" in line and "@0.7" in line
    component = np.concatenate([r[COMPONENT_FEATURE][:, 0] for r in _take(fresh, 20)])
    assert abs(np.mean(component == 1) - 0.2) < 0.02  # the new proportions from then on


def test_a_finite_pass_reads_every_example_once(corpora):
    """Evaluation reads a mixture as its components one after another, weights aside."""
    d, tok = corpora
    settings = _settings(d, packing=False, batch_size=8)
    rows = list(make_dataset(settings, "validation", tok, seed=0, objective="clm", num_epochs=1,
                             process_index=0, process_count=1))
    seen = sorted(tuple(r[s > 0]) for b in rows
                  for r, s in zip(b["inputs"], b["inputs_segment_ids"]) if s.any())
    want = sorted(tuple([*tok.encode(x["text"]), tok.special.eos_id][:32])
                  for x in get_source(settings, "validation"))
    assert seen == want


def test_two_processes_read_disjoint_slices_of_every_component(corpora):
    """Two processes, each drawing 50/50 until its slice of b is read once: together they read
    every example of b's epoch exactly once, and of a's no example twice."""
    d, tok = corpora
    settings = _settings(d, wa=0.5, wb=0.5, packing=False, batch_size=2)
    eos = tok.special.eos_id
    texts = {c: [tuple([*tok.encode(x["text"]), eos][:32]) for x in
                 get_source(DataSettings(source=f"files:{d}/{c}.txt"), "train")] for c in "ab"}
    got = []
    for pi in range(2):
        rows = _take(_it(settings, tok, pi=pi, pc=2), 2 * len(texts["b"][pi::2]))
        got += [(int(c[0]), tuple(r[s > 0])) for b in rows for r, s, c in
                zip(b["inputs"], b["inputs_segment_ids"], b[COMPONENT_FEATURE])]
    assert sorted(ids for c, ids in got if c == 2) == sorted(texts["b"])
    assert not Counter(ids for c, ids in got if c == 1) - Counter(texts["a"])
