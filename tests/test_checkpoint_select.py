"""Retention (the ``checkpoint.keep`` latest plus the best, whatever the evaluation schedule) and
checkpoint selection (`resolve_checkpoint` with ``step=`` / ``best=``; ``init_from_step`` /
``init_from_best``)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxformer.checkpoint import (
    Checkpointer,
    load_checkpoint_params,
    read_metrics,
    resolve_checkpoint,
    save_run_config,
)
from jaxformer.checkpoint.select import CheckpointSettings
from jaxformer.train.config import load_config
from jaxformer.train.loop import Trainer, train_and_evaluate

ROOT = Path(__file__).resolve().parents[1]
WORDS = "the cat dog sat ran on a mat log big small red blue".split()


def tiny_gpt(tmp: Path, **overrides):
    """A 1-layer GPT on a 400-line text file: 24 steps, one checkpoint per step, keep=3."""
    rnd = random.Random(0)
    corpus = tmp / "corpus.txt"
    corpus.write_text("\n".join(" ".join(rnd.choice(WORDS) for _ in range(rnd.randint(3, 12)))
                                for _ in range(400)))
    settings = {"num_train_steps": 24, "data.source": f"files:{corpus}", "model.d_model": 32,
                "model.num_heads": 2, "model.d_ff": 64, "model.num_layers": 1, "model.max_len": 64,
                "model.vocab_size": 320, "data.tokenizer.vocab_size": 320, "data.seq_len": 32,
                "data.batch_size": 8, "data.long_examples": "truncate",
                "optimizer.warmup_steps": 2, "checkpoint.every_steps": 1, "checkpoint.keep": 3,
                "checkpoint.best_metric": "eval_loss", "checkpoint.best_mode": "max",
                "eval.every_steps": 1000, "eval.num_batches": 2, "progress_bar": False,
                "log_every_steps": 4, **overrides}
    return load_config(ROOT / "configs" / "gpt_pretrain_tiny.py", settings)


def steps_of(workdir: Path) -> list[int]:
    return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


def test_checkpointer_keeps_the_latest_and_the_best_across_a_resume(tmp_path):
    """Metrics at steps 5 (the best) and 24 only: 22, 23, 24 and 5 remain; a second Checkpointer
    (a resume, given the run's ``checkpoint`` section as `CheckpointSettings`) reads the saved
    metrics back and still keeps 5 while it saves 25..28. The best step of a ``config.json`` whose
    ``checkpoint`` section predates ``best_mode`` is read with its declared default ('min')."""
    state = {"params": {"w": np.ones(3, np.float32)}}
    evals = {5: 0.5, 24: 0.9}
    ckpt = Checkpointer(tmp_path, keep=3, best_metric="eval_loss", best_mode="min",
                        async_save=False)
    for step in range(1, 25):
        ckpt.save(step, state, metrics={"eval_loss": evals[step]} if step in evals else None)
    ckpt.close()
    assert steps_of(tmp_path) == [5, 22, 23, 24]
    resumed = Checkpointer(tmp_path, CheckpointSettings(keep=3, best_metric="eval_loss",
                                                        best_mode="min", async_save=False))
    for step in range(25, 29):
        resumed.save(step, state)
    resumed.close()
    assert steps_of(tmp_path) == [5, 26, 27, 28]
    save_run_config(tmp_path, {"model": {}, "checkpoint": {"best_metric": "eval_loss"}})
    assert resolve_checkpoint(tmp_path, best=True) == (tmp_path / "checkpoints", 5)


def test_without_a_best_metric_only_the_latest_are_kept(tmp_path):
    ckpt = Checkpointer(tmp_path, keep=2, async_save=False)
    for step in range(1, 7):
        ckpt.save(step, {"params": {"w": np.ones(2, np.float32)}},
                  metrics={"eval_loss": 1.0 / step})
    ckpt.close()
    assert steps_of(tmp_path) == [5, 6]
    save_run_config(tmp_path, {"model": {}, "checkpoint": {"best_metric": "", "best_mode": "min"}})
    with pytest.raises(ValueError, match=r"kept no best checkpoint .*its steps are \[5, 6\]"):
        resolve_checkpoint(tmp_path, best=True)


@pytest.fixture(scope="module")
def run24(tmp_path_factory):
    """The issue's case: a checkpoint every step, evaluation at the end only (and, in the
    second run, also at step 12), keep=3, best_metric set."""
    out = {}
    for name, every in (("end_only", 1000), ("mid_and_end", 12)):
        tmp = tmp_path_factory.mktemp(name)
        train_and_evaluate(tiny_gpt(tmp, **{"eval.every_steps": every}), tmp / "run")
        out[name] = tmp / "run"
    return out


@pytest.mark.slow
def test_24_checkpoints_with_evaluation_at_the_end_keep_3(run24):
    assert steps_of(run24["end_only"]) == [22, 23, 24]


@pytest.mark.slow
def test_the_best_evaluated_step_is_kept_beside_the_latest_and_resolved(run24):
    wd = run24["mid_and_end"]
    evals = {r["step"]: r["eval_loss"] for r in read_metrics(wd) if "eval_loss" in r}
    assert sorted(evals) == [12, 24]
    best = max(evals, key=evals.get)  # best_mode="max"
    assert steps_of(wd) == sorted({22, 23, 24, best})
    assert resolve_checkpoint(wd, best=True) == (wd / "checkpoints", best)
    saved = json.loads((wd / "checkpoints" / str(best) / "metrics" / "metrics").read_text())
    assert saved["eval_loss"] == pytest.approx(evals[best])


@pytest.mark.slow
def test_resolve_checkpoint_takes_a_step_a_step_dir_or_the_best(run24):
    wd, ckpts = run24["end_only"], run24["end_only"] / "checkpoints"
    assert resolve_checkpoint(wd) == (ckpts, 24)
    assert resolve_checkpoint(wd, step=22) == (ckpts, 22)
    assert resolve_checkpoint(ckpts / "23") == (ckpts, 23)
    assert resolve_checkpoint(ckpts) == (ckpts, 24)
    assert resolve_checkpoint(wd, best=True) == (ckpts, 24)  # the only evaluated step
    with pytest.raises(FileNotFoundError, match=r"has no step 5: its steps are \[22, 23, 24\]"):
        resolve_checkpoint(wd, step=5)
    with pytest.raises(FileNotFoundError, match=r"has no step 600: its steps are \[22, 23, 24\]"):
        resolve_checkpoint(ckpts / "600")  # a step dir that retention removed
    with pytest.raises(ValueError, match="is step 23; give the run"):
        resolve_checkpoint(ckpts / "23", best=True)
    with pytest.raises(ValueError, match="not both"):
        resolve_checkpoint(wd, step=22, best=True)


@pytest.mark.slow
def test_init_from_step_and_best_pick_the_pretrained_step(run24, tmp_path):
    wd = run24["mid_and_end"]
    evals = {r["step"]: r["eval_loss"] for r in read_metrics(wd) if "eval_loss" in r}
    for overrides, want in (({"init_from_step": 23}, 23),
                            ({"init_from_best": True}, max(evals, key=evals.get)), ({}, 24)):
        trainer = Trainer(tiny_gpt(tmp_path, init_from=str(wd), **overrides),
                          tmp_path / f"ft{want}")
        trainer.lock.release()
        start = jax.tree.leaves(jax.device_get(trainer.state.params))
        saved = jax.tree.leaves(load_checkpoint_params(wd / "checkpoints" / str(want)))
        for a, b in zip(start, saved, strict=True):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(FileNotFoundError, match="has no step 7"):
        Trainer(tiny_gpt(tmp_path, init_from=str(wd), init_from_step=7), tmp_path / "ft7")
    with pytest.raises(ValueError, match="init_from, which is unset"):
        Trainer(tiny_gpt(tmp_path, init_from_best=True), tmp_path / "ft_none")
