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

from jaxformer.checkpoint import load_checkpoint_params, read_metrics
from jaxformer.checkpoint.select import best_of, committed_steps
from jaxformer.train.config import config_node
from jaxformer.train.config import load_config as load_training_config
from jaxformer.train.loop import Trainer

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"  # demo/ sits beside configs/
Overrides = Mapping[str, Mapping[str, Any]]


# Learning rates per family and init for ``--no_tune`` (`make demo`): what the full search over
# `LR_GRID` chose on validation (seed 0), per regime size where the choice differed
# (demo_results/full_search/results.md; T5's from demo_results/t5_pretrain_1600/, the search on
# today's 1,600-step pretraining); a size not listed takes the nearest listed one's.
CHOSEN_LR = {"gpt": {"pretrained": 2e-3, "scratch": 2e-3},
             "bert": {"pretrained": {250: 3e-4, 1000: 1e-3}, "scratch": {250: 1e-3, 1000: 3e-4}},
             "t5": {"pretrained": 3e-3, "scratch": 3e-3}}
# The grids ``--tune`` searches (per init: the same grid for both). GPT's 5e-4 and BERT's 1e-4 were
# the worst rate of every init and regime in the earlier 3-rate search (before the T5 pretraining
# grew), so they were dropped to keep the search near 20 minutes.
LR_GRID = {"gpt": (1e-3, 2e-3), "bert": (3e-4, 1e-3), "t5": (1e-3, 3e-3)}


@dataclasses.dataclass(frozen=True)
class DemoSettings:
    """Demo-level knobs that are not training-config keys.

    Attributes:
      budget_scale: multiplies every run's steps (and warmup, eval and checkpoint cadence).
      pretrain_scale: further multiplies the pretraining runs' steps only.
      seeds: fine-tuning seeds per init and regime (mean ± standard error over them).
      gpt_sizes / bert_sizes / t5_sizes: the regimes — KJV verses the GPT adapts to, sentiment
        labels, translation pairs (0 = all of the training split).
      tune: choose each init's learning rate on validation from `LR_GRID` (seed 0, every
        regime on its own), else use `CHOSEN_LR` (what an earlier search chose).
      min_steps / max_steps: a regime's fine-tuning steps are `EPOCHS` passes over its examples
        at `EXAMPLES_PER_STEP`, clipped to [min_steps, max_steps].
      evals: validation passes (and checkpoints) per fine-tuning run; the best is kept.
      eval_batches: batches of the final validation / test scoring (0 = the whole split; tests
        use a few).
      bert_head: how BERT classifies sentiment: "classify" (a fresh classifier on the mean of the
        final states, configs/bert_finetune_tiny.py) or "cloze" (the pretrained MLM head scoring a
        label word at a [MASK] pattern, PET; configs/bert_cloze_tiny.py). Both inits use it.
      gpt_dropout: dropout of the KJV language-model fine-tuning.
      t5_max_tokens: translation pairs are kept when both sides fit in this many tokens (with EOS).
      t5_test_verses: held-out verses decoded for BLEU, evenly spaced (0 = all of them).
      t5_select_verses: the first validation verses, decoded greedily at every evaluation: their
        BLEU picks the checkpoint and the learning rate.
      decode_batch: sources decoded per call.
      show_verses: translated verses printed and stored.
    """

    budget_scale: float = 1.0
    pretrain_scale: float = 1.0
    seeds: int = 3
    gpt_sizes: tuple[int, ...] = (2000,)
    bert_sizes: tuple[int, ...] = (250, 1000)
    t5_sizes: tuple[int, ...] = (1000,)
    tune: bool = True
    max_steps: int = 1000
    min_steps: int = 150
    evals: int = 4
    eval_batches: int = 0
    bert_head: str = "classify"
    gpt_dropout: float = 0.1
    t5_max_tokens: int = 32
    t5_test_verses: int = 500
    t5_select_verses: int = 100
    decode_batch: int = 64
    show_verses: int = 3

    def lr_grid(self, family: str, size: int) -> dict[str, tuple[float, ...]]:
        """``{init: learning rates}`` of ``family``'s regime of ``size`` examples: the grid when
        tuning, else the chosen one (`chosen_lr`)."""
        if self.tune:
            return {init: LR_GRID[family] for init in ("pretrained", "scratch")}
        return {init: (chosen_lr(family, init, size),) for init in CHOSEN_LR[family]}

    def steps(self, family: str, examples: int) -> int:
        """Fine-tuning steps of a regime with ``examples`` training examples (before
        ``budget_scale``)."""
        steps = round(EPOCHS[family] * examples / EXAMPLES_PER_STEP[family])
        return int(min(max(steps, self.min_steps), self.max_steps))


