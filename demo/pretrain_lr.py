"""The demo's pretraining of one family at several peak learning rates, ranked by the pretraining's
own validation loss (never a test split)::

    python -m demo.pretrain_lr --family t5 --rates 1e-3,2e-3,3e-3,5e-3 --out demo_results/x

Each run is the demo's pretraining (`demo.configs.pretrain_config`: `PRETRAIN_STEPS` ×
``--pretrain_scale``, 5 evaluations) with ``optimizer.peak_lr`` set to the rate and
``optimizer.end_lr`` scaled with it, so the schedule keeps its shape (the demo's configs decay to a
tenth of the peak); everything else (data, seed, warmup, init) is the config's. The runs after the
first reuse its tokenizer (training one is deterministic, so this changes nothing but time).
Writes ``<out>/pretrain_lr.json`` and ``<out>/pretrain_lr.md``: validation loss per evaluation and
rate, the best rate by the final validation loss.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from demo.configs import Overrides, parse_overrides, pretrain_config
from demo.main import _load
from demo.output import banner, curve, start_clock, write_tool_report
from demo.runs import train_run
from demo.settings import DemoSettings
from jaxformer.host import cpu_name

# The config each family's demo pretraining runs (demo/gpt.py, bert.py, t5.py).
PRETRAIN_CONFIGS = {"gpt": "gpt_pretrain_tiny", "bert": "bert_pretrain_tiny",
                    "t5": "t5_denoise_tiny"}


def rate_config(family: str, rate: float, settings: DemoSettings,
                overrides: Overrides | None = None):
    """The demo's pretraining config of ``family`` with peak rate ``rate`` and the end rate scaled
    by ``rate / peak_lr`` (the schedule's shape kept)."""
    config = pretrain_config(family, PRETRAIN_CONFIGS[family], settings, overrides)
    scale = rate / config.optimizer.peak_lr
    config.optimizer.peak_lr = rate
    config.optimizer.end_lr = config.optimizer.end_lr * scale
    return config


def search(family: str, rates: list[float], workdir: Path, settings: DemoSettings,
           overrides: Overrides | None = None) -> dict:
    """Pretrain ``family`` once per rate in ``workdir/<rate>`` → ``{"runs": [...], "best": rate}``
    (best: the lowest final validation loss)."""
    start_clock()
    runs, tokenizer = [], None
    for rate in rates:
        banner(f"{family} pretraining at peak learning rate {rate:g}")
        config = rate_config(family, rate, settings, overrides)
        if tokenizer:
            config.data.tokenizer.path = tokenizer
        trainer, run = train_run(f"{family}_pretrain_{rate:g}", config, workdir / f"{rate:g}")
        tokenizer = tokenizer or str(Path(run.workdir) / "tokenizer.model")
        evals = curve(run.rows, "eval_loss")
        if not evals or evals[-1][0] != config.num_train_steps:  # preempted (SIGTERM)
            raise SystemExit(f"{run.name} stopped before its last evaluation (step "
                             f"{config.num_train_steps}); rerun the same command to resume")
        runs.append({"rate": rate, "end_rate": config.optimizer.end_lr,
                     "num_train_steps": config.num_train_steps,
                     "warmup_steps": config.optimizer.warmup_steps,
                     "validation_loss": evals, "final": evals[-1][1], **run.summary()})
        print(f"  peak {rate:g}: validation loss {evals[-1][1]:.4f} at step {evals[-1][0]}",
              flush=True)
    best = min(runs, key=lambda r: r["final"])["rate"]
    return {"family": family, "config": PRETRAIN_CONFIGS[family], "runs": runs, "best": best,
            "cpu": cpu_name(), "load_at_end": _load()}


def markdown(r: dict, command: str) -> str:
    steps = [s for s, _ in r["runs"][0]["validation_loss"]]
    first = r["runs"][0]
    lines = [f"# {r['family']} pretraining: peak learning rate against validation loss", "",
             f"Command: `{command}` on {r['cpu']} (load average {r['load_at_end']:.1f} at the "
             f"end). `{r['config']}`, {first['num_train_steps']:,} steps, warmup {first['warmup_steps']}, "
             "end rate scaled with the peak (the config's end/peak ratio); validation loss at "
             "each evaluation; minutes of training in this invocation (– for a run resumed from "
             "an earlier one's checkpoints):", "",
             "| peak rate | " + " | ".join(f"step {s:,}" for s in steps) + " | minutes |",
             "|---:|" + "---:|" * (len(steps) + 1)]
    for run in sorted(r["runs"], key=lambda run: run["rate"]):
        cells = [f"**{v:.3f}**" if run["rate"] == r["best"] and s == steps[-1] else f"{v:.3f}"
                 for s, v in run["validation_loss"]]
        minutes = f"{run['minutes']:.1f}" if run["steps"] == run["num_train_steps"] else "–"
        lines.append(f"| {run['rate']:g} | " + " | ".join(cells) + f" | {minutes} |")
    lines += ["", f"Best by the final validation loss: **{r['best']:g}**."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m demo.pretrain_lr", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=sorted(PRETRAIN_CONFIGS), default="t5")
    p.add_argument("--rates", default="1e-3,2e-3,3e-3,5e-3",
                   help="comma-separated peak learning rates")
    p.add_argument("--pretrain_scale", type=float, default=1.0,
                   help="multiplies the demo's pretraining steps (and warmup, evaluations)")
    p.add_argument("--workdir", default="runs/pretrain_lr")
    p.add_argument("--set", action="append", default=[], metavar="[CONFIG:]KEY=VALUE",
                   help="override a key of the family's pretraining config (repeatable)")
    p.add_argument("--out", default="demo_results/pretrain_lr")
    args = p.parse_args(argv)
    try:
        rates = [float(x) for x in args.rates.split(",")]
    except ValueError:
        p.error(f"--rates {args.rates!r}: expected comma-separated numbers, e.g. 1e-3,3e-3")
    if not rates or min(rates) <= 0 or args.pretrain_scale <= 0:
        p.error(f"--rates {args.rates!r} and --pretrain_scale {args.pretrain_scale} must be "
                "positive")
    try:
        overrides = parse_overrides(args.set, default=PRETRAIN_CONFIGS[args.family])
    except ValueError as e:
        p.error(str(e))
    settings = DemoSettings(pretrain_scale=args.pretrain_scale)
    results = search(args.family, rates, Path(args.workdir), settings, overrides)
    command = "python -m demo.pretrain_lr " + " ".join(sys.argv[1:] if argv is None else argv)
    write_tool_report(args.out, "pretrain_lr", results, markdown(results, command.strip()))


if __name__ == "__main__":
    main()
