"""`run_demo`: every family in turn, environment facts, the report."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import jax
from absl import logging

from demo import report
from demo.bert import run_bert
from demo.configs import Overrides
from demo.gpt import run_gpt
from demo.machine import xla_denormal_check
from demo.output import banner, start_clock
from demo.settings import DemoSettings
from demo.t5 import run_t5
from jaxformer.host import cpu_name

RUNNERS = {"gpt": run_gpt, "bert": run_bert, "t5": run_t5}  # in the order they run
FAMILIES = tuple(RUNNERS)


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def run_demo(workdir: str | os.PathLike = "runs/demo", settings: DemoSettings | None = None,
             only: Sequence[str] = FAMILIES, overrides: Overrides | None = None,
             out_dir: str | os.PathLike | None = "demo_results", command: str = "") -> dict:
    """Run the demo for the ``only`` families in ``workdir`` (their sub-folders are replaced).

    Args:
      settings: `DemoSettings` (budget scale, seeds, regimes, tuning, decoding).
      overrides: ``{config name or "*": {dotted key: value}}`` applied to the configs, e.g.
        ``{"*": {"model.d_model": 32}, "gpt_pretrain_tiny": {"num_train_steps": 10}}``.
      out_dir: where results.json / results.md / curves.png go (None: nowhere).

    Returns:
      the results (as written to results.json).
    """
    settings = settings or DemoSettings()
    unknown = sorted(set(only) - set(FAMILIES))
    if unknown or not only:
        raise ValueError(f"only={list(only)!r}: choose families among {FAMILIES}")
    logging.set_verbosity(logging.WARNING)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if not jax.config.jax_compilation_cache_dir:  # identical fine-tuning runs compile once
        jax.config.update("jax_compilation_cache_dir", str(workdir.absolute() / "jax_cache"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    t0, load_start = time.perf_counter(), _load()
    start_clock()
    results: dict = {}
    checks = xla_denormal_check()
    print(f"XLA CPU denormal handling: {checks}", flush=True)
    for family in FAMILIES:
        if family not in only:
            continue
        if not settings.resume:
            shutil.rmtree(workdir / family, ignore_errors=True)
        results[family] = RUNNERS[family](workdir, settings, overrides)
    results["checks"] = checks
    results["meta"] = {
        "command": command or "python -m demo",
        "families": list(only), "total_minutes": round((time.perf_counter() - t0) / 60, 2),
        "cpu_count": os.cpu_count(), "cpu": cpu_name(), "load_start": load_start,
        "load_end": _load(), "jax": jax.__version__, "python": sys.version.split()[0],
        "settings": dataclasses.asdict(settings),
    }
    if out_dir is not None:
        report.write(results, Path(out_dir))
        print(f"\nWrote {out_dir}/results.json, results.md, curves.png")
    banner("Pretrained vs scratch")
    print("\n".join(report.headline(results)))
    banner("Goals")
    for goal, measured, ok in report.goals(results):
        print(f"  [{'reached' if ok else 'NOT reached'}] {goal}: {measured}")
    return results
