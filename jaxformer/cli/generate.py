"""Command line: print generations from a checkpoint of a training workdir (the latest, a
``--step``, or the ``--best`` by the run's ``checkpoint.best_metric``).

    python -m jaxformer.cli.generate --workdir /tmp/gpt_run --prompt "Once upon a time" \\
        --strategy sample --temperature 0.8 --top_p 0.9 --max_new_tokens 64 --seed 0
    python -m jaxformer.cli.generate --workdir /tmp/t5_run --prompt "translate: hello" \\
        --strategy beam --beam_size 4 --length_penalty 0.6 --best

For a decoder-only model the prompt is continued; for an encoder-decoder model it is the source.
Without a ``tokenizer.model`` in the workdir, pass token ids with ``--prompt_ids 5,17,9``. At the
end it prints the new tokens per second of decoding, compilation excluded (JAX's compile events).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import jax

from jaxformer.checkpoint import open_run
from jaxformer.cli import report_bad_input
from jaxformer.compilation_cache import enable_compilation_cache
from jaxformer.convert.lora import load_merged
from jaxformer.decode.api import STRATEGIES, encode_prompts, generate
from jaxformer.models import build_model
from jaxformer.train.config import run_settings


def add_checkpoint_flags(p: argparse.ArgumentParser) -> None:
    """``--workdir`` and which of its checkpoints: ``--step N`` or ``--best`` (else the latest)."""
    p.add_argument("--workdir", required=True,
                   help="training workdir (config.json, checkpoints/), or one checkpoint step dir")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, default=None, help="read this step (default: latest)")
    which.add_argument("--best", action="store_true",
                       help="read the best step by the run's checkpoint.best_metric")


def nucleus_mass(text: str) -> float:
    """``--top_p``'s value: a probability mass in (0, 1] (`GenerationConfig.top_p`), refused by
    argparse otherwise (``argument --top_p: …``, exit 2) before a checkpoint is read."""
    value = float(text)  # not a number: argparse's "invalid nucleus_mass value: 'x'"
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is outside (0, 1]: the probability mass sampling "
                                         "keeps (0.9 keeps the likeliest tokens up to 90%; 1 = off)")
    return value


def add_generation_flags(p: argparse.ArgumentParser) -> None:
    """The strategy and its options (`generation_kwargs` reads them)."""
    p.add_argument("--strategy", choices=STRATEGIES, default="greedy")
    p.add_argument("--max_new_tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=1.0, help="sampling; 0 = greedy")
    p.add_argument("--top_k", type=int, default=0, help="sampling; 0 = off")
    p.add_argument("--top_p", type=nucleus_mass, default=1.0, help="sampling, in (0, 1]; 1 = off")
    p.add_argument("--beam_size", type=int, default=4)
    p.add_argument("--length_penalty", type=float, default=0.6, help="beam: GNMT alpha")
    p.add_argument("--no_repeat_ngram_size", type=int, default=0,
                   help="never generate the same n-gram twice (0 = off)")
    p.add_argument("--seed", type=int, default=0, help="sampling RNG seed")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jaxformer.cli.generate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_flags(p)
    p.add_argument("--prompt", action="append", default=[], help="text prompt/source (repeatable)")
    p.add_argument("--prompt_ids", action="append", default=[],
                   help="comma-separated token ids, when the workdir has no tokenizer (repeatable)")
    add_generation_flags(p)
    p.add_argument("--add_bos", action="store_true", help="prepend BOS to each prompt")
    p.add_argument("--eos_id", type=int, default=1, help="with --prompt_ids (else the tokenizer's)")
    p.add_argument("--pad_id", type=int, default=0, help="with --prompt_ids (else the tokenizer's)")
    args = p.parse_args(argv)
    if not args.prompt and not args.prompt_ids:
        p.error("give at least one --prompt (or --prompt_ids)")
    return args


# options read by some strategies only: (option, its default, the strategies that read it)
_STRATEGY_OPTIONS = (("temperature", 1.0, ("sample",)), ("top_k", 0, ("sample",)),
                     ("top_p", 1.0, ("sample",)), ("seed", 0, ("sample",)),
                     ("beam_size", 4, ("beam",)), ("length_penalty", 0.6, ("beam",)))


def note_ignored_options(args: argparse.Namespace) -> None:
    """A note on stderr for each strategy option that ``--strategy`` does not read."""
    for option, default, strategies in _STRATEGY_OPTIONS:
        if getattr(args, option) != default and args.strategy not in strategies:
            print(f"note: --{option} applies to --strategy {'/'.join(strategies)}; ignored with "
                  f"--strategy {args.strategy}", file=sys.stderr)


def generation_kwargs(args: argparse.Namespace) -> dict:
    """`jaxformer.decode.generate` options of the strategy flags (``rng`` for sampling)."""
    kwargs = dict(strategy=args.strategy, max_new_tokens=args.max_new_tokens,
                  temperature=args.temperature, top_k=args.top_k or None,
                  top_p=args.top_p if args.top_p < 1.0 else None, beam_size=args.beam_size,
                  length_penalty=args.length_penalty,
                  no_repeat_ngram_size=args.no_repeat_ngram_size)
    if args.strategy == "sample":
        kwargs["rng"] = jax.random.key(args.seed)
    return kwargs


class CompileClock:
    """Seconds JAX spends tracing, lowering and compiling (its ``/jax/core/compile/`` duration
    events) since construction, so a timing can leave compilation out."""

    def __init__(self) -> None:
        self.seconds = 0.0
        jax.monitoring.register_event_duration_secs_listener(self._record)

    def _record(self, event: str, duration: float, **kwargs) -> None:
        if event.startswith("/jax/core/compile/"):
            self.seconds += duration


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    note_ignored_options(args)
    enable_compilation_cache()
    return report_bad_input("generate", lambda: _generate(args))


def _generate(args: argparse.Namespace) -> None:
    start = time.perf_counter()
    model_cfg, params, tokenizer = load_merged(args.workdir, step=args.step, best=args.best)
    model = build_model(model_cfg)
    print(f"loaded {args.workdir} ({model_cfg.family}, "
          f"{sum(x.size for x in jax.tree.leaves(params)):,} parameters, attention "
          f"{model_cfg.attention_summary()}; decoding with a cache: xla) in "
          f"{time.perf_counter() - start:.1f}s; compiling and generating …", file=sys.stderr)
    kwargs = generation_kwargs(args)
    if model_cfg.family == "encoder_decoder":  # the run's (BART: 2), as training started it
        kwargs["decoder_start_id"] = run_settings(open_run(
            args.workdir, step=args.step, best=args.best, verify=False).run_config
        ).objective.decoder_start_id
    clock, start, new_tokens = CompileClock(), time.perf_counter(), 0
    if args.prompt:
        if tokenizer is None:
            raise ValueError(f"{args.workdir} has no tokenizer.model, so text prompts cannot be "
                             "encoded; pass token ids with --prompt_ids 5,17,9")
        if not args.add_bos and model_cfg.family == "decoder" and not all(args.prompt):
            raise ValueError("an empty --prompt gives a decoder-only model nothing to continue "
                             "from: add --add_bos to start it from the BOS token")
        ids = encode_prompts(tokenizer, args.prompt, model_cfg.family, add_bos=args.add_bos)
        eos = tokenizer.special.eos_id
        result = generate(model, params, ids, eos_id=eos, pad_id=max(tokenizer.special.pad_id, 0),
                          **kwargs)
        new_tokens += int(jax.device_get(result.lengths).sum())
        for prompt, seq in zip(args.prompt, result.sequences(eos)):
            print(f"PROMPT: {prompt}\nOUTPUT: {tokenizer.decode(seq)}\n")
    if args.prompt_ids:
        try:
            ids = [[int(x) for x in s.split(",") if x.strip()] for s in args.prompt_ids]
        except ValueError as e:
            raise ValueError(f"--prompt_ids must be comma-separated integers, got "
                             f"{args.prompt_ids}") from e
        result = generate(model, params, ids, eos_id=args.eos_id, pad_id=args.pad_id, **kwargs)
        new_tokens += int(jax.device_get(result.lengths).sum())
        for prompt, seq in zip(ids, result.sequences()):
            print(f"PROMPT_IDS: {prompt}\nOUTPUT_IDS: {seq}\n")
    total = time.perf_counter() - start
    decoding = max(total - clock.seconds, 1e-9)
    print(f"{new_tokens} new tokens in {decoding:.2f}s: {new_tokens / decoding:,.1f} tokens/s "
          f"(compilation excluded: {min(clock.seconds, total):.1f}s)", file=sys.stderr)


def run() -> None:
    """The console script (`[project.scripts]`): exits with `main`'s status."""
    sys.exit(main())


if __name__ == "__main__":
    run()
