"""What every demo family shares: configs with overrides, timed training runs, evaluation passes.

A demo run is ``configs/<name>.py`` (the CPU-sized hyper-parameters) with the demo's settings and
the caller's overrides applied, trained by `jaxformer.train.loop.Trainer` in
``<workdir>/<family>/<run>``; `train_run` returns a `RunResult` with its budget in steps, tokens
and seconds and its metric rows (the learning curve).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import time
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxformer.train.checkpoint import load_checkpoint_params
from jaxformer.train.config import config_node
from jaxformer.train.config import load_config as load_training_config
from jaxformer.train.loop import Trainer
from jaxformer.train.metrics import read_metrics

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"  # demo/ sits beside configs/
Overrides = Mapping[str, Mapping[str, Any]]


@dataclasses.dataclass(frozen=True)
class DemoSettings:
    """Demo-level knobs that are not training-config keys.

    Attributes:
      budget_scale: multiplies every run's steps (and warmup, eval and checkpoint cadence).
      pretrain_scale: further multiplies the pretraining runs' steps only (longer pretraining,
        the same fine-tuning: how the fine-tuning results grow with pretraining).
      low_resource_examples: labelled sentences of the low-resource sentiment split.
      low_resource_steps: fine-tuning steps on the low-resource split (scaled by budget_scale).
      bert_curve_points: pretraining checkpoints (evenly spaced, the last = end of pretraining)
        from which the low-resource fine-tuning is repeated to trace gap vs pretraining time.
      t5_max_tokens: translation pairs are kept when both sides fit in this many tokens (with EOS).
      t5_test_verses: held-out verses decoded for BLEU, evenly spaced over the test verses within
        the limit (0 = all of them).
      t5_curve_verses: test verses decoded greedily at every checkpoint (BLEU against steps).
      t5_select_verses: validation verses on which the translation decoding is chosen (greedy,
        or beam search with one of ``t5_length_penalties``; `demo.t5.choose_decoding`).
      beam_size: beam width tried for translation (1 = greedy only).
      t5_length_penalties: GNMT length-penalty exponents tried with beam search.
      t5_no_repeat_ngrams: no-repeat n-gram sizes tried with every search (0 = off).
      decode_batch: sources decoded per call.
      show_verses: translated verses printed and stored.
    """

    budget_scale: float = 1.0
    pretrain_scale: float = 1.0
    low_resource_examples: int = 1000
    low_resource_steps: int = 750
    bert_curve_points: int = 2
    t5_max_tokens: int = 32
    t5_test_verses: int = 500
    t5_curve_verses: int = 120
    t5_select_verses: int = 200
    beam_size: int = 4
    t5_length_penalties: tuple[float, ...] = (1.3, 1.6)
    t5_no_repeat_ngrams: tuple[int, ...] = (0, 3)
    decode_batch: int = 64
    show_verses: int = 4


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


def load_config(name: str, overrides: Overrides | None = None, **settings: Any
                ) -> ml_collections.ConfigDict:
    """``configs/<name>.py:get_config()`` + ``settings`` (dotted keys) + the caller's overrides
    (``overrides["*"]`` for every config, then ``overrides[name]``)."""
    path = CONFIG_DIR / f"{name}.py"
    if not path.exists():
        raise FileNotFoundError(f"demo config {path} not found: the demo reads the configs/ folder "
                                f"beside its own folder ({Path(__file__).parent})")
    merged = {"progress_bar": True, **settings, **(overrides or {}).get("*", {}),
              **(overrides or {}).get(name, {})}
    config = load_training_config(path, merged)
    return config


DEMO_CONFIGS = tuple(f"{family}_{stage}_tiny" for family in ("gpt", "bert", "t5")
                     for stage in ("pretrain", "finetune"))


def _literal(text: str, current: Any) -> Any:
    """A command-line value for a key whose config value is ``current``: the raw text for string
    keys, else a Python literal (``256``, ``5e-4``, ``True``/``true``, ``(1, 2)``) or the text."""
    if isinstance(current, str):
        return text
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_overrides(items: Collection[str], default: str = "*",
                    allowed: Collection[str] = DEMO_CONFIGS) -> dict[str, dict[str, Any]]:
    """``--set [CONFIG:]KEY=VALUE`` items → `Overrides`, e.g. ``bert_pretrain_tiny:model.d_model=256``
    (one config) or ``model.d_model=256`` (the ``default`` target; ``"*"``: every config).

    Raises:
      ValueError: naming the item, for a missing ``=``, a config outside ``allowed``, or a key that
        a targeted config does not have (overrides change keys, never add them).
    """
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r}: expected [CONFIG:]KEY=VALUE")
        target, _, key = key.rpartition(":")
        target = target or default
        names = tuple(allowed) if target == "*" else (target,)
        if target != "*" and target not in allowed:
            raise ValueError(f"--set {item!r}: unknown config {target!r}; choose among "
                             f"{sorted(allowed)} (or none for all)")
        for name in names:  # every targeted config must have the key
            try:
                parent, leaf = config_node(load_config(name), key)
            except KeyError:
                raise ValueError(f"--set {item!r}: config {name!r} has no key {key!r}") from None
        out.setdefault(target, {})[key] = _literal(value, parent[leaf])
    return out


def scale_budget(config: ml_collections.ConfigDict, scale: float, *, evals: int = 0) -> None:
    """Multiply steps, warmup and cadences by ``scale``; ``evals > 0`` evaluates (and checkpoints)
    that many times, evenly spaced."""
    steps = max(int(round(config.num_train_steps * scale)), 2)
    config.num_train_steps = steps
    warm = config.optimizer.get("warmup_steps", 0)
    if warm:
        config.optimizer.warmup_steps = int(min(max(round(warm * scale), 1), steps - 1))
    if evals:
        every = max(steps // evals, 1)
        config.eval.every_steps = every
        config.checkpoint.every_steps = every
    config.log_every_steps = max(min(config.log_every_steps, steps // 20), 1)


_START = time.perf_counter()


def start_clock() -> None:
    """Restart the clock the stage headers show."""
    global _START
    _START = time.perf_counter()


def banner(text: str) -> None:
    """A stage header with the time since the demo started."""
    m, sec = divmod(int(time.perf_counter() - _START), 60)
    print(f"\n=== [{m:02d}:{sec:02d}] {text} ===", flush=True)


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

    ``seconds`` is the wall time of `Trainer.run` (compilation, periodic evaluation and
    checkpoints included); ``setup_seconds`` that of the Trainer's construction (tokenizer,
    initialisation, restoring ``init_from``).
    """
    workdir = Path(workdir)
    t0 = time.perf_counter()
    trainer = Trainer(config, workdir)
    t1 = time.perf_counter()
    start = trainer.start_step
    trainer.run()
    seconds = time.perf_counter() - t1
    steps = config.num_train_steps - start
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


