"""Grain pipeline: batch layout per task, framing, determinism, resumption, sharding, truncation."""

import json

import grain
import numpy as np
import pytest

from jaxformer.data.packing import unpack_row
from jaxformer.data.pipeline import DataSettings, make_dataset, source_texts
from jaxformer.data.tokenizer import Tokenizer, train_sentencepiece

WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at "
         "which but have an they you were her she there been one all we their has would when if "
         "el la de que y en un ser se no haber por con su para como estar tener le lo todo pero "
         "más hacer o poder decir este ir otro ese la si me ya ver porque dar cuando él muy sin "
         "año mañana niño canción corazón").split()


class ListSource:
    """A random-access source: ``len`` and ``[i]`` → dict."""

    def __init__(self, items):
        self.items = list(items)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def _texts(n, max_words=24, seed=0):
    rng = np.random.default_rng(seed)
    return [f"doc{i} " + " ".join(rng.choice(WORDS, int(rng.integers(1, max_words))))
            for i in range(n)]


TEXTS = _texts(40)


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(train_sentencepiece(_texts(300, seed=1), vocab_size=400))


def _source(task, n=40):
    texts = TEXTS[:n]
    if task in ("lm", "span_corruption"):
        return ListSource({"text": t} for t in texts)
    if task == "classify":
        return ListSource({"text": t, "label": i % 3} for i, t in enumerate(texts))
    if task == "seq2seq":
        return ListSource({"source": t, "target": t.upper()[:30]} for t in texts)
    return ListSource({"prompt": t, "response": " answer " + t[-12:]} for t in texts)  # sft


def toy_span_corruption(tok):
    """One random span → a sentinel (a stand-in for the objectives' span corruption)."""
    sentinel = tok.special.sentinel_ids[0]

    def transform(ex, rng):
        x = ex["inputs"]
        a = int(rng.integers(0, len(x)))
        b = int(rng.integers(a + 1, len(x) + 1))
        return {"inputs": np.concatenate([x[:a], [sentinel], x[b:]]),
                "targets": np.concatenate([[sentinel], x[a:b]])}

    return transform


# An objective of each data task (the pipeline asks the objective for its task and framing).
OBJECTIVE = {"lm": "clm", "classify": "classify", "seq2seq": "seq2seq", "sft": "sft",
             "span_corruption": "span_corruption"}


def _cfg(**kw) -> DataSettings:
    return DataSettings(**{"seq_len": 32, "target_len": 16, "batch_size": 4, **kw})


def _make(tok, task="lm", *, seed=0, source=None, pi=0, pc=1, num_epochs=None, **kw):
    transform = toy_span_corruption(tok) if task == "span_corruption" else None
    if task == "classify":
        kw.setdefault("framing", "eos")
    return make_dataset(_cfg(**kw), "train", tok, seed=seed, objective=OBJECTIVE[task],
                        transform=transform, process_index=pi, process_count=pc,
                        num_epochs=num_epochs, source=source or _source(task))


def _take(it, n):
    return [next(it) for _ in range(n)]


def _assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert sorted(x) == sorted(y)
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


@pytest.mark.parametrize("task, packing", [
    ("lm", True), ("lm", False), ("seq2seq", True), ("seq2seq", False), ("classify", False),
    ("sft", True), ("sft", False), ("span_corruption", True)])
def test_batch_layout_per_task(tok, task, packing):
    batch = next(iter(_make(tok, task, packing=packing)))
    keys = {"inputs": (4, 32)}
    if task in ("seq2seq", "span_corruption"):
        keys["targets"] = (4, 16)
    expect = {f"{k}{s}": shape for k, shape in keys.items()
              for s in ("", "_segment_ids", "_positions")}
    if task == "classify":
        expect["label"] = (4,)
    if task == "sft":
        expect["inputs_loss_mask"] = (4, 32)
    assert {k: v.shape for k, v in batch.items()} == expect
    assert all(v.dtype == np.int32 for v in batch.values())
    eos = tok.special.eos_id
    for feature in keys:  # seq2seq-like features: every segment ends with EOS
        for row in range(4):
            segs = unpack_row({k: v[row] for k, v in batch.items()}, feature)
            assert segs and all(len(s) > 0 for s in segs)
            if task in ("seq2seq", "span_corruption"):
                assert all(s[-1] == eos for s in segs)


