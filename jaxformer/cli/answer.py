"""Command line: answer questions about a context with an extractive-QA checkpoint (a run of
objective "qa", model.head "span"; BERT on SQuAD, Devlin et al. 2019 §4.2).

    python -m jaxformer.cli.answer --workdir runs/bert_qa --context "The fox sat on the mat." \\
        --question "Where did the fox sit?"
    python -m jaxformer.cli.answer --workdir runs/bert_qa --input questions.jsonl --best

``--input``: a JSONL file of {"context", "question"} records; one JSON line per answer is printed
({"answer", "start", "end", "score"}, character offsets into the context). Windows, the stride and
the longest answer follow the run's config (data.seq_len, objective.doc_stride /
max_question_len / max_answer_len) unless ``--max_answer_len`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from tqdm.auto import tqdm

from jaxformer.checkpoint import open_run
from jaxformer.cli import report_bad_input
from jaxformer.cli.generate import add_checkpoint_flags
from jaxformer.compilation_cache import enable_compilation_cache
from jaxformer.convert.lora import load_merged
from jaxformer.decode.span import best_answer
from jaxformer.models import build_model
from jaxformer.objectives.qa import QAOptions
from jaxformer.progress import PROGRESS_CHOICES, PROGRESS_HELP, bar_disabled
from jaxformer.train.config import run_settings


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jaxformer.cli.answer", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_flags(p)
    p.add_argument("--context", help="the text holding the answer")
    p.add_argument("--question", help="the question about --context")
    p.add_argument("--input", help="JSONL file of {context, question} records")
    p.add_argument("--max_answer_len", type=int, default=0,
                   help="longest answer in tokens (0 = the run's objective.max_answer_len)")
    p.add_argument("--progress_bar", choices=PROGRESS_CHOICES, default="auto", help=PROGRESS_HELP)
    args = p.parse_args(argv)
    if bool(args.input) == bool(args.context is not None or args.question is not None):
        p.error("give either --context and --question, or --input FILE.jsonl")
    if args.input is None and (args.context is None or args.question is None):
        p.error("--context and --question go together")
    return args


def read_records(path: str) -> list[dict]:
    """The {context, question} records of a JSONL file (ValueError naming a bad line)."""
    records = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: invalid JSON ({e.msg})") from None
    return records


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    enable_compilation_cache()
    return report_bad_input("answer", lambda: _answer(args))


def _answer(args: argparse.Namespace) -> None:
    # the run's config only; load_merged below verifies the checkpoint's files (once)
    settings = run_settings(open_run(args.workdir, step=args.step, best=args.best,
                                     verify=False).run_config)
    model_cfg, params, tokenizer = load_merged(args.workdir, step=args.step, best=args.best)
    qa = settings.objective_options  # QAOptions of an objective.name='qa' run
    if model_cfg.head != "span" or tokenizer is None or not isinstance(qa, QAOptions):
        raise ValueError(f"{args.workdir} is no extractive-QA run with a tokenizer (model.head="
                         f"{model_cfg.head!r}, objective.name={settings.objective.name!r}); train "
                         "one with objective.name='qa', head='span'")
    lengths = dict(seq_len=settings.data.seq_len, doc_stride=qa.doc_stride,
                   max_question_len=qa.max_question_len,
                   max_answer_len=args.max_answer_len or qa.max_answer_len)
    model = build_model(model_cfg)
    if args.input is None:
        answer = best_answer(model, params, tokenizer,
                             {"context": args.context, "question": args.question}, **lengths)
        print(answer.text)
        print(f"characters {answer.start}:{answer.end}, score {answer.score:.3f}", file=sys.stderr)
        return
    for record in tqdm(read_records(args.input), desc="answering", file=sys.stderr,
                       disable=bar_disabled(args.progress_bar)):
        answer = best_answer(model, params, tokenizer, record, **lengths)
        print(json.dumps({"answer": answer.text, "start": answer.start, "end": answer.end,
                          "score": round(answer.score, 4)}, ensure_ascii=False))


def run() -> None:
    """The console script (`[project.scripts]`): exits with `main`'s status."""
    sys.exit(main())


if __name__ == "__main__":
    run()
