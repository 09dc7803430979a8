"""Command line: convert a Hugging Face directory to a jaxformer checkpoint, or back.

    python -m jaxformer.cli.convert --from-hf HF_DIR --to CKPT_DIR [--scan-layers] [--head H] \\
        [--vocab-pad-multiple 128]
    python -m jaxformer.cli.convert --from CKPT_DIR --to-hf HF_DIR [--step N | --best]

What is written, tokenizer and ``config.json`` included, and how a LoRA run is merged:
`jaxformer.convert.directory` (the library side).
"""

from __future__ import annotations

import argparse
import os
import sys

from jaxformer.cli import report_bad_input
from jaxformer.convert.directory import export_hf_dir, import_hf_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jaxformer.cli.convert", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-hf", help="Hugging Face model directory to import")
    src.add_argument("--from", dest="from_ckpt", help="jaxformer checkpoint directory to export")
    ap.add_argument("--to", help="jaxformer checkpoint directory to write (with --from-hf)")
    ap.add_argument("--to-hf", help="Hugging Face directory to write (with --from)")
    ap.add_argument("--scan-layers", action="store_true", help="write the scanned layer layout")
    ap.add_argument("--head", help="jaxformer head (default: the checkpoint's)")
    ap.add_argument("--num-classes", type=int, help="classes of a classification head")
    step = ap.add_mutually_exclusive_group()
    step.add_argument("--step", type=int, help="export this step of --from (default: the latest)")
    step.add_argument("--best", action="store_true",
                      help="export the best step of --from by its checkpoint.best_metric")
    ap.add_argument("--vocab-pad-multiple", type=int, default=1,
                    help="pad the vocabulary tables to a multiple of this (model.vocab_pad_multiple; "
                         "exports always write the real vocabulary)")
    args = ap.parse_args(argv)
    return report_bad_input("convert", lambda: _run(ap, args))


def _run(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.from_hf:
        if not args.to or args.to_hf:
            ap.error("--from-hf needs --to (a jaxformer checkpoint directory)")
        if args.step is not None or args.best:
            ap.error("--step / --best choose a step of --from; a Hugging Face model has none")
        _check_output("--to", args.to)
        cfg, copied = import_hf_dir(args.from_hf, args.to, scan_layers=args.scan_layers,
                                    head=args.head, num_classes=args.num_classes,
                                    vocab_pad_multiple=args.vocab_pad_multiple)
        print(f"wrote {args.to} ({cfg['family']}, head={cfg['head']}); tokenizer files: {copied}")
    else:
        if not args.to_hf or args.to:
            ap.error("--from needs --to-hf (a Hugging Face directory)")
        _check_output("--to-hf", args.to_hf, empty=True)
        _, tokenizer = export_hf_dir(args.from_ckpt, args.to_hf, step=args.step, best=args.best)
        print(f"wrote {args.to_hf}" + (f" with the tokenizer of {args.from_ckpt}" if tokenizer else ""))
        if os.path.isfile(os.path.join(args.to_hf, "tokenizer.json")):
            print(f"tokenizer: AutoTokenizer.from_pretrained('{args.to_hf}') gives this run's token "
                  "ids, its framing included")
        elif tokenizer:
            print(f"note: {args.to_hf}/spiece.model is this run's sentencepiece tokenizer, which "
                  "has no tokenizer.json equivalent (see the warning above): encode with "
                  f"jaxformer.data.tokenizer.Tokenizer.load('{args.to_hf}/spiece.model') and pass "
                  "input_ids")


def _check_output(flag: str, path: str, *, empty: bool = False) -> None:
    """``path`` can be written as a directory: it is none yet, or a directory (``empty``: with
    nothing in it); checked before anything is read."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{flag} {path} exists and is not a directory; give a new directory "
                         "(nothing is overwritten)")
    if empty and os.path.isdir(path) and os.listdir(path):
        raise ValueError(f"{flag} {path} exists and is not empty; choose a new directory "
                         "(nothing is overwritten)")


def run() -> None:
    """The console script (`[project.scripts]`): exits with `main`'s status."""
    sys.exit(main())


if __name__ == "__main__":
    run()
