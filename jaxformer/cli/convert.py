"""Command line: convert a Hugging Face directory to a jaxformer checkpoint, or back.

    python -m jaxformer.cli.convert --from-hf HF_DIR --to CKPT_DIR [--scan-layers] [--head H]
    python -m jaxformer.cli.convert --from CKPT_DIR --to-hf HF_DIR

A LoRA run (``optimizer.lora.rank`` > 0) exports its adapters merged into the base weights
(W + alpha/rank · A B) of its ``init_from``.

Tokenizer files found in HF_DIR are copied to CKPT_DIR/tokenizer/, and HF_DIR/config.json to
CKPT_DIR/hf_config.json; the export copies them back (token ids, label names survive the trip).
HF_DIR's tokenizer (sentencepiece, or the Hugging Face files of Llama 3, Qwen2, RoBERTa, BART,
DistilBERT, …: `jaxformer.data.fast_tokenizer`) becomes CKPT_DIR/tokenizer.model, and a BART's
decoder_start_token_id CKPT_DIR's objective.decoder_start_id.
Exporting a training workdir writes its ``tokenizer.model`` as HF_DIR/spiece.model (a run on a
Hugging Face tokenizer: ``tokenizer.json`` and a ``tokenizer_config.json``) and its special token
ids into config.json, so ``--config.init_from=HF_DIR`` fine-tunes with the same tokenizer;
GPT-2 / BERT exports also get an equivalent ``tokenizer.json`` for ``AutoTokenizer``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

from jaxformer.checkpoint import load_params, save_params
from jaxformer.convert.hf import load_hf, save_hf
from jaxformer.convert.hf_io import CONFIG_NAME, copy_tokenizer_files, find_tokenizer, read_config
from jaxformer.convert.lora import load_merged
from jaxformer.data.tokenizer import Tokenizer
from jaxformer.models.lora import is_lora

TOKENIZER_DIR = "tokenizer"
HF_CONFIG = "hf_config.json"


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
    args = ap.parse_args(argv)
    try:
        _run(ap, args)
    except (ValueError, FileNotFoundError) as e:  # bad input: the message says what and why
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _run(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.from_hf:
        if not args.to or args.to_hf:
            ap.error("--from-hf needs --to (a jaxformer checkpoint directory)")
        _check_output("--to", args.to)
        cfg, params, _ = load_hf(args.from_hf, scan_layers=args.scan_layers, head=args.head,
                                 num_classes=args.num_classes)
        # as <workdir>/tokenizer.model (sentencepiece, or the HF tokenizer of RoBERTa, BART, …),
        # which the trainer and `jaxformer.cli.generate` read
        start = read_config(args.from_hf).get("decoder_start_token_id")
        objective = {"decoder_start_id": start} if cfg["family"] == "encoder_decoder" and \
            isinstance(start, int) else None  # BART's 2; T5's 0
        save_params(args.to, cfg, params, tokenizer=find_tokenizer(args.from_hf),
                    objective=objective)
        shutil.copyfile(os.path.join(args.from_hf, CONFIG_NAME), os.path.join(args.to, HF_CONFIG))
        copied = copy_tokenizer_files(args.from_hf, os.path.join(args.to, TOKENIZER_DIR))
        print(f"wrote {args.to} ({cfg['family']}, head={cfg['head']}); tokenizer files: {copied}")
    else:
        if not args.to_hf or args.to:
            ap.error("--from needs --to-hf (a Hugging Face directory)")
        _check_output("--to-hf", args.to_hf, empty=True)
        cfg, params = _load(args.from_ckpt)
        tok = os.path.join(args.from_ckpt, TOKENIZER_DIR)
        spm = os.path.join(args.from_ckpt, "tokenizer.model")
        extra, tokenizer = None, None
        if os.path.isfile(os.path.join(args.from_ckpt, HF_CONFIG)):  # an imported model
            with open(os.path.join(args.from_ckpt, HF_CONFIG)) as f:
                extra = json.load(f)
        if os.path.isdir(tok):
            tokenizer = tok
        elif os.path.isfile(spm):  # a training workdir: its tokenizer and special ids
            tokenizer, special = spm, Tokenizer.load(spm).special
            extra = {"pad_token_id": special.pad_id, "eos_token_id": special.eos_id,
                     "bos_token_id": special.bos_id, **(extra or {})}
        save_hf(cfg, params, args.to_hf, tokenizer_path=tokenizer, extra_config=extra)
        print(f"wrote {args.to_hf}" + (f" with the tokenizer of {args.from_ckpt}" if tokenizer else ""))
        if tokenizer == spm and cfg["family"] != "encoder_decoder":
            if os.path.isfile(os.path.join(args.to_hf, "tokenizer.json")):
                print(f"tokenizer: AutoTokenizer.from_pretrained('{args.to_hf}') loads "
                      "tokenizer.json, which gives this run's token ids")
            else:
                print(f"note: {args.to_hf}/spiece.model is this run's sentencepiece tokenizer; "
                      "transformers' GPT-2/BERT tokenizer classes cannot read it: encode with "
                      f"jaxformer.data.tokenizer.Tokenizer.load('{args.to_hf}/spiece.model') "
                      "and pass input_ids")


def _check_output(flag: str, path: str, *, empty: bool = False) -> None:
    """``path`` can be written as a directory: it is none yet, or a directory (``empty``: with
    nothing in it); checked before anything is read."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{flag} {path} exists and is not a directory; give a new directory "
                         "(nothing is overwritten)")
    if empty and os.path.isdir(path) and os.listdir(path):
        raise ValueError(f"{flag} {path} exists and is not empty; choose a new directory "
                         "(nothing is overwritten)")


def _load(path: str) -> tuple[dict, dict]:
    """(ModelConfig fields, params) of a jaxformer directory; a LoRA run's adapters merged into
    the base weights of its init_from (`jaxformer.convert.lora.load_merged`)."""
    run_config = os.path.join(path, "config.json")
    if os.path.isfile(run_config):
        with open(run_config) as f:
            if is_lora(json.load(f)):
                cfg, params, _ = load_merged(path)
                return cfg.to_dict(), params
    return load_params(path)


def run() -> None:
    """The console script (`[project.scripts]`): exits with `main`'s status."""
    sys.exit(main())


if __name__ == "__main__":
    run()
