"""``python -m demo``: see `demo`."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from demo import FAMILIES, DemoSettings, run_demo
from demo.common import DEMO_CONFIGS, parse_overrides


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m demo", description=__doc__)
    p.add_argument("--workdir", default="runs/demo",
                   help="runs go to <workdir>/{gpt,bert,t5} (replaced on each demo run)")
    p.add_argument("--budget_scale", type=float, default=1.0,
                   help="multiplies every run's steps (0.1 for a quick look)")
    p.add_argument("--pretrain_scale", type=float, default=1.0,
                   help="multiplies the pretraining runs' steps only (fine-tuning unchanged)")
    p.add_argument("--bert_curve_points", type=int, default=DemoSettings.bert_curve_points,
                   help="BERT pretraining checkpoints the low-resource fine-tuning starts from")
    p.add_argument("--t5_max_tokens", type=int, default=DemoSettings.t5_max_tokens,
                   help="translation pairs kept when both sides fit in this many tokens (with EOS)")
    p.add_argument("--only", default=",".join(FAMILIES), help="comma-separated families")
    p.add_argument("--out", default="demo_results", help="results.json / .md / curves.png here")
    p.add_argument("--beam_size", type=int, default=DemoSettings.beam_size)
    p.add_argument("--set", action="append", default=[], metavar="[CONFIG:]KEY=VALUE",
                   help="override a key of the demo's configs (repeatable): of every config, e.g. "
                        "--set model.d_model=256, or of one of " + ", ".join(DEMO_CONFIGS) +
                        ", e.g. --set bert_finetune_tiny:data.seq_len=96")
    args = p.parse_args(argv)
    for name in ("budget_scale", "pretrain_scale", "bert_curve_points", "beam_size",
                 "t5_max_tokens"):
        if getattr(args, name) <= 0:
            p.error(f"--{name}={getattr(args, name)} must be positive")
    try:
        overrides = parse_overrides(args.set)
    except ValueError as e:
        p.error(str(e))
    settings = dataclasses.replace(DemoSettings(), budget_scale=args.budget_scale,
                                   pretrain_scale=args.pretrain_scale,
                                   bert_curve_points=args.bert_curve_points,
                                   t5_max_tokens=args.t5_max_tokens,
                                   beam_size=args.beam_size)
    command = "python -m demo " + " ".join(sys.argv[1:] if argv is None else argv)
    run_demo(args.workdir, settings, [f.strip() for f in args.only.split(",") if f.strip()],
             overrides=overrides, out_dir=args.out, command=command.strip())


if __name__ == "__main__":
    main()
