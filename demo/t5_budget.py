"""BLEU against training budget for the T5 translation set-up: one long fine-tuning run from random
init with greedy test BLEU at every checkpoint and beam-search BLEU at the end.

The demo's translation runs are a few minutes each; this answers "how much training does this
set-up need for a given BLEU" on the same data, tokenizer, verse-length limit and hyper-parameters
(``configs/t5_finetune_tiny.py``), only with more steps::

    python -m demo.t5_budget --steps 6000 --every 500 \
        [--tokenizer runs/demo/t5/pretrain/tokenizer.model]

Without ``--tokenizer`` the demo's T5 tokenizer is trained first (same config, same corpus, so the
same model). The learning-rate schedule spans the whole run, so BLEU at an intermediate checkpoint
is a lower bound on what a run of that length (whose schedule would have decayed by then) reaches.
Writes ``<out>/t5_budget.json`` and ``<out>/t5_budget.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from demo.configs import Overrides, load_config, parse_overrides
from demo.output import banner, start_clock, write_tool_report
from demo.runs import train_run
from demo.settings import DemoSettings
from demo.t5 import (
    bleu_curve,
    decode_test,
    describe_decoding,
    spread,
    write_translation_split,
)
from jaxformer.data.pipeline import source_texts
from jaxformer.data.sources import SourceSettings, get_source
from jaxformer.data.tokenizer import Tokenizer, TokenizerSettings, load_or_train_tokenizer
from jaxformer.settings import read


def demo_tokenizer(workdir: Path, overrides: Overrides | None = None):
    """The demo's T5 tokenizer (``configs/t5_pretrain_tiny.py``'s tokenizer section and corpus),
    trained into ``workdir`` unless already there."""
    config = load_config("t5_pretrain_tiny", overrides)
    return load_or_train_tokenizer(read(TokenizerSettings, config.data.tokenizer), workdir,
                                   lambda: source_texts(get_source(read(SourceSettings, config.data),
                                                                   "train")))


# The decodings the budget study chooses among on validation BLEU (besides greedy): beam search with
# these GNMT length-penalty exponents, each with and without 3-gram blocking. They were
# `DemoSettings` fields until the demo itself went greedy-only; this tool kept reading them there
# and failed at import.
LENGTH_PENALTIES = (1.3, 1.6)
NO_REPEAT_NGRAMS = (0, 3)


def run_budget(workdir: Path, steps: int, every: int, *, tokenizer_path: str = "",
               max_tokens: int = DemoSettings.t5_max_tokens, test_verses: int = 500,
               curve_verses: int = 200,
               select_verses: int = 200, beam_size: int = 4,
               length_penalties: tuple[float, ...] = LENGTH_PENALTIES,
               no_repeat_ngrams: tuple[int, ...] = NO_REPEAT_NGRAMS,
               decode_batch: int = 64,
               overrides: Overrides | None = None) -> dict:
    workdir = Path(workdir)
    start_clock()
    banner("T5 budget: tokenizer and verse pairs")
    tokenizer = (Tokenizer.load(tokenizer_path) if tokenizer_path
                 else demo_tokenizer(workdir / "tokenizer", overrides))
    tok_path = tokenizer_path or str(workdir / "tokenizer" / "tokenizer.model")
    data, counts = write_translation_split(workdir / "pairs", tokenizer, max_tokens, max_tokens)
    pairs = {k.removeprefix("data."): v for k, v in data.items()}
    test = spread(get_source(read(SourceSettings, pairs), "test"), test_verses)
    select = spread(get_source(read(SourceSettings, pairs), "validation"), select_verses)
    curve_set = spread(test, curve_verses)

    banner(f"T5 budget: {steps} fine-tuning steps from random init")
    c = load_config("t5_finetune_tiny", overrides, **{"data.tokenizer.path": tok_path}, **data)
    c.num_train_steps = steps
    c.optimizer.warmup_steps = min(c.optimizer.warmup_steps, max(steps // 10, 1))
    c.eval.every_steps = c.checkpoint.every_steps = every
    c.checkpoint.keep = steps // every + 1
    ft, run = train_run("t5_budget_scratch", c, workdir / "scratch")
    start_id = int(c.objective.decoder_start_id)
    curve = bleu_curve(ft, run, tokenizer, curve_set, max_tokens, c, decode_batch)
    decoding, hyps, final, decode_s = decode_test(
        ft.model, ft.state.params, tokenizer, select, test, max_len=max_tokens,
        batch=decode_batch, decoder_start_id=start_id, beam_size=beam_size,
        length_penalties=length_penalties, no_repeat_ngrams=no_repeat_ngrams)
    print(f"  final: test BLEU {final['bleu']:.2f} on {len(test)} verses "
          f"({describe_decoding(decoding)})", flush=True)
    return {"run": run.summary(), "length_limit": {"tokens": max_tokens, **counts},
            "curve": curve, "curve_verses": len(curve_set), "test_verses": len(test),
            "decoding": decoding, "final": final, "decode_seconds": decode_s,
            "samples": [{"source": p["source"], "reference": p["target"], "hypothesis": h}
                        for p, h in list(zip(test, hyps))[:4]]}


def markdown(r: dict, command: str) -> str:
    run = r["run"]
    lines = ["# T5 translation: BLEU against training budget", "",
             f"Command: `{command}` — random init, {run['steps']:,} steps / {run['tokens']:,} "
             f"tokens / {run['minutes']:.1f} min. Greedy BLEU on {r['curve_verses']} test verses "
             "at each checkpoint (the schedule spans the whole run, so an intermediate point is a "
             "lower bound for a run of that length):", "",
             "| step | tokens | minutes | validation loss | greedy BLEU |",
             "|---:|---:|---:|---:|---:|"]
    for row in r["curve"]:
        loss = row["validation_loss"]
        lines.append(f"| {row['step']:,} | {row['tokens']:,} | {row['minutes']:.1f} | "
                     f"{'–' if loss is None else f'{loss:.3f}'} | {row['bleu_greedy']:.2f} |")
    lines += ["", f"Final: test BLEU **{r['final']['bleu']:.2f}** with "
              f"{describe_decoding(r['decoding'])} (chosen on {r['decoding']['validation_verses']} "
              "validation verses) "
              f"(chrF {r['final']['chrf']:.1f}) on {r['test_verses']} verses; "
              f"`{r['final']['bleu_detail']}`.", ""]
    for s in r["samples"]:
        lines += [f"- EN: {s['source']}", f"  - reference: {s['reference']}",
                  f"  - model: {s['hypothesis']}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m demo.t5_budget", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="runs/t5_budget")
    p.add_argument("--steps", type=int, default=6000)
    p.add_argument("--every", type=int, default=500)
    p.add_argument("--max_tokens", type=int, default=DemoSettings.t5_max_tokens,
                   help="verse-length limit: pairs kept when both sides fit (EOS included)")
    p.add_argument("--tokenizer", default="", help="an existing tokenizer.model (else trained)")
    p.add_argument("--set", action="append", default=[], metavar="[CONFIG:]KEY=VALUE",
                   help="override a config key (repeatable); CONFIG defaults to t5_finetune_tiny, "
                        "e.g. --set optimizer.peak_lr=3e-3")
    p.add_argument("--out", default="demo_results")
    args = p.parse_args(argv)
    if args.steps <= 0 or not 0 < args.every <= args.steps or args.max_tokens <= 1:
        p.error("--steps must be positive, --every in [1, steps] and --max_tokens > 1")
    try:
        overrides = parse_overrides(args.set, default="t5_finetune_tiny")
    except ValueError as e:
        p.error(str(e))
    results = run_budget(Path(args.workdir), args.steps, args.every, tokenizer_path=args.tokenizer,
                         max_tokens=args.max_tokens, overrides=overrides)
    command = "python -m demo.t5_budget " + " ".join(sys.argv[1:] if argv is None
                                                               else argv)
    write_tool_report(args.out, "t5_budget", results, markdown(results, command.strip()))


if __name__ == "__main__":
    main()
