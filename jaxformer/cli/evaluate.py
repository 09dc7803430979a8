"""Command line: score a finished training run on a split or a file, and write the results as JSON.

    python -m jaxformer.cli.evaluate --workdir runs/clf                          # test split, latest
    python -m jaxformer.cli.evaluate --workdir runs/clf --split validation --step 400
    python -m jaxformer.cli.evaluate --workdir runs/clf --data files:extra.tsv --best
    python -m jaxformer.cli.evaluate --workdir runs/t5 --strategy beam --beam_size 4

Loss, accuracy and perplexity over the whole split (the trainer's eval step); per-class precision,
recall, F1 and the confusion matrix for classification; BLEU, chrF and exact match of real decoding
for seq2seq and sft runs (``--decode`` for plain clm runs: the first half of each example is the
prompt, its second half the reference). Results go to ``<workdir>/eval/<split>_step<N>.json``,
with the decoding settings appended when it decodes (``test_step1000_beam4_new64.json``: another
strategy never overwrites a result; `jaxformer.evaluate_run.results_path`); ``--out`` to choose.
`jaxformer.evaluate_run` is the library side.
"""

from __future__ import annotations

from typing import Any

from absl import flags, logging

from jaxformer.cli import REFUSED, exit_with_error, run_absl
from jaxformer.compilation_cache import enable_compilation_cache
from jaxformer.evaluate_run import evaluate_run, results_path, write_results
from jaxformer.evaluation.decoding import DECODING_STRATEGIES
from jaxformer.progress import PROGRESS_CHOICES, PROGRESS_HELP

PROG = "python -m jaxformer.cli.evaluate"


def define_flags() -> None:
    """The flags of this command (absl: defined once per process, by `run`)."""
    flags.DEFINE_string("workdir", None, "Training workdir (config.json, tokenizer.model, checkpoints/).")
    flags.DEFINE_string("split", "test", "Split of the run's data source to score.")
    flags.DEFINE_string("data", None, "Other data, read with the run's data settings: 'files:<glob>' "
                        "(every line; a glob with {split} is read at --split) or another data.source.")
    flags.DEFINE_integer("step", None, "Checkpoint step to score (default: the latest).")
    flags.DEFINE_bool("best", False, "Score the checkpoint kept for checkpoint.best_metric.")
    flags.DEFINE_enum("decode", "auto", ["auto", "yes", "no"],
                      "Score generations: auto = for seq2seq and sft runs; yes also for clm runs.")
    flags.DEFINE_enum("strategy", None, list(DECODING_STRATEGIES),
                      "Decoding (default: the run's eval.generate_strategy, greedy).")
    flags.DEFINE_integer("beam_size", None, "Beam width with --strategy beam (default 4).")
    flags.DEFINE_integer("max_new_tokens", None,
                         "Tokens generated at most (default: eval.generate_max_new_tokens, else "
                         "data.target_len).")
    flags.DEFINE_integer("max_decode", 0, "Decode only the first N examples (0 = all).")
    flags.DEFINE_integer("batch_size", None, "Rows per decoding batch (default: data.batch_size).")
    flags.DEFINE_bool("refill", False, "Greedy: a row that finished takes the next example (every "
                      "16 steps) instead of idling until its batch ends; the same tokens.")
    flags.DEFINE_enum("progress_bar", "auto", list(PROGRESS_CHOICES), PROGRESS_HELP)
    flags.DEFINE_string("out", None, "Results JSON path (default <workdir>/eval/<split>_step<N>"
                        "[_<strategy><beams>_new<max_new_tokens>].json).")
    flags.mark_flags_as_required(["workdir"])


def format_results(results: dict[str, Any]) -> str:
    """A short table of ``results`` (`jaxformer.evaluate_run.evaluate_run`)."""
    m = results["metrics"]
    lines = [f"{results['workdir']} step {results['step']}, {results['data']} "
             f"[{results['split']}] ({results['objective']})"]
    for key in ("loss", "perplexity", "accuracy", "macro_f1", "nsp_accuracy", "tokens", "examples"):
        if key in m:
            lines.append(f"  {key:<14}{m[key]:.4f}" if isinstance(m[key], float)
                         else f"  {key:<14}{m[key]:,}")
    if "per_class" in m:
        width = max(8, *(len(c["name"]) for c in m["per_class"]))
        lines.append(f"  {'class':<{width}}  precision  recall     f1  support")
        lines += [f"  {c['name']:<{width}}  {c['precision']:9.3f}  {c['recall']:6.3f}  "
                  f"{c['f1']:5.3f}  {c['support']:7d}" for c in m["per_class"]]
        lines.append("  confusion (row = true, column = predicted):")
        lines.append(f"  {'':<{width}}  " + " ".join(f"{c['name'][:6]:>6}" for c in m["per_class"]))
        lines += [f"  {c['name']:<{width}}  " + " ".join(f"{n:6d}" for n in row)
                  for c, row in zip(m["per_class"], m["confusion"])]
    g = results.get("generation")
    if g:
        lines.append(f"  decoding ({g['strategy']}, {g['examples']} examples): BLEU {g['bleu']:.2f}"
                     f", chrF {g['chrf']:.2f}, exact match {g['exact_match']:.4f}")
    return "\n".join(lines)


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # Orbax/Grain log every file operation at INFO
    enable_compilation_cache()
    f = flags.FLAGS
    try:
        results = evaluate_run(f.workdir, split=f.split, data=f.data, step=f.step, best=f.best,
                               decode={"auto": None, "yes": True, "no": False}[f.decode],
                               strategy=f.strategy, beam_size=f.beam_size,
                               max_new_tokens=f.max_new_tokens, max_decode=f.max_decode,
                               batch_size=f.batch_size, progress=f.progress_bar,
                               refill=f.refill)
    except (ValueError, FileNotFoundError) as e:  # the message says what and why (damage included)
        exit_with_error(PROG, e, REFUSED)
    path = write_results(results, f.out or results_path(f.workdir, results))
    print(format_results(results))
    print(f"wrote {path}")


def run() -> None:
    """The console script (`[project.scripts]`): defines the flags, then absl runs `main` (`run_absl`)."""
    define_flags()
    run_absl(main, __name__)


if __name__ == "__main__":
    run()