def chosen_lr(family: str, init: str, size: int) -> float:
    """`CHOSEN_LR` of ``family`` and ``init`` for a regime of ``size`` examples: the entry of the
    nearest listed size (by ratio) where the rate depends on the size."""
    rate = CHOSEN_LR[family][init]
    if not isinstance(rate, Mapping):
        return rate
    return rate[min(rate, key=lambda n: abs(np.log(max(size, 1) / n)))]


# Training examples per step at the demo configs' row sizes (KJV verses packed 128 tokens a row,
# one sentence per row, ~4 verse pairs per 128+128-token row; 8 rows a batch).
EXAMPLES_PER_STEP = {"gpt": 28, "bert": 8, "t5": 32}
# Passes over a regime's examples (validation picks the best of `DemoSettings.evals` checkpoints).
EPOCHS = {"gpt": 3, "bert": 3, "t5": 6}
# The demo's pretraining steps (the configs' own are as long or longer; --pretrain_scale multiplies
# these).
# T5's denoising: at 800 steps pretrained and scratch BLEU overlapped at 1,000 pairs and scratch
# won at 4,000; 1,600 steps (warmup 120) transfer at 1,000 pairs (demo_results/DIAGNOSIS.md, 7-9).
PRETRAIN_STEPS = {"gpt": 800, "bert": 1000, "t5": 1600}


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


# The configs the demo reads (the GPT's KJV language modelling is gpt_pretrain_tiny with the
# demo's data, steps and learning rate).
def regime_config(name: str, overrides: Overrides | None, **keys: Any
                  ) -> ml_collections.ConfigDict:
    """A fine-tuning run's config: `load_config` with the regime's ``keys`` (dotted: data,
    steps, learning rate, seed, init) applied *after* the caller's overrides, so that an override
    aimed at a config's pretraining (``--set gpt_pretrain_tiny:data.source=...``) never replaces
    the regime's data."""
    overrides = dict(overrides or {})
    overrides[name] = {**overrides.get(name, {}), **keys}
    config = load_config(name, overrides)
    config.progress_bar = False
    return config


# The BERT fine-tuning config of each ``DemoSettings.bert_head``.
BERT_HEAD_CONFIGS = {"classify": "bert_finetune_tiny", "cloze": "bert_cloze_tiny"}
DEMO_CONFIGS = ("gpt_pretrain_tiny", "bert_pretrain_tiny", *BERT_HEAD_CONFIGS.values(),
                "t5_denoise_tiny", "t5_finetune_tiny")


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


def pretrain_config(family: str, name: str, settings: DemoSettings,
                    overrides: Overrides | None) -> ml_collections.ConfigDict:
    """``configs/<name>.py`` for the demo's pretraining: `PRETRAIN_STEPS` × the scales (the
    caller's overrides of ``num_train_steps`` win), 5 evaluations."""
    config = load_config(name, {**(overrides or {}), name: {
        "num_train_steps": PRETRAIN_STEPS[family],
        **(overrides or {}).get("*", {}), **(overrides or {}).get(name, {})}})
    scale_budget(config, settings.budget_scale * settings.pretrain_scale, evals=5)
    return config


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


def evaluate_split(trainer, params, split: str, max_batches: int = 0) -> dict:
    """`Trainer.evaluate` over the whole of ``split`` (its first ``max_batches`` batches when
    > 0): loss, accuracy, perplexity."""
    eval_cfg = trainer.config.eval
    saved = (eval_cfg.split, eval_cfg.num_batches)
    eval_cfg.split, eval_cfg.num_batches = split, max_batches if max_batches > 0 else 10**9
    try:
        out = trainer.evaluate(params)
    finally:
        eval_cfg.split, eval_cfg.num_batches = saved
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
