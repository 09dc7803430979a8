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


def _train_config(d: Path, tok_path: Path, tokens_dir: Path, steps: int):
    from jaxformer.train import config as train_config
    from jaxformer.train.config import set_key

    c = train_config.load_config(Path(__file__).resolve().parents[1] / "configs/gpt_pretrain_tiny.py")
    settings = {"model.d_model": 32, "model.num_heads": 2, "model.d_ff": 64, "model.num_layers": 1,
                "model.max_len": 32, "model.vocab_size": 320, "data.seq_len": 32,
                "data.batch_size": 8, "data.source": f"mix:files:{d}/a.txt@0.7,tokens:{tokens_dir}@0.3",
                "data.tokenizer.path": str(tok_path), "num_train_steps": steps,
                "log_every_steps": 2, "eval.every_steps": 4, "eval.num_batches": 2,
                "checkpoint.every_steps": 4, "checkpoint.async_save": False,
                "progress_bar": False, "optimizer.warmup_steps": 1,
                "optimizer.schedule": "constant"}  # a longer run keeps the schedule
    for k, v in settings.items():
        set_key(c, k, v)
    return c


@pytest.fixture(scope="module")
def mixed_run(corpora, tmp_path_factory):
    """A 4-step run on 'mix:files:a.txt@0.7,tokens:<b.txt tokenized>@0.3'."""
    from jaxformer.data.token_shards import write_token_shards
    from jaxformer.data.tokenizer import TokenizerSettings
    from jaxformer.train.loop import train_and_evaluate

    d, tok = corpora
    work = tmp_path_factory.mktemp("mixrun")
    tok.save(work / "tok.model")
    b = DataSettings(source=f"files:{d}/b.txt", tokenizer=TokenizerSettings(path=str(work / "tok.model")))
    write_token_shards(b, tok, work / "b_tokens", ["train", "validation"], num_shards=2)
    train_and_evaluate(_train_config(d, work / "tok.model", work / "b_tokens", 4), work / "run")
    return d, work


def test_trainer_logs_tokens_and_eval_loss_per_component(mixed_run):
    from jaxformer.checkpoint import read_metrics

    d, work = mixed_run
    a, b = f"files:{d}/a.txt", f"tokens:{work / 'b_tokens'}"
    rows = read_metrics(work / "run")
    logged = [r for r in rows if f"tokens/{a}" in r]
    assert [r["step"] for r in logged] == [2, 4]
    for r in logged:  # every token of the rows, split by component: ~70/30
        assert r[f"tokens/{a}"] + r[f"tokens/{b}"] > 0
        assert 0.55 < r[f"tokens/{a}"] / (r[f"tokens/{a}"] + r[f"tokens/{b}"]) < 0.85
    last = [r for r in rows if "eval_loss" in r][-1]
    assert np.isfinite(last[f"eval_loss/{a}"]) and np.isfinite(last[f"eval_loss/{b}"])
    assert min(last[f"eval_loss/{a}"], last[f"eval_loss/{b}"]) <= last["eval_loss"] <= max(
        last[f"eval_loss/{a}"], last[f"eval_loss/{b}"])


@pytest.mark.slow  # two more runs (~30 s)
def test_trainer_resumes_a_mixture_exactly(mixed_run, tmp_path):
    """The 4-step run continued to 8 steps has the losses of a straight 8-step run."""
    import shutil

    from jaxformer.checkpoint import read_metrics
    from jaxformer.train.loop import Trainer, train_and_evaluate

    d, work = mixed_run
    shutil.copytree(work / "run", tmp_path / "resumed")
    trainer = Trainer(_train_config(d, work / "tok.model", work / "b_tokens", 8), tmp_path / "resumed")
    assert trainer.start_step == 4
    trainer.run()
    train_and_evaluate(_train_config(d, work / "tok.model", work / "b_tokens", 8), tmp_path / "straight")
    loss = lambda w: {r["step"]: r["loss"] for r in read_metrics(w) if "loss" in r}
    assert loss(tmp_path / "resumed") == loss(tmp_path / "straight")
