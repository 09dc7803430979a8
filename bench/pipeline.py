"""Input-pipeline throughput: examples/s and tokens/s of `make_dataset` on real English prose.

Text: the docstrings of the Python standard library (offline, real technical prose). The reference
measured in the same run is SentencePiece encoding alone (the floor cost of the pipeline), so the
ratio ``pipeline / encode`` shows what framing, packing and batching add. Compare tokens/s with the
train step's consumption (tokens per step / step time): the pipeline must not be the bottleneck.

Prints one JSON line and a short table::

    python bench/pipeline.py --seconds 5 --seq_len 512 --batch_size 32 --worker_count 0
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import sysconfig
import time

import numpy as np

from jaxformer.data.pipeline import DataSettings, default_data_config, make_dataset
from jaxformer.data.tokenizer import Tokenizer, train_sentencepiece
from jaxformer.host import skip_absent_tpu
from jaxformer.settings import read

skip_absent_tpu()  # no failed libtpu start-up on a CPU host (jaxformer.host)


class ListSource:
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def stdlib_docstrings(limit: int) -> list[str]:
    """Up to ``limit`` docstrings (>= 80 characters) of standard-library modules, sorted paths."""
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for dirpath, dirnames, files in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("test", "tests", "site-packages",
                                                              "idlelib", "__pycache__"))
        for name in sorted(f for f in files if f.endswith(".py")):
            try:
                with open(os.path.join(dirpath, name), encoding="utf-8") as f:
                    tree = ast.parse(f.read())
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                     ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node)
                    if doc and len(doc) >= 80:
                        out.append(doc)
                        if len(out) >= limit:
                            return out
    return out


def measure(cfg, tok, source, seconds, objective="clm") -> dict:
    ds = make_dataset(read(DataSettings, cfg), "train", tok, seed=0, objective=objective, process_index=0,
                      process_count=1, source=source)
    it = iter(ds)
    t0 = time.perf_counter()
    next(it)  # start-up (worker processes, first buffers) reported separately
    startup = time.perf_counter() - t0
    batches = examples = tokens = slots = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        b = next(it)
        seg = b["inputs_segment_ids"]
        batches += 1
        examples += int(np.sum(seg.max(axis=1)))
        tokens += int(np.sum(seg > 0))
        slots += seg.size
        if "targets_segment_ids" in b:
            tokens += int(np.sum(b["targets_segment_ids"] > 0))
            slots += b["targets_segment_ids"].size
    dt = time.perf_counter() - t0
    if hasattr(it, "close"):
        it.close()
    return dict(examples_per_s=examples / dt, tokens_per_s=tokens / dt, batches_per_s=batches / dt,
                fill=tokens / slots, startup_s=startup, batches=batches)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=4.0, help="measuring time per setting")
    p.add_argument("--texts", type=int, default=20_000)
    p.add_argument("--vocab_size", type=int, default=8000)
    p.add_argument("--seq_len", type=int, default=512)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--worker_count", type=int, default=0)
    p.add_argument("--read_threads", type=int, default=0)
    args = p.parse_args(argv)

    texts = stdlib_docstrings(args.texts)
    t0 = time.perf_counter()
    tok = Tokenizer(train_sentencepiece(texts, vocab_size=args.vocab_size))
    train_s = time.perf_counter() - t0

    # Reference: SentencePiece alone over the corpus (one call per text, as the pipeline does).
    t0 = time.perf_counter()
    n_tok = sum(len(tok.encode(t)) for t in texts)
    encode_s = time.perf_counter() - t0
    ref = dict(examples_per_s=len(texts) / encode_s, tokens_per_s=n_tok / encode_s)

    source = ListSource([{"text": t} for t in texts])
    base = dict(seq_len=args.seq_len, target_len=args.seq_len // 4, batch_size=args.batch_size,
                worker_count=args.worker_count, read_threads=args.read_threads)
    settings = {
        "lm packed (GPT)": dict(packing=True, framing="eos"),
        "lm padded (GPT)": dict(packing=False, framing="eos"),
        "lm packed split (BERT)": dict(packing=True, framing="cls_sep", long_examples="split"),
    }
    results = {}
    for name, kw in settings.items():
        cfg = default_data_config()
        cfg.update(dict(base, **kw))
        results[name] = measure(cfg, tok, source, args.seconds)
    cfg = default_data_config()
    cfg.update(dict(base, packing=True))
    results["span corruption packed (T5)"] = measure(cfg, tok, source, args.seconds,
                                                     "span_corruption")

    report = dict(
        bench="pipeline", texts=len(texts), corpus_tokens=n_tok, vocab_size=tok.vocab_size,
        tokenizer_train_s=round(train_s, 2), seq_len=args.seq_len, batch_size=args.batch_size,
        worker_count=args.worker_count, read_threads=args.read_threads,
        reference_encode=ref, cpu_count=os.cpu_count(),
        results={k: {**v, "tokens_vs_encode": v["tokens_per_s"] / ref["tokens_per_s"]}
                 for k, v in results.items()})
    print(json.dumps(report))
    print(f"\n{len(texts)} stdlib docstrings, {n_tok} tokens, vocab {tok.vocab_size}, tokenizer "
          f"trained in {train_s:.1f}s; rows of {args.seq_len}, batch {args.batch_size}, "
          f"{args.worker_count} workers", file=sys.stderr)
    print(f"{'setting':30s} {'examples/s':>11s} {'tokens/s':>10s} {'fill':>5s} "
          f"{'vs encode':>9s} {'start s':>7s}", file=sys.stderr)
    print(f"{'encode only (reference)':30s} {ref['examples_per_s']:11.0f} "
          f"{ref['tokens_per_s']:10.0f} {'':>5s} {1.0:9.2f} {'':>7s}", file=sys.stderr)
    for k, v in report["results"].items():
        print(f"{k:30s} {v['examples_per_s']:11.0f} {v['tokens_per_s']:10.0f} {v['fill']:5.2f} "
              f"{v['tokens_vs_encode']:9.2f} {v['startup_s']:7.2f}", file=sys.stderr)


if __name__ == "__main__":
    main()
