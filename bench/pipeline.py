"""Input-pipeline throughput: examples/s and tokens/s of `make_dataset` on real English prose.

Text: the docstrings of the Python standard library (offline, real technical prose). The reference
measured in the same run is SentencePiece encoding alone (the floor cost of the pipeline), so the
ratio ``pipeline / encode`` shows what framing, packing and batching add. Compare tokens/s with the
train step's consumption (tokens per step / step time): the pipeline must not be the bottleneck.

Prints one JSON line and a short table::

    python bench/pipeline.py --seconds 5 --seq_len 512 --batch_size 32 --worker_count 0

``--loader``: the loader at pod scale instead (docs/data.md, "Loader throughput"): tokens/s
delivered to a no-op step, tokenizing on the fly (SentencePiece in the input path) vs reading
pre-tokenized ArrayRecord shards (`jaxformer.data.token_shards`) for the same packed rows (checked
byte-equal in the same run), 0 (inline) / 1 / 2 / 4 worker processes, packing on and off; bytes per
token on disk and where the inline path's time goes::

    python bench/pipeline.py --loader --seconds 3 --seq_len 1024 --batch_size 16
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

from jaxformer.data.containers import read_records
from jaxformer.data.pipeline import DataSettings, default_data_config, make_dataset
from jaxformer.data.sources import get_source
from jaxformer.data.token_shards import write_token_shards
from jaxformer.data.tokenizer import Tokenizer, TokenizerSettings, train_sentencepiece
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
    settings = cfg if isinstance(cfg, DataSettings) else read(DataSettings, cfg)
    ds = make_dataset(settings, "train", tok, seed=0, objective=objective, process_index=0,
                      process_count=1, source=source, report=False)
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


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def loader(args) -> dict:
    """On the fly vs pre-tokenized, workers, packing (module docstring)."""
    docs = stdlib_docstrings(args.texts)
    k = args.doc_texts  # pretraining documents are long: k docstrings joined into one
    if args.docs:  # that many documents of k docstrings drawn at random (a corpus of many records:
        pick = np.random.default_rng(0).integers(0, len(docs), (args.docs, k))  # Grain's shuffle
        texts = ["\n\n".join(docs[i] for i in row) for row in pick]  # costs ~25 µs per record,
    else:                                                                  # 300 µs below 1,000
        texts = ["\n\n".join(docs[i:i + k]) for i in range(0, len(docs), k)]
    tmp = Path(tempfile.mkdtemp(prefix="jaxformer_loader_"))
    with open(tmp / "train.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in texts)
    tok = Tokenizer(train_sentencepiece(texts, vocab_size=args.vocab_size))
    tok.save(tmp / "tok.model")
    base = dict(seq_len=args.seq_len, batch_size=args.batch_size, long_examples="split",
                tokenizer=TokenizerSettings(path=str(tmp / "tok.model")))
    text = DataSettings(source=f"files:{tmp}/{{split}}.jsonl", **base)
    tokenize_s = {n: _timed(lambda n=n: write_token_shards(text, tok, tmp / f"tokens{n}", ["train"],
                                                           num_shards=4, processes=n))
                  for n in (1, 2)}
    tokens = DataSettings(source=f"tokens:{tmp}/tokens1", **base)
    manifest = json.loads((tmp / "tokens1" / "manifest.json").read_text())["splits"]["train"]
    n_tok = manifest["tokens"]
    shard_bytes = sum((tmp / "tokens1" / s["file"]).stat().st_size for s in manifest["shards"])
    text_bytes = sum(len(t.encode("utf-8")) for t in texts)

    def rows(settings, n=20):
        it = iter(make_dataset(settings, "train", tok, seed=0, objective="clm", process_index=0,
                               process_count=1, report=False))
        out = [next(it) for _ in range(n)]
        it.close()
        return out
    same = all(a[k].tobytes() == b[k].tobytes() for a, b in zip(rows(text), rows(tokens)) for k in a)

    # Where the inline path's time goes, per million tokens: reading the records (JSONL parsed /
    # ArrayRecord read and decoded), SentencePiece, and the rest (framing, packing, batching).
    text_src, tok_src = get_source(text, "train"), get_source(tokens, "train")
    stages = {"read text records": _timed(lambda: list(read_records(text_src))),
              "SentencePiece encode": _timed(lambda: [tok.encode(t) for t in texts]),
              "read token records": _timed(lambda: list(read_records(tok_src)))}
    stages = {k: v / n_tok * 1e6 for k, v in stages.items()}
    results = {}
    for packing in (True, False):
        for workers in args.workers:
            for name, settings in (("on the fly", text), ("pre-tokenized", tokens)):
                key = f"{name}, {'packed' if packing else 'padded'}, {workers} workers"
                s = DataSettings(**{**settings.__dict__, "packing": packing,
                                    "worker_count": workers})
                results[key] = measure(s, tok, None, args.seconds)
                print(f"{key}: {results[key]['tokens_per_s']:,.0f} tokens/s", file=sys.stderr)
    for key, r in results.items():
        if key.startswith("on the fly, packed, 0"):
            continue
        if key.startswith("pre-tokenized, packed, 0"):
            inline = results["on the fly, packed, 0 workers"]["tokens_per_s"]
            stages["framing, packing, batching (pre-tokenized, inline)"] = 1e6 / r["tokens_per_s"] - \
                stages["read token records"]
            stages["whole inline pipeline, on the fly"] = 1e6 / inline
            stages["whole inline pipeline, pre-tokenized"] = 1e6 / r["tokens_per_s"]
    ratios = {f"pre-tokenized / on the fly, {p}, {w} workers":
              results[f"pre-tokenized, {p}, {w} workers"]["tokens_per_s"]
              / results[f"on the fly, {p}, {w} workers"]["tokens_per_s"]
              for p in ("packed", "padded") for w in args.workers}
    return dict(bench="pipeline --loader", texts=len(texts), doc_texts=k, drawn=bool(args.docs),
                corpus_tokens=n_tok,
                vocab_size=tok.vocab_size, seq_len=args.seq_len, batch_size=args.batch_size,
                cpu_count=os.cpu_count(), rows_byte_equal=same,
                bytes_per_token={"UTF-8 text": text_bytes / n_tok,
                                 "ArrayRecord uint16 shards": shard_bytes / n_tok},
                tokenize_once_s={f"{n} processes": round(v, 2) for n, v in tokenize_s.items()},
                seconds_per_million_tokens=stages, results=results, ratios=ratios)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=4.0, help="measuring time per setting")
    p.add_argument("--texts", type=int, default=20_000)
    p.add_argument("--vocab_size", type=int, default=8000)
    p.add_argument("--seq_len", type=int, default=512)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--worker_count", type=int, default=0)
    p.add_argument("--read_threads", type=int, default=0)
    p.add_argument("--loader", action="store_true", help="on the fly vs pre-tokenized (docstring)")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2, 4],
                   help="--loader: worker processes to measure")
    p.add_argument("--doc_texts", type=int, default=1,
                   help="--loader: docstrings joined into one document (1: each its own)")
    p.add_argument("--docs", type=int, default=0,
                   help="--loader: documents of --doc_texts docstrings drawn at random (0: each "
                        "docstring once)")
    args = p.parse_args(argv)
    if args.loader:
        report = loader(args)
        print(json.dumps(report))
        print(f"\n{report['texts']} documents of {args.doc_texts} stdlib docstrings, "
              f"{report['corpus_tokens']:,} tokens; rows of "
              f"{args.seq_len}, batch {args.batch_size}; rows byte-equal: {report['rows_byte_equal']}",
              file=sys.stderr)
        print(f"{'setting':42s} {'tokens/s':>11s} {'fill':>5s} {'start s':>7s}", file=sys.stderr)
        for k, v in report["results"].items():
            print(f"{k:42s} {v['tokens_per_s']:11,.0f} {v['fill']:5.2f} {v['startup_s']:7.2f}",
                  file=sys.stderr)
        for k, v in report["ratios"].items():
            print(f"{k:55s} {v:6.1f}x", file=sys.stderr)
        for k, v in report["seconds_per_million_tokens"].items():
            print(f"{k:55s} {v:6.2f} s per 1M tokens", file=sys.stderr)
        return

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