@pytest.mark.parametrize("framing", ["eos", "bos_eos", "cls_sep", "none"])
def test_lm_framing_and_content(tok, framing):
    s = tok.special
    ds = _make(tok, "lm", framing=framing, seq_len=64, shuffle=False, num_epochs=1)
    pre, suf = {"eos": ([], [s.eos_id]), "bos_eos": ([s.bos_id], [s.eos_id]),
                "cls_sep": ([s.cls_id], [s.sep_id]), "none": ([], [])}[framing]
    want = sorted(tuple(pre + tok.encode(t) + suf) for t in TEXTS)
    got = [tuple(x) for b in ds for r in range(4)
           for x in unpack_row({k: v[r] for k, v in b.items()}, "inputs")]
    assert sorted(got) == want  # single pass: every text exactly once, nothing cut


@pytest.mark.parametrize("objective", ["clm", "mlm"])
def test_framing_defaults_to_the_objectives(tok, objective):
    """Unset ``data.framing`` is the objective's: GPT's EOS for clm, BERT's [CLS]/[SEP] for mlm."""
    s = tok.special
    pre, suf = {"clm": ([], [s.eos_id]), "mlm": ([s.cls_id], [s.sep_id])}[objective]
    ds = make_dataset(_cfg(seq_len=64, shuffle=False), "train", tok, seed=0, objective=objective,
                      process_index=0, process_count=1, num_epochs=1, source=_source("lm"))
    got = [tuple(x) for b in ds for r in range(4)
           for x in unpack_row({k: v[r] for k, v in b.items()}, "inputs")]
    assert sorted(got) == sorted(tuple(pre + tok.encode(t) + suf) for t in TEXTS)


def test_classify_keeps_cls_and_sep_when_truncating(tok):
    batch = next(iter(_make(tok, "classify", packing=False, framing="cls_sep", seq_len=6,
                            shuffle=False)))
    np.testing.assert_array_equal(batch["label"], [0, 1, 2, 0])
    assert np.all(batch["inputs"][:, 0] == tok.special.cls_id)
    assert np.all(batch["inputs"][:, -1] == tok.special.sep_id)
    np.testing.assert_array_equal(batch["inputs"][0, 1:5], tok.encode(TEXTS[0])[:4])


def test_sft_loss_mask_marks_the_response(tok):
    batch = next(iter(_make(tok, "sft", packing=False, seq_len=64, shuffle=False)))
    for r in range(4):
        ex = _source("sft")[r]
        seg = batch["inputs_segment_ids"][r] == 1
        mask = batch["inputs_loss_mask"][r] == 1
        assert np.all(seg[mask])
        assert tok.decode(batch["inputs"][r][seg & ~mask]) == ex["prompt"]
        resp = batch["inputs"][r][mask]
        assert resp[-1] == tok.special.eos_id
        np.testing.assert_array_equal(resp[:-1], tok.encode(ex["response"]))


def test_seq2seq_trims_keeping_eos(tok):
    long = ListSource([{"source": " ".join(WORDS), "target": " ".join(WORDS[::-1])}] * 4)
    batch = next(iter(_make(tok, "seq2seq", source=long, packing=False)))
    assert np.all(batch["inputs"][:, -1] == tok.special.eos_id)
    assert np.all(batch["targets"][:, -1] == tok.special.eos_id)
    assert np.all(batch["targets_segment_ids"] == 1)
    np.testing.assert_array_equal(batch["targets"][0, :15], tok.encode(" ".join(WORDS[::-1]))[:15])