def evaluate_split(trainer, params, split: str) -> dict:
    """`Trainer.evaluate` over the whole of ``split``: loss, accuracy, perplexity."""
    eval_cfg = trainer.config.eval
    saved = (eval_cfg.split, eval_cfg.num_batches)
    eval_cfg.split, eval_cfg.num_batches = split, 10**9
    try:
        out = trainer.evaluate(params)
    finally:
        eval_cfg.split, eval_cfg.num_batches = saved
    return {k.removeprefix("eval_"): float(v) for k, v in out.items()}


def best_step(rows: list[dict], metric: str, mode: str = "max",
              available: Collection[int] | None = None) -> int:
    """The step of the best ``metric`` row among ``available`` steps (earliest on ties)."""
    scored = [(r[metric], r["step"]) for r in rows
              if metric in r and (available is None or r["step"] in available)]
    if not scored:
        raise ValueError(f"no row logged {metric!r} at a kept checkpoint {sorted(available or [])}")
    sign = 1 if mode == "max" else -1
    return max(scored, key=lambda x: (sign * x[0], -x[1]))[1]


def saved_steps(workdir: Path) -> list[int]:
    """Steps with a checkpoint under ``<workdir>/checkpoints``."""
    d = Path(workdir) / "checkpoints"
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []


def checkpoint_params(workdir: Path, step: int):
    """Parameters of ``<workdir>/checkpoints/<step>`` as device arrays."""
    return jax.tree.map(jnp.asarray, load_checkpoint_params(Path(workdir) / "checkpoints" / str(step)))


def curve(rows: list[dict], key: str) -> list[tuple[int, float]]:
    """``[(step, value)]`` of the rows that logged ``key``."""
    return [(int(r["step"]), float(r[key])) for r in rows if key in r]


def write_jsonl(path: Path, records) -> int:
    """Write dict records one per line, atomically (a reader never sees half a file); returns how
    many."""
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    with tmp.open("w") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
            n += 1
    os.replace(tmp, path)
    return n


def count_params(params) -> int:
    return int(sum(x.size for x in jax.tree.leaves(params)))


def finetune_classifier(name: str, config: ml_collections.ConfigDict, workdir: Path
                        ) -> tuple[dict, RunResult]:
    """Train a sequence classifier, keep the checkpoint with the best validation accuracy and
    report its test accuracy (the same protocol for every sentiment run)."""
    trainer, run = train_run(name, config, workdir)
    step = best_step(run.rows, "eval_accuracy", available=saved_steps(workdir))
    test = evaluate_split(trainer, checkpoint_params(workdir, step), "test")
    val = max(r["eval_accuracy"] for r in run.rows if "eval_accuracy" in r)
    run.extra.update(best_step=step, validation_accuracy=val, test_accuracy=test["accuracy"],
                     model_params=count_params(trainer.state.params))
    return run.summary(), run


def xla_denormal_check(n: int = 384, repeats: int = 10) -> dict:
    """Does XLA on CPU flush float32 denormals to zero, and do denormal inputs slow it down?

    T5's unscaled attention logits can underflow to denormals, which run ~10-100x slower on x86
    unless the FPU flushes them (FTZ) and treats denormal inputs as zero (DAZ). Checks both flags
    on results and inputs, and times one jitted matmul+elementwise op on normal vs denormal data.
    """
    tiny = np.float32(1e-20)
    ftz = float(jax.jit(lambda a, b: a * b)(tiny, tiny)) == 0.0  # 1e-40 is denormal
    daz = float(jax.jit(lambda a: a * 2.0)(np.float32(1e-40))) == 0.0
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    f = jax.jit(lambda a, b: jnp.tanh(a @ b) + b * b)

    def timed(b):
        f(a, b).block_until_ready()
        t = time.perf_counter()
        for _ in range(repeats):
            f(a, b).block_until_ready()
        return (time.perf_counter() - t) / repeats

    normal = timed(rng.standard_normal((n, n), dtype=np.float32))
    denormal = timed((rng.standard_normal((n, n)) * 1e-39).astype(np.float32))
    return {"flush_to_zero": ftz, "denormals_are_zero": daz,
            "denormal_slowdown": round(denormal / normal, 2)}
