"""Pretrained vs scratch, the fair way: the same tokenizer, data, steps and evaluation for both
inits, the learning rate chosen on validation *separately for each init*, and every comparison
repeated over fine-tuning seeds (mean ± standard error, `demo.stats`).

A family supplies two functions:

- ``make_config(size, init_from, lr, seed)`` → the fine-tuning config for a regime of ``size``
  labelled examples (``init_from`` "" for scratch);
- ``measure(trainer, run)`` → ``{"validation": v, "test": t, ...}``: the regime's metric on the
  validation split (what the learning rate is chosen on) and on the test split (what is reported),
  for the run's selected checkpoint.

`compare_inits` runs the grid: for each regime size and init, each learning rate of the init's
grid with seed 0 (chosen on validation), then seeds 1 … n−1 at the chosen rate.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import ml_collections

from demo.output import banner
from demo.runs import train_run
from demo.settings import DemoSettings
from demo.stats import compare

INITS = ("pretrained", "scratch")
MakeConfig = Callable[[int, str, float, int], ml_collections.ConfigDict]
Measure = Callable[..., dict]


def compare_inits(family: str, name: str, workdir: Path, settings: DemoSettings, *,
                  sizes: Sequence[int], make_config: MakeConfig, measure: Measure,
                  higher_is_better: bool, keep_runs: bool = False) -> list[dict]:
    """One row per regime size: the chosen learning rate, every run's metrics and `stats.compare`
    of the test metric over seeds. The pretrained init is ``<workdir>/pretrain``; the rates are
    ``settings.lr_grid(family, size)``, the seeds ``settings.seeds``.

    Args:
      keep_runs: keep every run's workdir (else only the chosen rate's seed-0 run and the
        other seeds' runs stay; the tuning losers are deleted to save disk).
    """
    seeds = settings.seeds
    init_paths = {"pretrained": str(Path(workdir) / "pretrain"), "scratch": ""}
    banner(f"{family.upper()} 2/2: {name} with {tuple(sizes)}, pretrained vs scratch × {seeds} "
           "seeds")
    if seeds < 1:
        raise ValueError(f"seeds={seeds} must be >= 1")
    rows = []
    for size in sizes:
        row: dict = {"size": size, "inits": {}}
        lr_grid = settings.lr_grid(family, size)
        for init in INITS:
            tried = []
            for lr in lr_grid[init]:
                wd = Path(workdir) / f"{family}_{size}_{init}_lr{lr:g}_seed0"
                tried.append({"lr": lr, "workdir": wd,
                              **_one(make_config(size, init_paths[init], lr, 0), wd, measure)})
            best = tried[choose(tried, higher_is_better)]
            if not keep_runs:
                for t in tried:
                    if t is not best:
                        shutil.rmtree(t["workdir"], ignore_errors=True)
            runs = [best] + [
                {"lr": best["lr"], **_one(make_config(size, init_paths[init], best["lr"], seed),
                                          Path(workdir) / f"{family}_{size}_{init}_seed{seed}",
                                          measure)}
                for seed in range(1, seeds)]
            row["inits"][init] = {
                "lr": best["lr"],
                "tuning": [{"lr": t["lr"], "validation": t["validation"]} for t in tried],
                "runs": [{k: (str(v) if k == "workdir" else v) for k, v in r.items()}
                         for r in runs]}
        row["test"] = compare([r["test"] for r in row["inits"]["pretrained"]["runs"]],
                              [r["test"] for r in row["inits"]["scratch"]["runs"]],
                              higher_is_better=higher_is_better)
        row["validation"] = compare(
            [r["validation"] for r in row["inits"]["pretrained"]["runs"]],
            [r["validation"] for r in row["inits"]["scratch"]["runs"]],
            higher_is_better=higher_is_better)
        rows.append(row)
    return rows


def choose(tried: Sequence[Mapping], higher_is_better: bool) -> int:
    """Index of the best ``"validation"`` among ``tried`` runs; ties go to the smaller ``"lr"``."""
    sign = 1.0 if higher_is_better else -1.0
    return max(range(len(tried)), key=lambda i: (sign * tried[i]["validation"], -tried[i]["lr"]))


def _one(config: ml_collections.ConfigDict, workdir: Path, measure: Measure) -> dict:
    """Train ``config`` from nothing in ``workdir`` and measure it; the run's budget is kept."""
    shutil.rmtree(workdir, ignore_errors=True)
    trainer, run = train_run(workdir.name, config, workdir)
    out = measure(trainer, run)
    return {**out, **run.budget(), "workdir": workdir, "seed": int(config.seed)}
