"""Switch-T5 vs dense T5 at equal FLOPs per token (issue 62's learning figure): summarise the runs.

The runs (each a plain `train.py` run; all six at once under ``nice -n 19`` on the shared CPU):

    for seed in 0 1 2; do for cfg in t5_denoise_tiny switch_denoise_tiny; do
      nice -n 19 python train.py --config configs/$cfg.py --workdir /tmp/moelearn_runs/${cfg}_s$seed \\
        --config.seed=$seed --config.num_train_steps=200 --config.optimizer.warmup_steps=20 \\
        --config.eval.every_steps=100 --config.eval.num_batches=20 \\
        --config.checkpoint.every_steps=200 --config.log_every_steps=50 &
    done; done; wait
    python bench/moe_learning.py --runs /tmp/moelearn_runs --out bench/results/moe_learning.json

The two configs differ only in the MoE fields (`configs/switch_denoise_tiny.py`: 8 top-1 experts
of the dense width in layer 1 of each 3-layer stack, capacity factor 1.25), so the FLOPs per token
are the dense model's plus the router's. Read from each run's ``metrics.jsonl``: the validation
loss (``eval_loss``, the same 20 validation batches for every run) at each evaluated step, and the
router metrics of the last logged training step. Per step: mean ± standard error over seeds
(`demo.stats`), the difference Switch − dense with its standard error √(se₁² + se₂²), and whether
|difference| > 2 SE of the difference (None for one seed); also the paired (same-seed)
differences. Runs that have not reached a step are left out of that step's statistics and named
under ``missing``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from demo.stats import mean_se  # noqa: E402

MODELS = {"dense": "t5_denoise_tiny", "switch": "switch_denoise_tiny"}
ROUTER_KEYS = ("router_loss", "moe_aux_loss", "moe_z_loss", "moe_dropped", "moe_load_max")


def read_run(workdir: Path) -> dict:
    """``{"eval": {step: eval_loss}, "last_train": {...}}`` from ``workdir/metrics.jsonl``."""
    evals, last = {}, {}
    path = workdir / "metrics.jsonl"
    if not path.exists():
        return {"eval": evals, "last_train": last}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if "eval_loss" in row:
            evals[row["step"]] = row["eval_loss"]
        if "loss" in row and row["step"] >= last.get("step", -1):
            last = {"step": row["step"], "loss": row["loss"],
                    **{k: row[k] for k in ROUTER_KEYS if k in row}}
    return {"eval": evals, "last_train": last}


def summarise(runs_dir: Path, seeds: list[int], steps: list[int]) -> dict:
    runs = {m: {s: read_run(runs_dir / f"{cfg}_s{s}") for s in seeds} for m, cfg in MODELS.items()}
    by_step, missing = {}, []
    for step in steps:
        vals = {m: {s: r["eval"][step] for s, r in runs[m].items() if step in r["eval"]} for m in MODELS}
        missing += [f"{MODELS[m]} seed {s} step {step}" for m in MODELS for s in seeds
                    if s not in vals[m]]
        if not vals["dense"] or not vals["switch"]:
            continue
        d, w = mean_se(list(vals["dense"].values())), mean_se(list(vals["switch"].values()))
        diff = w["mean"] - d["mean"]
        diff_se = math.sqrt(d["se"] ** 2 + w["se"] ** 2)
        paired = [vals["switch"][s] - vals["dense"][s] for s in seeds
                  if s in vals["switch"] and s in vals["dense"]]
        by_step[step] = {"dense": d, "switch": w, "difference": diff, "difference_se": diff_se,
                         "beyond_2se": abs(diff) > 2 * diff_se if min(d["n"], w["n"]) > 1 else None,
                         "paired_difference": mean_se(paired) if paired else None}
    router = {k: mean_se([r["last_train"][k] for r in runs["switch"].values() if k in r["last_train"]])
              for k in ROUTER_KEYS
              if any(k in r["last_train"] for r in runs["switch"].values())}
    return {"configs": MODELS, "seeds": seeds, "validation_loss": by_step,
            "router_at_last_logged_step": router,
            "last_logged_step": {m: {s: r["last_train"].get("step") for s, r in runs[m].items()}
                                 for m in MODELS},
            "runs": {m: {s: r for s, r in runs[m].items()} for m in MODELS},
            "missing": missing}


def table(result: dict) -> str:
    lines = ["| step | dense T5 | Switch-T5 (8 experts) | Switch − dense | > 2 SE | paired Switch − dense |",
             "|---|---|---|---|---|---|"]
    for step, r in result["validation_loss"].items():
        p = r["paired_difference"]
        lines.append(f"| {step} | {r['dense']['mean']:.3f} ± {r['dense']['se']:.3f} (n={r['dense']['n']}) "
                     f"| {r['switch']['mean']:.3f} ± {r['switch']['se']:.3f} (n={r['switch']['n']}) "
                     f"| {r['difference']:+.3f} ± {r['difference_se']:.3f} "
                     f"| {({True: 'yes', False: 'no', None: 'n/a (one seed)'})[r['beyond_2se']]} "
                     f"| {p['mean']:+.3f} ± {p['se']:.3f} |")
    lines.append("")
    lines += [f"{k}: {v['mean']:.4f} ± {v['se']:.4f} (n={v['n']})"
              for k, v in result["router_at_last_logged_step"].items()]
    if result["missing"]:
        lines.append("missing: " + ", ".join(result["missing"]))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", default="/tmp/moelearn_runs", help="directory holding <config>_s<seed>")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", default="100,200", help="evaluated steps to compare")
    ap.add_argument("--out", default="", help="also write the JSON here")
    args = ap.parse_args()
    result = summarise(Path(args.runs), [int(s) for s in args.seeds.split(",")],
                       [int(s) for s in args.steps.split(",")])
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))


if __name__ == "__main__":
    main()
