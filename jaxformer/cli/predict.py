"""Command line: predictions for a file from a checkpoint of a training run, as JSONL in input order.

    python -m jaxformer.cli.predict --workdir runs/sentiment --input reviews.tsv --output preds.jsonl
    python -m jaxformer.cli.predict --workdir runs/t5 --input sources.txt --best --strategy beam

The checkpoint is the latest, ``--step N`` or the ``--best`` by the run's ``checkpoint.best_metric``.
What is read from ``--input`` and what each JSON line holds: `jaxformer.predict` (the library side).
Generation takes the strategy flags of ``python -m jaxformer.cli.generate``. Log lines go to stderr,
never between the JSONL rows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from jaxformer.cli.generate import (
    add_checkpoint_flags,
    add_generation_flags,
    generation_kwargs,
    note_ignored_options,
)
from jaxformer.compilation_cache import enable_compilation_cache
from jaxformer.predict import predict
from jaxformer.progress import PROGRESS_CHOICES, PROGRESS_HELP


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jaxformer.cli.predict", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_flags(p)
    p.add_argument("--input", required=True, help="text / JSONL / TSV file (or a glob) to predict")
    p.add_argument("--output", default="-", help="JSONL file to write (default: stdout)")
    p.add_argument("--batch_size", type=int, default=32, help="examples per compiled batch")
    p.add_argument("--refill", action="store_true",
                   help="greedy/sampling: a row that finished takes the next input (every 16 "
                        "steps) instead of idling until its batch ends")
    p.add_argument("--progress_bar", choices=PROGRESS_CHOICES, default="auto", help=PROGRESS_HELP)
    add_generation_flags(p)
    args = p.parse_args(argv)
    if args.batch_size < 1:
        p.error(f"--batch_size={args.batch_size} must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    note_ignored_options(args)
    enable_compilation_cache()
    stdout = sys.stdout
    out = stdout if args.output == "-" else None
    try:  # log lines (the data pipeline's included) go to stderr, never between the JSONL rows
        with contextlib.redirect_stdout(sys.stderr):
            rows = predict(args.workdir, args.input, step=args.step, best=args.best,
                           batch_size=args.batch_size, progress=args.progress_bar,
                           refill=args.refill, **generation_kwargs(args))
            if out is None:
                Path(args.output).parent.mkdir(parents=True, exist_ok=True)
                out = open(args.output, "w", encoding="utf-8")  # noqa: SIM115 (closed below)
            for row in rows:
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
    except (ValueError, FileNotFoundError) as e:  # bad input: the message says what and why
        print(f"python -m jaxformer.cli.predict: error: {e}", file=sys.stderr)
        return 2
    finally:
        if out is not None and out is not stdout:
            out.close()
    return 0


def run() -> None:
    """The console script (`[project.scripts]`): exits with `main`'s status."""
    sys.exit(main())


if __name__ == "__main__":
    run()
