"""Timed training runs and what is read back from them: `train_run` trains a config with
`jaxformer.train.loop.Trainer` in ``<workdir>/<family>/<run>`` and returns a `RunResult` (its budget in
steps, tokens and seconds, its metric rows: the learning curve); evaluation passes, the best kept
checkpoint and its parameters.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Collection, Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxformer.checkpoint import load_checkpoint_params, read_metrics
from jaxformer.checkpoint.select import best_of, committed_steps
from jaxformer.train.loop import Trainer


@dataclasses.dataclass
class RunResult:
    """One training run: where, how long (steps, tokens, seconds) and what it logged."""

    name: str
    workdir: str
    steps: int
    tokens: int
    seconds: float
    setup_seconds: float
    rows: list[dict]
    extra: dict = dataclasses.field(default_factory=dict)

    def budget(self) -> dict:
        return {"steps": self.steps, "tokens": self.tokens, "minutes": round(self.seconds / 60, 2)}

    def summary(self) -> dict:
        out = {"workdir": self.workdir, **self.budget(), "seconds": round(self.seconds, 1),
               "setup_seconds": round(self.setup_seconds, 1)}
        return {**out, **self.extra}


def _tokens_per_step(trainer, batches: int = 16) -> float:
    """Mean non-padding tokens (inputs + targets) of a training batch, over a fresh iterator with
    the run's seed (the run's first batches)."""
    it = iter(trainer.make_ds("train"))
    total = 0.0
    for _, batch in zip(range(batches), it):
        for key in ("inputs", "targets"):
            seg = batch.get(f"{key}_segment_ids", batch.get(key))
            if seg is not None:
                total += float(np.sum(np.asarray(seg) != 0))
    if hasattr(it, "close"):
        it.close()
    return total / batches


def train_run(name: str, config: ml_collections.ConfigDict, workdir: Path):
    """Train ``config`` in ``workdir`` (resuming if it holds checkpoints) → (Trainer, RunResult).

    ``steps`` and ``tokens`` are the run's budget, ``seconds`` the wall time of this call's
    `Trainer.run` (compilation, periodic evaluation and checkpoints included; a resumed run's
    earlier steps not); ``setup_seconds`` that of the Trainer's construction (tokenizer,
    initialisation, restoring ``init_from``).
    """
    workdir = Path(workdir)
    t0 = time.perf_counter()
    trainer = Trainer(config, workdir)
    t1 = time.perf_counter()
    last = trainer.run()
    seconds = time.perf_counter() - t1
    if "preempted_at_step" in last:  # a SIGTERM: checkpointed, not finished (as train.py exits)
        sys.exit(f"{workdir} stopped by SIGTERM at step {last['preempted_at_step']} (checkpoint "
                 "saved): rerun the demo's command with --resume to continue")
    steps = config.num_train_steps  # the run's budget (a resumed run's earlier steps included)
    tokens = int(round(_tokens_per_step(trainer) * steps))
    rows = read_metrics(workdir)
    return trainer, RunResult(name=name, workdir=str(workdir), steps=steps, tokens=tokens,
                              seconds=seconds, setup_seconds=t1 - t0, rows=rows)


def eval_batches(trainer, split: str) -> Iterator[dict]:
    """One full pass over ``split`` (the last batch padded with empty rows)."""
    it = iter(trainer.make_ds(split, num_epochs=1))
    try:
        yield from it
    finally:
        if hasattr(it, "close"):
            it.close()


def evaluate_split(trainer, params, split: str, max_batches: int = 0) -> dict:
    """`Trainer.evaluate` over the whole of ``split`` (its first ``max_batches`` batches when
    > 0): loss, accuracy, perplexity."""
    out = trainer.evaluate(params, split=split,
                           num_batches=max_batches if max_batches > 0 else 10**9)
    return {k.removeprefix("eval_"): float(v) for k, v in out.items()}


def best_step(rows: list[dict], metric: str, mode: str = "max",
              available: Collection[int] | None = None) -> int:
    """The step of the best ``metric`` row among ``available`` steps (earliest on ties; the rule of
    the trainer's best checkpoint, `jaxformer.checkpoint.select.best_of`)."""
    logged = {r["step"]: r for r in rows
              if metric in r and (available is None or r["step"] in available)}
    step = best_of(logged, metric, mode)
    if step is None:
        raise ValueError(f"no row logged {metric!r} at a kept checkpoint {sorted(available or [])}")
    return step


def saved_steps(workdir: Path) -> list[int]:
    """Steps with a checkpoint under ``<workdir>/checkpoints``."""
    return committed_steps(Path(workdir) / "checkpoints")


def checkpoint_params(workdir: Path, step: int):
    """Parameters of ``<workdir>/checkpoints/<step>`` as device arrays."""
    return jax.tree.map(jnp.asarray, load_checkpoint_params(Path(workdir) / "checkpoints" / str(step)))


def count_params(params) -> int:
    return int(sum(x.size for x in jax.tree.leaves(params)))
