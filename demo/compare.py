"""Pretrained vs scratch, the fair way: the same tokenizer, data, steps and evaluation for both
inits, the learning rate chosen on validation *separately for each init*, and every comparison
repeated over fine-tuning seeds (mean ± standard error, `demo.stats`).

A family supplies two functions:

- ``make_config(size, init_from, lr, seed)`` → the fine-tuning config for a regime of ``size``
  labelled examples (``init_from`` "" for scratch, else the family's pretraining workdir or, for
  BERT's third init, a Hugging Face directory);
- ``measure(trainer, run)`` → ``{"validation": v, "test": t, ...}``: the regime's metric on the
  validation split (what the learning rate is chosen on) and on the test split (what is reported),
  for the run's selected checkpoint.

`compare_inits` runs the grid: for each regime size and init, each learning rate of the init's
grid with seed 0 (chosen on validation), then seeds 1 … n−1 at the chosen rate; with
``DemoSettings.jobs`` > 1 the runs of each of the two stages train that many at a time. Every run keeps its
validation curve (the ``eval_*`` metrics logged at each evaluation), which ``curves.png`` plots.
"""

from __future__ import annotations

import multiprocessing
import shutil
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import jax
import ml_collections
from absl import logging

from demo.output import banner
from demo.runs import count_params, train_run
from demo.settings import DemoSettings
from demo.stats import compare

INITS = ("pretrained", "scratch")  # the headline comparison: the family's own pretraining vs none
MakeConfig = Callable[[int, str, float, int], ml_collections.ConfigDict]
Measure = Callable[..., dict]


def compare_inits(family: str, name: str, workdir: Path, settings: DemoSettings, *,
                  sizes: Sequence[int], make_config: MakeConfig, measure: Measure,
                  higher_is_better: bool, init_from: Mapping[str, str] | None = None,
                  keep_runs: bool = False) -> list[dict]:
    """One row per regime size: the chosen learning rate, every run's metrics and validation
    curve, and `stats.compare` of the validation and test metrics over seeds — pretrained vs
    scratch at the top level, every further init vs scratch under ``"others"``. The pretrained
    init is ``<workdir>/pretrain``; the inits and rates are ``settings.lr_grid(family, size)``,
    the seeds ``settings.seeds``.

    Args:
      init_from: the ``init_from`` of each init beyond pretrained and scratch (BERT's "minilm").
      keep_runs: keep every run's workdir (else only the chosen rate's seed-0 run and the
        other seeds' runs stay; the tuning losers are deleted to save disk).
    """
    seeds = settings.seeds
    init_paths = {"pretrained": str(Path(workdir) / "pretrain"), "scratch": "", **(init_from or {})}
    banner(f"{family.upper()} 2/2: {name} with {tuple(sizes)}, "
           f"{' vs '.join(settings.inits(family))} × {seeds} seeds")
    if seeds < 1:
        raise ValueError(f"seeds={seeds} must be >= 1")
    rows = []
    for size in sizes:
        row: dict = {"size": size, "inits": {}}
        lr_grid = settings.lr_grid(family, size)
        first = run_all({(init, lr): (make_config(size, init_paths[init], lr, 0),
                                      Path(workdir) / f"{family}_{size}_{init}_lr{lr:g}_seed0")
                         for init, grid in lr_grid.items() for lr in grid}, measure, settings.jobs,
                        settings.resume)
        best = {}
        for init, grid in lr_grid.items():
            tried = [{"lr": lr, **first[init, lr]} for lr in grid]
            best[init] = tried[choose(tried, higher_is_better)]
            if not keep_runs:
                for t in tried:
                    if t is not best[init]:
                        shutil.rmtree(t["workdir"], ignore_errors=True)
            row["inits"][init] = {"lr": best[init]["lr"],
                                  "tuning": [{"lr": t["lr"], "validation": t["validation"]}
                                             for t in tried]}
        more = run_all({(init, seed): (make_config(size, init_paths[init], b["lr"], seed),
                                       Path(workdir) / f"{family}_{size}_{init}_seed{seed}")
                        for init, b in best.items() for seed in range(1, seeds)},
                       measure, settings.jobs, settings.resume)
        for init, b in best.items():
            runs = [b] + [{"lr": b["lr"], **more[init, seed]} for seed in range(1, seeds)]
            row["inits"][init]["runs"] = [{k: (str(v) if k == "workdir" else v)
                                           for k, v in r.items()} for r in runs]
        for split in ("test", "validation"):
            row[split] = summarise(row["inits"], split, higher_is_better)
        rows.append(row)
    return rows


def summarise(inits: Mapping[str, Mapping], split: str, higher_is_better: bool) -> dict:
    """`stats.compare` of ``split``'s metric over seeds, pretrained vs scratch; each further
    init's `stats.mean_se` under its name and its comparison with scratch under
    ``"others"[init]``."""
    values = {init: [r[split] for r in v["runs"]] for init, v in inits.items()}
    out = compare(values["pretrained"], values["scratch"], higher_is_better=higher_is_better)
    out["others"] = {init: compare(v, values["scratch"], higher_is_better=higher_is_better)
                     for init, v in values.items() if init not in INITS}
    out.update({init: c["pretrained"] for init, c in out["others"].items()})
    return out


def choose(tried: Sequence[Mapping], higher_is_better: bool) -> int:
    """Index of the best ``"validation"`` among ``tried`` runs; ties go to the smaller ``"lr"``."""
    sign = 1.0 if higher_is_better else -1.0
    return max(range(len(tried)), key=lambda i: (sign * tried[i]["validation"], -tried[i]["lr"]))


def run_all(tasks: Mapping[Hashable, tuple[ml_collections.ConfigDict, Path]], measure: Measure,
            jobs: int = 1, resume: bool = False) -> dict:
    """``{key: _one(config, workdir, measure, resume)}`` of ``tasks`` (``{key: (config,
    workdir)}``), in order, or ``jobs`` at a time in fresh processes (each run is a function of
    its config alone, so the results are the sequential ones; ``measure`` must then pickle: a
    module-level function or a `functools.partial` of one)."""
    if jobs <= 1 or len(tasks) <= 1:
        return {key: _one(config, wd, measure, resume) for key, (config, wd) in tasks.items()}
    cache = jax.config.jax_compilation_cache_dir  # identical runs in the workers compile once too
    with ProcessPoolExecutor(min(jobs, len(tasks)), mp_context=multiprocessing.get_context("spawn"),
                             initializer=_worker_start, initargs=(cache,)) as pool:
        futures = {key: pool.submit(_one, config, wd, measure, resume)
                   for key, (config, wd) in tasks.items()}
        return {key: f.result() for key, f in futures.items()}


def _worker_start(cache: str | None) -> None:
    """A `run_all` worker: `run_demo`'s compilation cache and log level."""
    if cache:
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    logging.set_verbosity(logging.WARNING)


def _one(config: ml_collections.ConfigDict, workdir: Path, measure: Measure,
         resume: bool = False) -> dict:
    """Train ``config`` from nothing in ``workdir`` (``resume``: from its last checkpoint, so a
    finished run is only measured) and measure it; the run's budget is kept."""
    if not resume:
        shutil.rmtree(workdir, ignore_errors=True)
    trainer, run = train_run(workdir.name, config, workdir)
    out = measure(trainer, run)
    evals = [{k: v for k, v in r.items() if k == "step" or k.startswith("eval_")}
             for r in run.rows if any(k.startswith("eval_") for k in r)]
    return {**out, **run.budget(), "workdir": workdir, "seed": int(config.seed),
            "params": count_params(trainer.state.params), "curve": evals}
