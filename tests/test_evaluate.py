"""Scoring runs: the metrics against independent references (sacrebleu, hand counts, NumPy over
the model applied by hand), ``python -m jaxformer.cli.evaluate`` end to end, and the trainer's
in-training decoding scores (``eval.generate_examples``) driving ``checkpoint.best_metric``."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import sacrebleu

from jaxformer.checkpoint import read_metrics, resolve_checkpoint
from jaxformer.data.sources import SourceSettings, get_source
from jaxformer.evaluate_run import evaluate_run, load_run, results_path
from jaxformer.evaluation import classification_report, exact_match, sequence_scores
from jaxformer.settings import read
from jaxformer.train.config import load_config
from jaxformer.train.loop import Trainer

ROOT = Path(__file__).resolve().parents[1]
TINY = {"model.vocab_size": 384, "model.d_model": 32, "model.num_heads": 2, "model.d_ff": 64,
        "model.num_layers": 1, "model.max_len": 32, "data.tokenizer.vocab_size": 384,
        "data.seq_len": 16, "data.target_len": 16, "data.batch_size": 8, "log_every_steps": 5,
        "checkpoint.async_save": False, "progress_bar": False, "optimizer.warmup_steps": 2,
        "eval.num_batches": 2}
WORDS = ("good great fine bad awful poor the a movie film plot actor scene story was is very "
         "quite rather and but not").split()
LABELS = ("neg", "neu", "pos")


# --------------------------------------------------------------------------------------------------
# The metrics against independent references.


def test_bleu_and_chrf_equal_sacrebleu_corpus_scores():
    hyps = ["the cat sat on the mat", "a dog runs in the park today", "hello there"]
    refs = ["the cat sat on a mat", "the dog runs in the park", "hello there"]
    scores = sequence_scores(hyps, refs)
    assert scores["bleu"] == sacrebleu.corpus_bleu(hyps, [refs]).score
    assert scores["chrf"] == sacrebleu.corpus_chrf(hyps, [refs]).score
    assert scores["exact_match"] == pytest.approx(1 / 3)
    assert sequence_scores(refs, refs)["bleu"] == pytest.approx(100.0)


def test_exact_match_strips_surrounding_whitespace_only():
    assert exact_match(["Hola mundo ", "hola mundo", "Hola", "x"],
                       ["Hola mundo", "Hola mundo", "Hola.", "x"]) == 0.5
    with pytest.raises(ValueError, match="one reference per hypothesis"):
        sequence_scores(["a"], ["a", "b"])


def test_classification_report_equals_a_hand_count():
    labels = [0, 0, 0, 1, 1, 2, 2, 2, 2]
    preds = [0, 1, 0, 1, 2, 2, 2, 0, 2]
    r = classification_report(labels, preds, 4, ["a", "b", "c", "d"])
    # class a: TP 2, predicted 3, support 3; b: TP 1, predicted 2, support 2; c: TP 3, predicted 4,
    # support 4; d: never predicted nor present (ratios 0)
    assert r["confusion"] == [[2, 1, 0, 0], [0, 1, 1, 0], [1, 0, 3, 0], [0, 0, 0, 0]]
    assert [c["precision"] for c in r["per_class"]] == pytest.approx([2 / 3, 1 / 2, 3 / 4, 0])
    assert [c["recall"] for c in r["per_class"]] == pytest.approx([2 / 3, 1 / 2, 3 / 4, 0])
    assert [c["f1"] for c in r["per_class"]] == pytest.approx([2 / 3, 1 / 2, 3 / 4, 0])
    assert r["macro_f1"] == pytest.approx((2 / 3 + 1 / 2 + 3 / 4) / 4)
    assert r["accuracy"] == pytest.approx(6 / 9)
    assert [c["support"] for c in r["per_class"]] == [3, 2, 4, 0]
    with pytest.raises(ValueError, match="outside"):
        classification_report([0, 3], [0, 1], 3)


def test_result_files_are_named_by_what_changes_the_result(tmp_path):
    """Issue 45: ``--strategy beam`` overwrote the greedy result. Strategy, beam size,
    max_new_tokens, max_decode and the data each give their own file."""
    run = {"step": 1000, "split": "test", "data": "files:d/{split}.tsv", "run_data": "files:d/{split}.tsv"}
    greedy = {"strategy": "greedy", "max_new_tokens": 64, "max_decode": 0}
    variants = [run, {**run, "generation": greedy},
                {**run, "generation": {**greedy, "strategy": "beam", "beam_size": 4}},
                {**run, "generation": {**greedy, "strategy": "beam", "beam_size": 8}},
                {**run, "generation": {**greedy, "max_new_tokens": 32}},
                {**run, "generation": {**greedy, "max_decode": 100}},
                {**run, "data": "files:other.tsv", "split": "other.tsv"},
                {**run, "data": "tfds:trec"}, {**run, "split": "validation"}]
    names = [results_path(tmp_path, r).name for r in variants]
    assert len(set(names)) == len(names)
    assert names[:4] == ["test_step1000.json", "test_step1000_greedy_new64.json",
                         "test_step1000_beam4_new64.json", "test_step1000_beam8_new64.json"]
    assert names[5:8] == ["test_step1000_greedy_new64_first100.json", "other.tsv_step1000.json",
                          "tfds_trec_test_step1000.json"]


def test_generation_keys_are_checked_with_the_config():
    path = ROOT / "configs" / "bert_pretrain_tiny.py"
    with pytest.raises(ValueError, match="eval.generate_examples=4 decodes text"):
        Trainer(load_config(path, {"eval.generate_examples": 4}), "/nonexistent/never")
    with pytest.raises(ValueError, match="eval.generate_strategy='sample' must be one of"):
        Trainer(load_config(path, {"eval.generate_strategy": "sample"}), "/nonexistent/never")


# --------------------------------------------------------------------------------------------------
# Tiny runs.


def _sentence(rng: random.Random) -> tuple[str, str]:
    words = [rng.choice(WORDS) for _ in range(rng.randint(3, 8))]
    score = sum(w in ("good", "great", "fine") for w in words) - sum(
        w in ("bad", "awful", "poor") for w in words)
    return " ".join(words), LABELS[int(np.sign(score)) + 1]


def _write_classification(directory: Path) -> None:
    rng = random.Random(0)
    for split, n in (("train", 400), ("validation", 40), ("test", 60)):
        rows = ["text\tlabel"] + ["\t".join(_sentence(rng)) for _ in range(n)]
        (directory / f"{split}.tsv").write_text("\n".join(rows) + "\n")


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    data = tmp_path_factory.mktemp("clf_data")
    _write_classification(data)
    config = load_config(ROOT / "configs" / "gpt_finetune_tiny.py", {
        **TINY, "num_train_steps": 30, "data.source": f"files:{data}/{{split}}.tsv",
        "data.label_names": LABELS, "data.label_key": "label", "model.num_classes": 3,
        "data.seq_len": 12,
        "eval.every_steps": 30, "checkpoint.every_steps": 15, "optimizer.peak_lr": 3e-3})
    workdir = tmp_path_factory.mktemp("clf") / "run"
    Trainer(config, workdir).run()
    return workdir, data, config


def _apply_by_hand(loaded, rows: list[list[int]]) -> np.ndarray:
    """Logits of the model on unpacked right-padded rows: positions 0…, segment 1 on the tokens."""
    width = loaded.config.data.seq_len
    tokens = np.zeros((len(rows), width), np.int32)
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = r
    logits = loaded.model.apply(loaded.params, tokens=jnp.asarray(tokens),
                                positions=jnp.broadcast_to(jnp.arange(width), tokens.shape),
                                segment_ids=jnp.asarray(tokens != 0, jnp.int32))
    return np.asarray(logits, np.float64)


@pytest.mark.slow
def test_classification_scores_equal_numpy_over_the_model_applied_by_hand(classifier):
    workdir = classifier[0]
    results = evaluate_run(workdir, split="test", progress=False)
    loaded = load_run(workdir)
    tok, seq_len = loaded.tokenizer, loaded.config.data.seq_len
    source = get_source(read(SourceSettings, loaded.config.data), "test")
    examples = [source[i] for i in range(60)]
    rows = [tok.encode(e["text"])[:seq_len - 1] + [tok.special.eos_id] for e in examples]  # text </s>
    logits = _apply_by_hand(loaded, rows)
    labels = np.array([e["label"] for e in examples])
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    preds = logits.argmax(-1)
    m = results["metrics"]
    assert results["step"] == 30 and m["examples"] == 60
    assert m["loss"] == pytest.approx(-log_probs[np.arange(60), labels].mean(), rel=1e-4)
    assert m["accuracy"] == pytest.approx(np.mean(preds == labels))
    confusion = [[int(np.sum((labels == t) & (preds == p))) for p in range(3)] for t in range(3)]
    assert m["confusion"] == confusion
    for c, row in enumerate(m["per_class"]):
        tp, predicted, support = confusion[c][c], sum(r[c] for r in confusion), sum(confusion[c])
        precision = tp / predicted if predicted else 0.0
        recall = tp / support if support else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        assert (row["name"], row["support"]) == (LABELS[c], support)
        assert (row["precision"], row["recall"], row["f1"]) == pytest.approx((precision, recall, f1))
    assert "perplexity" not in m and "generation" not in results
    # an older step, and a file outside the run's data (every line read: none held out by hash)
    assert evaluate_run(workdir, split="test", step=15, progress=False)["step"] == 15
    extra = evaluate_run(workdir, data=f"files:{classifier[1]}/test.tsv", progress=False)
    assert extra["metrics"]["confusion"] == confusion
    assert results_path(workdir, extra) == workdir / "eval" / "test.tsv_step30.json"
    with pytest.raises(FileNotFoundError, match=r"no checkpoint of step 7; its steps are \[15, 30\]"):
        evaluate_run(workdir, step=7, progress=False)


@pytest.mark.slow
def test_the_command_writes_json_and_a_finished_run_points_to_it(classifier, capsys):
    workdir = classifier[0]
    proc = subprocess.run([sys.executable, "-m", "jaxformer.cli.evaluate", f"--workdir={workdir}",
                           "--split=validation", "--step=15"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "evaluate validation" not in proc.stderr  # stderr is a pipe: no bar by default
    assert "step 15, attention xla" in proc.stderr  # the start-up line names the attention
    written = json.loads((workdir / "eval" / "validation_step15.json").read_text())
    assert written["step"] == 15 and written["metrics"]["examples"] == 40
    assert "confusion (row = true" in proc.stdout and "pos" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "jaxformer.cli.evaluate", f"--workdir={workdir}/nope"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and bad.stderr.strip().splitlines()[-1].startswith(
        "python -m jaxformer.cli.evaluate: error: workdir")
    Trainer(classifier[2], workdir).run()  # the finished run, rerun as it was
    out = " ".join(capsys.readouterr().out.split())
    assert f"nothing to train (raise --config.num_train_steps to continue; to score it on a split " \
           f"or a file: python -m jaxformer.cli.evaluate --workdir {workdir} --split test)" in out


@pytest.mark.slow
def test_best_scores_the_checkpoint_kept_for_best_metric(classifier):
    workdir = classifier[0]
    ckpt_dir, best = resolve_checkpoint(workdir, best=True)
    assert evaluate_run(workdir, best=True, progress=False)["step"] == best


@pytest.mark.slow
def test_lm_loss_and_perplexity_equal_a_direct_computation(tmp_path):
    rng = random.Random(1)
    for split, n in (("train", 300), ("validation", 20), ("test", 20)):
        (tmp_path / f"{split}.txt").write_text(
            "\n".join(_sentence(rng)[0] for _ in range(n)) + "\n")
    config = load_config(ROOT / "configs" / "gpt_pretrain_tiny.py", {
        **TINY, "num_train_steps": 10, "data.source": f"files:{tmp_path}/{{split}}.txt",
        "data.long_examples": "truncate", "eval.every_steps": 10, "checkpoint.every_steps": 10})
    Trainer(config, tmp_path / "run").run()
    results = evaluate_run(tmp_path / "run", split="test", progress=False)
    loaded = load_run(tmp_path / "run")
    tok, seq_len = loaded.tokenizer, loaded.config.data.seq_len
    source = get_source(read(SourceSettings, loaded.config.data), "test")
    rows = [(tok.encode(e["text"]) + [tok.special.eos_id])[:seq_len]  # text </s>, truncated
            for e in (source[i] for i in range(20))]
    logits = _apply_by_hand(loaded, rows)  # unpacked: the run packs, with segment ids
    nll, correct = [], []
    for r, lg in zip(rows, logits):
        lp = lg[:len(r) - 1] - np.log(np.exp(lg[:len(r) - 1]).sum(-1, keepdims=True))
        nll += (-lp[np.arange(len(r) - 1), r[1:]]).tolist()
        correct += (lg[:len(r) - 1].argmax(-1) == np.array(r[1:])).tolist()
    m = results["metrics"]
    assert m["tokens"] == len(nll)
    assert m["loss"] == pytest.approx(np.mean(nll), rel=1e-4)
    assert m["perplexity"] == pytest.approx(np.exp(np.mean(nll)), rel=1e-4)
    assert m["accuracy"] == pytest.approx(np.mean(correct))
    assert "generation" not in results  # plain clm decodes only when asked
    cont = evaluate_run(tmp_path / "run", split="test", decode=True, max_new_tokens=4,
                        progress=False)["generation"]
    assert cont["examples"] == 20 and 0 <= cont["bleu"] <= 100


# --------------------------------------------------------------------------------------------------
# Seq2seq: in-training decoding scores.


@pytest.mark.slow
def test_seq2seq_eval_bleu_is_logged_and_selects_the_best_checkpoint(tmp_path):
    rng = random.Random(2)
    for split, n in (("train", 300), ("validation", 16), ("test", 16)):
        lines = []
        for _ in range(n):
            words = [rng.choice(WORDS) for _ in range(rng.randint(2, 5))]
            lines.append(json.dumps({"source": " ".join(words), "target": " ".join(words)}))
        (tmp_path / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    config = load_config(ROOT / "configs" / "t5_finetune_tiny.py", {
        **TINY, "num_train_steps": 40, "data.source": f"files:{tmp_path}/{{split}}.jsonl",
        "data.source_key": "source", "data.target_key": "target", "optimizer.peak_lr": 3e-3,
        "model.dropout_rate": 0.0, "objective.label_smoothing": 0.0, "eval.every_steps": 10,
        "checkpoint.every_steps": 10, "checkpoint.keep": 1, "checkpoint.best_metric": "eval_bleu",
        "checkpoint.best_mode": "max", "eval.generate_examples": 8,
        "eval.generate_max_new_tokens": 8})
    Trainer(config, tmp_path / "run").run()
    rows = {r["step"]: r for r in read_metrics(tmp_path / "run") if "eval_bleu" in r}
    assert sorted(rows) == [10, 20, 30, 40]
    assert all({"eval_chrf", "eval_exact_match"} <= set(r) for r in rows.values())
    kept = sorted(int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir()
                  if p.name.isdigit())
    best = max(r["eval_bleu"] for r in rows.values())
    assert max(rows[s]["eval_bleu"] for s in kept) == best  # the best by BLEU is kept
    best_steps = [s for s, r in rows.items() if r["eval_bleu"] == best]
    if len(best_steps) == 1:  # keep=1: the latest and the best (here step 10 of 10, 20, 30, 40)
        assert kept == sorted({40, best_steps[0]})
    # the CLI's decoding of the same sample (the first 8 validation examples) gives the same scores
    again = evaluate_run(tmp_path / "run", split="validation", max_decode=8, progress=False)
    assert again["generation"]["bleu"] == pytest.approx(rows[40]["eval_bleu"])
    assert again["generation"]["exact_match"] == pytest.approx(rows[40]["eval_exact_match"])
    assert "perplexity" in again["metrics"]
    # --refill: 4 rows over 8 examples, finished rows take the next ones; the same decodings
    refilled = evaluate_run(tmp_path / "run", split="validation", max_decode=8, progress=False,
                            batch_size=4, refill=True)
    assert refilled["generation"] == again["generation"] | {"refill": True}
