"""Where one training step's accelerator time goes: its compiled HLO instructions by device time.

The step is `bench/accelerator.py`'s (the trainer's own jitted step on a ``<preset>_bf16`` model,
packed random batch). A few steps run under `jax.profiler.trace` with a Perfetto trace; the device
timeline's ``XLA Ops`` line holds one event per executed HLO instruction (fusion, cuBLAS / cuDNN
custom call, copy, collective), named as in the optimised HLO (`compiled.as_text()`). Events are
summed per instruction and divided by the number of profiled steps; each instruction is given a
category from its name and the JAX source that produced it (the ``op_name`` of its HLO metadata,
layer indices folded to ``#``):

* ``gemm``: cuBLAS / cuBLASLt matmuls and Triton GEMM fusions (``gemm``, ``dot``, ``cublas``);
* ``attention``: cuDNN fused attention (``cudnn``, ``fmha``, ``flash``);
* ``reduce``: input / row reductions (norms, softmax statistics, bias gradients, the loss);
* ``copy``: copies, transposes, dynamic slices and updates (the scan's per-layer slicing);
* ``collective``: all-reduce, all-gather, reduce-scatter, collective-permute;
* ``elementwise``: every other fusion (activations, residual adds, dropout, AdamW).

    python bench/gpu_profile.py --model gpt2_medium --impl cudnn --batch 16
    python bench/gpu_profile.py --model t5_base --impl xla --top 30 --out /tmp/prof
    python bench/accelerator.py --profile /tmp/prof    # every benchmarked step, same executables

The raw trace and the compiled HLO (gzipped) are kept under ``--out`` for a closer look.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys

import jax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import block, format_table  # noqa: E402

CATEGORIES = (  # first match wins: (category, pattern over the instruction's name)
    ("attention", r"cudnn|fmha|flash|fused_attention"),
    ("gemm", r"gemm|dot|cublas|matmul|triton|xmma|cutlass|sm90_"),
    ("collective", r"all-reduce|all-gather|reduce-scatter|collective-permute|all-to-all"),
    ("copy", r"copy|transpose|dynamic[-_]slice|dynamic[-_]update|concatenate|slice|pad|bitcast"),
    ("reduce", r"reduce"),
)


def category(name: str) -> str:
    for cat, pattern in CATEGORIES:
        if re.search(pattern, name):
            return cat
    return "elementwise"


def hlo_sources(hlo_text: str) -> dict[str, str]:
    """Instruction name → the JAX ``op_name`` of its metadata (layer numbers folded to ``#``)."""
    out = {}
    for m in re.finditer(r'(?m)^\s*(?:ROOT )?%?([\w.\-]+) = [^\n]*?op_name="([^"]*)"', hlo_text):
        out[m.group(1)] = re.sub(r"\d+", "#", m.group(2).split("/", 1)[-1])[:110]
    return out


def device_op_times(trace_dir: str) -> dict[str, float]:
    """Microseconds per HLO instruction summed over the device's ``XLA Ops`` line of the Perfetto
    trace written by `jax.profiler.trace(..., create_perfetto_trace=True)` (per kernel over the
    device's stream lines where a trace has no ``XLA Ops`` line)."""
    files = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
    if not files:
        raise FileNotFoundError(f"no *.trace.json.gz under {trace_dir}")
    with gzip.open(max(files, key=os.path.getmtime), "rt") as f:
        events = json.load(f)["traceEvents"]
    processes, threads = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            processes[e["pid"]] = e["args"]["name"]
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
    devices = {pid for pid, name in processes.items() if "/device:" in name and "CPU" not in name}
    ops_lines = {key for key, name in threads.items() if key[0] in devices and name == "XLA Ops"}
    if not ops_lines:  # no per-instruction line: the kernels of the device's streams instead
        ops_lines = {key for key, name in threads.items()
                     if key[0] in devices and not re.search(r"Modules|Steps|TraceMe", name)}
    totals: dict[str, float] = collections.defaultdict(float)
    for e in events:
        if e.get("ph") == "X" and (e.get("pid"), e.get("tid")) in ops_lines:
            totals[e["name"]] += float(e.get("dur", 0.0))
    if not totals:
        names = sorted({f"{processes.get(p)} / {t}" for (p, _), t in threads.items()})
        raise RuntimeError(f"no device 'XLA Ops' events in the trace; its lines: {names[:20]}")
    return dict(totals)


def profile_step(run, compiled, *, steps: int, out: str, name: str, top: int = 25) -> dict:
    """Device time of ``steps`` calls of ``run`` (a compiled step, already warm) by instruction:
    ``{"device_ms_per_step", "categories": {cat: {ms, share}}, "top": [...]}``; the trace and the
    gzipped HLO of ``compiled`` are written under ``out`` as ``trace_<name>``, ``hlo_<name>``."""
    trace_dir = os.path.join(out, f"trace_{name}")
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        for _ in range(steps):
            block(run())
    hlo = compiled.as_text()
    with gzip.open(os.path.join(out, f"hlo_{name}.txt.gz"), "wt") as f:
        f.write(hlo)
    sources = hlo_sources(hlo)
    per_step = {n: us / steps / 1e3 for n, us in device_op_times(trace_dir).items()}
    total = sum(per_step.values())
    by_cat: dict[str, float] = collections.defaultdict(float)
    for op, ms in per_step.items():
        by_cat[category(op)] += ms
    ranked = sorted(per_step.items(), key=lambda kv: -kv[1])[:top]
    return {"device_ms_per_step": total,
            "categories": {c: {"ms": ms, "share": ms / total}
                           for c, ms in sorted(by_cat.items(), key=lambda kv: -kv[1])},
            "top": [{"op": op, "category": category(op), "ms": ms, "share": ms / total,
                     "source": sources.get(op, "")} for op, ms in ranked]}


def print_profile(title: str, prof: dict, top: int | None = None) -> None:
    print(f"\n{title}: {prof['device_ms_per_step']:.2f} ms of device ops per step")
    print(format_table([dict(category=c, **v) for c, v in prof["categories"].items()],
                       [("category", "category", ""), ("ms", "ms/step", ".2f"),
                        ("share", "share", ".1%")]))
    print(format_table(prof["top"][:top], [("op", "instruction", ""), ("category", "category", ""),
                                           ("ms", "ms/step", ".3f"), ("share", "share", ".1%"),
                                           ("source", "source", "")]))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gpt2_medium",
                   choices=("gpt2_small", "gpt2_medium", "bert_base", "t5_base"))
    p.add_argument("--impl", default="xla", help="attention_impl (xla, cudnn, chunked, ...)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq_len", type=int, default=None, help="default: GPT-2 1024, others 512")
    p.add_argument("--steps", type=int, default=3, help="profiled steps")
    p.add_argument("--top", type=int, default=25, help="instructions listed")
    p.add_argument("--out", default="/tmp/jaxformer_profile", help="trace and HLO folder")
    p.add_argument("--tiny", action="store_true", help="the tiny stand-in (CPU smoke run)")
    args = p.parse_args(argv)
    args.seq_len = args.seq_len or (1024 if args.model.startswith("gpt") else 512)
    os.makedirs(args.out, exist_ok=True)
    from accelerator import prepare  # the benchmark's step (which imports this module)

    entry = prepare(args.model, args.impl, args)
    for _ in range(3):  # compile and warm up outside the trace
        block(entry["run"]())
    report = dict(model=args.model, impl=args.impl, batch=args.batch, seq_len=args.seq_len,
                  **profile_step(entry["run"], entry["compiled"], steps=args.steps, out=args.out,
                                 name=f"{args.model}_{args.impl}", top=args.top))
    print(json.dumps(report))
    print_profile(f"{args.model} / {args.impl} ({jax.devices()[0].device_kind})", report)
    return report


if __name__ == "__main__":
    main()
