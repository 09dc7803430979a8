"""The collapse watch: a classifier predicting one class for every example is warned about once two
evaluations in a row show it (issue 45), with counts checked against NumPy."""

from __future__ import annotations

import logging
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.train.collapse import CollapseWatch, with_prediction_counts

ROOT = Path(__file__).resolve().parents[1]


def test_prediction_counts_equal_a_numpy_histogram():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 8, 5)).astype(np.float32)  # 4 batches of 8 rows, 5 classes
    weights = (rng.random((4, 8)) > 0.3).astype(np.float32)  # padding rows weigh 0
    labels = rng.integers(0, 5, (4, 8))

    def eval_step(params, batch, key):
        del params, key
        sums = {"loss": jnp.sum(batch["w"]), "weight": jnp.sum(batch["w"])}
        return sums, {"predictions": jnp.argmax(batch["logits"], -1), "targets": batch["y"],
                      "weights": batch["w"]}

    step = jax.jit(with_prediction_counts(eval_step, 5))
    outs = [step(None, {"logits": logits[i], "w": weights[i], "y": labels[i]}, None) for i in range(4)]
    expected = np.bincount(logits.argmax(-1).ravel(), weights=weights.ravel(), minlength=5)
    np.testing.assert_array_equal(sum(np.asarray(o["predicted"]) for o in outs), expected)
    expected = np.bincount(labels.ravel(), weights=weights.ravel(), minlength=5)
    np.testing.assert_array_equal(sum(np.asarray(o["labelled"]) for o in outs), expected)


def test_the_warning_needs_two_collapsed_evaluations_in_a_row_and_comes_once(caplog):
    watch = CollapseWatch(["neg", "pos"])
    assert watch.push(100, [30, 0]) is None  # one evaluation: not yet
    assert watch.push(200, [20, 10]) is None  # recovered
    assert watch.push(300, [0, 30]) is None
    message = watch.push(400, [0, 30])
    assert message.startswith("predictions are all class 1 ('pos'): every one of the 30 examples "
                              "of the last 2 evaluations (steps 300, 400)")
    assert watch.push(500, [0, 30]) is None  # once
    other = CollapseWatch()
    other.push(1, [0, 0, 5])
    assert other.push(2, [0, 5, 0]) is None  # two different classes: no collapse to one


def test_accuracy_at_or_below_the_majority_rate_twice_is_warned_about_naming_the_causes():
    """Issue 60 §7: a run at chance that spreads its predictions over classes was not warned about.
    Labels 60/30/10 (majority rate 0.6): accuracies 0.55 and 0.60 warn; 0.55 then 0.61 does not."""
    watch = CollapseWatch(["a", "b", "c"])
    assert watch.push(100, [40, 50, 10], [60, 30, 10], 0.55) is None  # one evaluation: not yet
    assert watch.push(200, [30, 60, 10], [60, 30, 10], 0.61) is None  # above: no warning
    assert watch.push(300, [30, 60, 10], [60, 30, 10], 0.55) is None
    message = watch.push(400, [50, 40, 10], [60, 30, 10], 0.60)
    assert message.startswith("eval_accuracy 0.5500, 0.6000 at steps 300, 400 is at or below the "
                              "majority-class rate 0.6000 (class 0 ('a') is 60.0% of the evaluated "
                              "examples)")
    assert all(cause in message for cause in ("optimizer.peak_lr", "num_train_steps", "data.columns"))
    assert watch.push(500, [50, 40, 10], [60, 30, 10], 0.5) is None  # once


@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")  # in ml_collections
def test_a_classifier_that_learns_nothing_is_warned_about(tmp_path, caplog):
    """A tiny BERT trained on labels that are all 0 (validation: all three) learns to predict 0
    for everything: the trainer warns after its second such evaluation, naming the class whose
    share of the split eval_accuracy is."""
    from jaxformer.checkpoint import read_metrics
    from jaxformer.train.config import load_config
    from jaxformer.train.loop import Trainer

    rng = np.random.default_rng(1)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    for split, n in (("train", 96), ("validation", 32)):
        rows = [" ".join(rng.choice(words, 6)) + f"\t{rng.integers(3) if split != 'train' else 0}"
                for _ in range(n)]
        (tmp_path / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    config = load_config(ROOT / "configs" / "bert_finetune_tiny.py", {
        "data.source": f"files:{tmp_path}/{{split}}.tsv", "data.columns": ("text,label",),
        "model.vocab_size": 384, "model.d_model": 32, "model.num_heads": 2, "model.d_ff": 64,
        "model.num_layers": 1, "model.max_len": 32, "model.num_classes": 3,
        "data.tokenizer.vocab_size": 384, "data.seq_len": 16, "num_train_steps": 8,
        "optimizer.peak_lr": 3e-3, "optimizer.warmup_steps": 1, "eval.every_steps": 4,
        "eval.num_batches": 4, "checkpoint.async_save": False, "progress_bar": False})
    with caplog.at_level(logging.WARNING):
        Trainer(config, tmp_path / "run").run()
    warnings = [r.getMessage() for r in caplog.records if "predictions are all class" in r.getMessage()]
    assert len(warnings) == 1 and "(steps 4, 8)" in warnings[0]
    label = int(warnings[0].split("predictions are all class ")[1].split(":")[0])
    labels = [int(line.split("\t")[1]) for line in (tmp_path / "validation.tsv").read_text().split("\n")
              if line]
    accuracy = [m["eval_accuracy"] for m in read_metrics(tmp_path / "run") if "eval_accuracy" in m]
    assert accuracy == pytest.approx([labels.count(label) / len(labels)] * 2)