@pytest.mark.parametrize("framing", ["eos", "cls_sep"])
def test_long_documents_split_without_loss(tok, framing):
    docs = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(0, 40, 10)]
    ds = _make(tok, "lm", source=ListSource({"text": d} for d in docs), packing=False,
               shuffle=False, num_epochs=1, long_examples="split", framing=framing)
    rows = [b["inputs"][r][b["inputs_segment_ids"][r] == 1] for b in ds for r in range(4)]
    rows = [r for r in rows if len(r)]
    s = tok.special
    if framing == "eos":  # each document + EOS is cut into rows; only its last row is short
        want = np.concatenate([tok.encode(d) + [s.eos_id] for d in docs])
        assert all(len(r) == 32 or r[-1] == s.eos_id for r in rows)
        assert len(rows) == sum(-(-(len(tok.encode(d)) + 1) // 32) for d in docs)
        np.testing.assert_array_equal(np.concatenate(rows), want)
    else:  # every row is [CLS] piece [SEP]
        assert all(r[0] == s.cls_id and r[-1] == s.sep_id for r in rows)
        np.testing.assert_array_equal(np.concatenate([r[1:-1] for r in rows]),
                                      np.concatenate([tok.encode(d) for d in docs]))


def test_empty_texts_are_skipped(tok):
    source = ListSource([{"text": t} for t in ("", TEXTS[0], "", TEXTS[1], "")])
    ds = _make(tok, "lm", source=source, num_epochs=1, shuffle=False, packing=False, seq_len=64)
    rows = [tok.decode(b["inputs"][r]) for b in ds for r in range(4)
            if b["inputs_segment_ids"][r].any()]
    assert rows == TEXTS[:2]


def test_truncation_keeps_the_start(tok):
    docs = [" ".join(WORDS)] * 8
    batch = next(iter(_make(tok, "lm", source=ListSource({"text": d} for d in docs),
                            packing=True)))
    np.testing.assert_array_equal(batch["inputs"], np.tile(tok.encode(docs[0])[:32], (4, 1)))
    assert np.all(batch["inputs_segment_ids"] == 1)


def test_every_epoch_is_a_new_permutation(tok):
    ds = _make(tok, "lm", packing=False, seq_len=64, num_epochs=2)
    rows = [tok.decode(b["inputs"][r]) for b in ds for r in range(4)]
    assert len(rows) == 80
    assert sorted(rows[:40]) == sorted(rows[40:]) == sorted(TEXTS)
    assert rows[:40] != rows[40:] and rows[:40] != TEXTS


def test_same_seed_same_batches_other_seed_other_batches(tok):
    a = _take(iter(_make(tok, "span_corruption", seed=3)), 6)
    _assert_same(a, _take(iter(_make(tok, "span_corruption", seed=3)), 6))
    b = _take(iter(_make(tok, "span_corruption", seed=4)), 6)
    assert any(not np.array_equal(x["inputs"], y["inputs"]) for x, y in zip(a, b))


@pytest.mark.parametrize("task, kw", [("lm", {}), ("lm", {"prefetch": 0}),
                                      ("span_corruption", {}), ("sft", {"packing": False})])
def test_resume_from_state_continues_the_stream(tok, task, kw):
    full = _take(iter(_make(tok, task, **kw)), 30)  # > 2 epochs of 40 examples
    it = iter(_make(tok, task, **kw))
    _take(it, 7)
    state = json.loads(json.dumps(it.get_state()))  # JSON-serialisable
    fresh = iter(_make(tok, task, **kw))
    fresh.set_state(state)
    _assert_same(_take(fresh, 23), full[7:])


@pytest.mark.slow
def test_worker_processes_are_deterministic_and_resumable(tok):
    """Worker processes give their own deterministic stream; its state restores it."""
    it = iter(_make(tok, "span_corruption", worker_count=2))
    _take(it, 5)
    state = json.loads(json.dumps(it.get_state()))
    want = _take(it, 3)
    it.close()
    it = iter(_make(tok, "span_corruption", worker_count=2))
    it.set_state(state)
    _assert_same(_take(it, 3), want)
    it.close()


def test_iterator_checkpoint_with_orbax(tok, tmp_path):
    """What the trainer does: the iterator rides along in the Orbax checkpoint."""
    import orbax.checkpoint as ocp  # here: worker processes import this module, keep it light
    full = _take(iter(_make(tok)), 8)
    it = iter(_make(tok))
    _take(it, 5)
    with ocp.CheckpointManager(tmp_path) as mngr:
        mngr.save(5, args=ocp.args.Composite(data_iter=grain.checkpoint.CheckpointSave(it)))
        mngr.wait_until_finished()
    assert (tmp_path / "5" / "data_iter" / "process_0-of-1.json").exists()
    fresh = iter(_make(tok))
    with ocp.CheckpointManager(tmp_path) as mngr:
        mngr.restore(5, args=ocp.args.Composite(
            data_iter=grain.checkpoint.CheckpointRestore(fresh)))
    _assert_same(_take(fresh, 3), full[5:])


@pytest.mark.parametrize("packing", [False, True])
def test_process_shards_are_disjoint_and_cover_the_data(tok, packing):
    seen = []
    for pi in range(2):
        ds = _make(tok, "lm", pi=pi, pc=2, num_epochs=1, packing=packing, seq_len=64)
        batches = list(ds)
        assert all(b["inputs"].shape == (2, 64) for b in batches)  # batch 4 over 2 processes
        shard = [tok.decode(x) for b in batches for r in range(2)
                 for x in unpack_row({k: v[r] for k, v in b.items()}, "inputs")]
        seen.append(shard)
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == sorted(TEXTS)


def test_finite_pass_pads_the_last_batch(tok):
    batches = list(_make(tok, "classify", packing=False, num_epochs=1,
                         source=_source("classify", 6)))
    assert len(batches) == 2
    np.testing.assert_array_equal(batches[1]["inputs_segment_ids"][2:], 0)
    np.testing.assert_array_equal(batches[1]["inputs_segment_ids"][:2, 0], 1)


@pytest.mark.parametrize("objective, kw, match", [
    ("classify", dict(packing=True, framing="eos"), "packing"),
    ("clm", dict(framing="sep"), "data.framing"),
    ("seq2seq", dict(long_examples="split"), "long_examples"),
    ("clm", dict(batch_size=5), "divide evenly"),
    ("clm", dict(seq_len=2), "seq_len"),
    ("classify", dict(), "data.framing is unset"),  # BERT's [CLS]/[SEP] or GPT's EOS: say which
])
def test_bad_config_raises(tok, objective, kw, match):
    with pytest.raises(ValueError, match=match):
        make_dataset(_cfg(**kw), "train", tok, seed=0, objective=objective, process_index=0,
                     process_count=2, source=_source("lm"))


def test_data_task_is_the_objectives():
    """The pipeline's data task is the objective's, as its options choose it: MLM with
    ``sentence_pairs`` reads sentence pairs (`check_data_task`; the legacy ``data.task`` key a
    config may still set is checked against it by `validate_config`: tests/test_configs.py)."""
    from jaxformer.objectives import check_data_task, get_objective
    from jaxformer.objectives.mlm import MLMOptions

    for name, task in [("clm", "lm"), ("mlm", "lm"), ("denoise", "span_corruption"),
                       ("span_corruption", "span_corruption"), ("seq2seq", "seq2seq"),
                       ("cloze", "classify"), ("qa", "qa")]:
        assert check_data_task(name).data_task == task
        assert check_data_task(get_objective(name)).data_task == task
    for pairs in ("nsp", "sop"):
        assert check_data_task("mlm", MLMOptions(sentence_pairs=pairs)).data_task == "sentence_pairs"
    with pytest.raises(ValueError, match="objective.sentence_pairs='nope' must be one of"):
        check_data_task("mlm", MLMOptions(sentence_pairs="nope"))
    with pytest.raises(ValueError, match="objective 'clm' takes options ScheduledSamplingOptions, "
                                         "not MLMOptions"):
        check_data_task("clm", MLMOptions())


def test_a_resolved_objective_carries_its_options_into_the_pipeline(tok):
    """A run hands the pipeline its objective resolved once with its options
    (`TrainSettings.objective_spec`, `Objective.resolve`): its batches equal those of the
    (name, options) pair, and differ from the default options' (so the options are not dropped)."""
    from jaxformer.objectives import get_objective
    from jaxformer.objectives.span_corruption import SpanCorruptionOptions

    options = SpanCorruptionOptions(noise_density=0.5, mean_span_length=2.0)
    spec = get_objective("span_corruption").resolve(options)
    assert spec.resolved_options is options and spec.checked_options() is options

    def batches(**objective):
        return _take(iter(make_dataset(_cfg(), "train", tok, seed=0, process_index=0,
                                       process_count=1, source=_source("lm"), **objective)), 3)

    carried = batches(objective=spec)
    _assert_same(carried, batches(objective="span_corruption", options=options))
    default = batches(objective="span_corruption")
    assert any(not np.array_equal(a["inputs"], b["inputs"]) for a, b in zip(carried, default))


def test_bad_inputs_raise(tok):
    with pytest.raises(ValueError, match="needs source examples with keys.*data.source_key"):
        next(iter(_make(tok, "seq2seq", source=_source("lm"))))
    with pytest.raises(ValueError, match=r"missing \['label'\]\); set data.label_key"):
        next(iter(_make(tok, "classify", source=_source("lm"), packing=False)))
    with pytest.raises(ValueError, match="must return feature 'targets'"):
        next(iter(make_dataset(_cfg(), "train", tok, seed=0, objective="span_corruption",
                               process_index=0, process_count=1, source=_source("lm"),
                               transform=lambda ex, rng: ex)))


def test_source_texts_and_the_configured_source(tok, tmp_path):
    """End to end through `jaxformer.data.sources.get_source` with a user text file."""
    assert list(source_texts(_source("seq2seq", 2))) == [
        TEXTS[0], TEXTS[0].upper()[:30], TEXTS[1], TEXTS[1].upper()[:30]]
    (tmp_path / "corpus.txt").write_text("\n".join(TEXTS) + "\n")
    cfg = _cfg(source=f"files:{tmp_path}/corpus.txt", format="text", split_fractions=(1, 0, 0),
               seq_len=64)
    ds = make_dataset(cfg, "train", tok, seed=0, process_index=0, process_count=1, num_epochs=1)
    got = [tok.decode(x) for b in ds for r in range(4)
           for x in unpack_row({k: v[r] for k, v in b.items()}, "inputs")]
    assert sorted(got) == sorted(TEXTS)


def test_span_corruption_with_the_objectives_transform(tok):
    """The real T5 transform, which the pipeline asks the objective for, through packing: every
    packed (inputs, targets) segment pair reconstructs the first ``seq_len - 1`` tokens of its
    text."""
    from jaxformer.objectives.span_corruption import reconstruct_span_corruption

    ds = make_dataset(_cfg(target_len=32, shuffle=False), "train", tok, seed=0,
                      objective="span_corruption", process_index=0, process_count=1,
                      num_epochs=1, source=_source("lm"))
    got = []
    for b in ds:
        for r in range(4):
            row = {k: v[r] for k, v in b.items()}
            for x, y in zip(unpack_row(row, "inputs"), unpack_row(row, "targets"), strict=True):
                assert x[-1] == y[-1] == tok.special.eos_id
                got.append(tuple(reconstruct_span_corruption(x, y, tok.special)))
    assert sorted(got) == sorted(tuple(tok.encode(t)[:31]) for t in TEXTS)


def test_iterators_left_open_exit_quietly(tok, tmp_path):
    """A script that leaves iterators open (thread prefetch and worker processes) exits cleanly:
    without the atexit close, Grain's __del__ during interpreter teardown printed "Exception
    ignored … 'NoneType' object has no attribute 'Empty'" and leaked shared memory."""
    import subprocess
    import sys
    import textwrap

    tok.save(tmp_path / "tok.model")
    (tmp_path / "docs.txt").write_text("\n".join(TEXTS) + "\n")
    script = tmp_path / "leave_open.py"
    script.write_text(textwrap.dedent(f"""
        import dataclasses
        from jaxformer.data.pipeline import DataSettings, make_dataset
        from jaxformer.data.tokenizer import Tokenizer
        if __name__ == "__main__":
            tok = Tokenizer.load({str(tmp_path / "tok.model")!r})
            cfg = DataSettings(source={"files:" + str(tmp_path / "docs.txt")!r}, seq_len=32,
                               batch_size=2, split_fractions=(1.0, 0.0, 0.0))
            threads = [iter(make_dataset(cfg, "train", tok, seed=s)) for s in (0, 1)]
            workers = iter(make_dataset(dataclasses.replace(cfg, worker_count=1), "train", tok,
                                        seed=0))
            print([next(it)["inputs"].shape for it in (*threads, workers)])
    """))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "[(2, 32), (2, 32), (2, 32)]" in run.stdout.splitlines()  # after the data lines
    for noise in ("Exception ignored", "Traceback", "leaked", "terminate called"):
        assert noise not in run.stderr, run.stderr[-3000:]


def test_a_split_reports_its_size_and_one_line_of_cuts_per_epoch(tok, capsys):
    """No warning per truncated example (they broke up the progress bar): the split's size when
    the dataset is made, then one line once a whole epoch has been read — the counts equal a
    hand count of the documents longer than a row — and nothing more in later epochs."""
    docs = ["", *TEXTS[:9]]
    cut = [max(len(tok.encode(d)) + 1 - 16, 0) for d in docs if d]  # +1: the EOS; rows of 16
    ds = _make(tok, "lm", source=ListSource({"text": d} for d in docs), num_epochs=3,
               packing=False, seq_len=16, shuffle=False)
    assert capsys.readouterr().out == "data train: 10 examples in a given source\n"
    it = iter(ds)
    first_epoch = [next(it) for _ in range(3)]  # 9 rows in batches of 4 (the 10th doc is empty)
    del first_epoch
    summary = (f"data train/lm: read all 10 examples (one epoch); {sum(c > 0 for c in cut)} "
               f"truncated to fit the row length ({sum(cut)} tokens cut); 1 empty skipped\n")
    assert sum(c > 0 for c in cut) > 0 and capsys.readouterr().out == summary
    assert len(list(it)) > 0 and capsys.readouterr().out == ""  # epochs 2 and 3: nothing new
    it.close()
    assert capsys.readouterr().out == ""  # reported already


def test_a_partly_read_split_reports_its_cuts_when_closed(tok, capsys):
    """An iterator closed before an epoch ends (the end of a short run, the trainer's probe of the
    eval split) reports what it counted so far beside the split's size (issue 60 §7: "read 40
    examples so far" read as the size of a split of 1,406); one made with ``report=False`` (each
    evaluation's) reports nothing."""
    long_docs = ListSource({"text": " ".join(WORDS)} for _ in range(40))
    it = iter(_make(tok, "lm", source=long_docs, packing=False, seq_len=16))
    next(it)
    capsys.readouterr()
    it.close()
    out = capsys.readouterr().out
    assert out.startswith("data train/lm: 40 examples; of the first ") and " read, " in out
    assert "truncated to fit the row length" in out and out.count("\n") == 1
    quiet = iter(make_dataset(_cfg(packing=False, seq_len=16), "train", tok, seed=0,
                              objective=OBJECTIVE["lm"], process_index=0, process_count=1,
                              source=long_docs, report=False))
    next(quiet)
    quiet.close()
    assert capsys.readouterr().out == ""
