"""Where the train step's time goes, op by op: jaxformer against Hugging Face Flax, same run.

Both systems' compiled steps (`bench/train_families.py`'s ``jitted_step``, same sizes, same loss
and optimizer) run round-robin under `jax.profiler.trace`; XLA:CPU records one event per executed
thunk (one per fusion, dot, copy, ...), named after its HLO instruction. Each instruction is put in
a category from its optimised HLO (`compiled.as_text()`):

* ``dot``: the instruction is or fuses a ``dot`` / ``convolution`` (matmuls, with whatever
  elementwise or reduction work XLA fused into them); its FLOPs (``2·M·N·K``) give GFLOP/s;
* ``copy``: pure data movement (``copy``, ``transpose``, ``concatenate``, slices, pads, ...);
* ``reduce``: fuses a ``reduce`` (norms, softmax statistics, bias gradients, the loss);
* ``gather``: fuses a ``gather`` / ``scatter`` (embedding lookup and its gradient);
* ``elementwise``: every other fusion (activations, residual adds, AdamW);
* ``other``: anything else (``while``, custom calls, ...).

The tables give milliseconds per step by category and the top instructions by time, each with its
source (the JAX op path from the HLO metadata, layer numbers folded to ``#``) so that the same piece
of the model can be found in both systems; ``--by shape`` sets the two systems side by side per
(category, result shape, fused opcodes). A thunk runs from its start to its ``end:`` event
(asynchronous ones, such as Eigen dots, finish on another thread), and XLA:CPU runs independent
thunks at once, so spans overlap: ``ms`` is each instruction's share of the wall time (an instant
with n thunks in flight counts 1/n for each; the shares add up to the step's busy time), from its
least disturbed profiled run (the smallest, against other processes on a shared machine);
``span ms`` sums the start-to-finish spans.

    .venv-peers/bin/python bench/op_profile.py --family t5 --steps 2
    .venv-peers/bin/python bench/op_profile.py --family gpt --top 25 --by source
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import sys
import tempfile
import time
from collections import defaultdict

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import block, format_table  # noqa: E402
from peer_models import hf_flax_apply, jaxformer_apply, make_batch, model_config  # noqa: E402
from train_families import LR, WEIGHT_DECAY, jitted_step  # noqa: E402

from jaxformer.models import build_model  # noqa: E402

CATEGORIES = ("dot", "copy", "reduce", "gather", "elementwise", "other")
MOVEMENT = {"parameter", "constant", "copy", "transpose", "bitcast", "reshape", "broadcast", "slice",
            "dynamic-slice", "dynamic-update-slice", "concatenate", "pad", "reverse", "tuple",
            "get-tuple-element", "iota", "convert"}
INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\([^=]*?\)|\S+) ([\w\-]+)\((.*)$")
COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.\-]+) \(")


def dims(type_str: str) -> list[int]:
    """The dimensions of an HLO array type such as ``f32[8,256,512]{2,1,0}``."""
    m = re.search(r"\[([\d,]*)\]", type_str)
    return [int(d) for d in m.group(1).split(",") if d] if m else []


def parse_hlo(text: str) -> dict[str, dict]:
    """Every instruction of an optimised HLO module: name -> opcode, type, the computation it
    calls, its metadata ``op_name`` and, for a dot, its FLOPs; plus per computation the opcodes."""
    comps: dict[str, list[dict]] = {}
    current = None
    for line in text.splitlines():
        head = COMPUTATION.match(line)
        if head:
            current = comps.setdefault(head.group(1), [])
            continue
        m = INSTRUCTION.match(line)
        if m and current is not None:
            name, type_str, opcode, rest = m.groups()
            calls = re.search(r"calls=%([\w.\-]+)", rest)
            op_name = re.search(r'op_name="([^"]*)"', rest)
            current.append({"name": name, "type": type_str, "opcode": opcode, "rest": rest,
                            "calls": calls.group(1) if calls else None,
                            "op_name": op_name.group(1) if op_name else ""})
    for body in comps.values():
        types = {i["name"]: i["type"] for i in body}
        for i in body:
            if i["opcode"] in ("dot", "convolution"):
                lhs = re.match(r"%([\w.\-]+)", i["rest"])
                contract = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", i["rest"])
                lhs_dims = dims(types.get(lhs.group(1), "")) if lhs else []
                k = math.prod(lhs_dims[int(d)] for d in contract.group(1).split(",") if d) \
                    if contract and lhs_dims else 1
                i["flops"] = 2.0 * math.prod(dims(i["type"])) * k
                i["k"] = k
    return {"computations": comps,
            "instructions": {i["name"]: i for body in comps.values() for i in body}}


def classify(inst: dict, hlo: dict) -> tuple[str, float, str]:
    """(category, dot FLOPs, summary of the fused opcodes) of one instruction."""
    body = hlo["computations"].get(inst["calls"], []) if inst["calls"] else [inst]
    opcodes = {i["opcode"] for i in body}
    flops = sum(i.get("flops", 0.0) for i in body)
    summary = ",".join(sorted(opcodes - {"parameter", "constant", "bitcast", "broadcast"}))[:60]
    if opcodes & {"dot", "convolution"}:
        ks = sorted({i["k"] for i in body if "k" in i})
        return "dot", flops, summary + " k=" + "/".join(map(str, ks))
    if inst["opcode"] not in ("fusion",) and inst["calls"]:
        return "other", 0.0, inst["opcode"]
    if opcodes & {"gather", "scatter"}:
        return "gather", 0.0, summary
    if "reduce" in opcodes or "reduce-window" in opcodes:
        return "reduce", 0.0, summary
    if opcodes <= MOVEMENT:
        return "copy", 0.0, summary
    if inst["opcode"] == "fusion" or opcodes - MOVEMENT:
        return "elementwise", 0.0, summary
    return "other", 0.0, summary


def source(op_name: str) -> str:
    """A readable source path: ``bwd:``/``fwd:`` + the op path without jit/jvp wrappers, layer
    numbers folded (``h/3/attn`` -> ``h/#/attn``, ``blocks_3`` -> ``blocks_#``)."""
    backward = "transpose(" in op_name
    path = re.sub(r"\b(jit|jvp|transpose|pjit|remat|checkpoint|vmap)\(", "", op_name)
    path = re.sub(r"[()]", "", path)
    path = re.sub(r"(?<=[_/])\d+(?=/|$)", "#", path)
    return ("bwd:" if backward else "fwd:") + "/".join(path.split("/")[1:])


def thunk_intervals(xplane_path: str) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """module name -> instruction name -> (start, end) nanoseconds of each of its thunk runs.

    A thunk's event covers its launch; an asynchronous one (an Eigen dot, ...) finishes later, on
    another thread, where the executor records ``end: <name>``. A run lasts from its start to the
    first ``end:`` of the same name after it (or to its event's own end, if later): steps run one
    after another, so every run of a name ends before the next one starts."""
    starts, ends = defaultdict(list), defaultdict(list)
    for plane in jax.profiler.ProfileData.from_file(xplane_path).planes:
        for line in plane.lines:
            for event in line.events:
                if event.name.startswith("end: "):
                    ends[event.name[5:]].append(event.start_ns + event.duration_ns)
                    continue
                stats = dict(event.stats)
                if "hlo_module" in stats and "hlo_op" in stats:
                    starts[stats["hlo_op"]].append((event.start_ns, event.duration_ns,
                                                    stats["hlo_module"]))
    out: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for op, runs in starts.items():
        runs.sort()
        done = sorted(ends.get(op, []))
        for i, (t0, duration, module) in enumerate(runs):
            t_next = runs[i + 1][0] if i + 1 < len(runs) else math.inf
            finished = [t for t in done if t0 <= t < t_next]
            out[module][op].append((t0, max(t0 + duration, finished[0] if finished else 0.0)))
    return out


def attribute(intervals: dict[str, list[tuple[float, float]]]) -> dict[str, list[float]]:
    """Wall time shared out among the instructions running at each instant (an interval with n
    thunks in flight gives each 1/n of it): op -> nanoseconds per run, summing to the busy time."""
    points = sorted({t for runs in intervals.values() for run in runs for t in run})
    index = {t: i for i, t in enumerate(points)}
    share = [0.0] * len(points)
    for runs in intervals.values():
        for t0, t1 in runs:
            for i in range(index[t0], index[t1]):
                share[i] += 1
    return {op: [sum((points[i + 1] - points[i]) / share[i] for i in range(index[t0], index[t1]))
                 for t0, t1 in runs] for op, runs in intervals.items()}


def prepare(family: str, args) -> list[dict]:
    """The compiled steps (jaxformer, hf-flax) of ``family`` with their state and parsed HLO."""
    cfg = model_config(family, args)
    batch = {k: jnp.asarray(v) for k, v in make_batch(family, cfg, args).items()}
    model = build_model(cfg)
    init_args = ((batch["inputs"], batch["targets"]) if family == "t5"
                 else (batch["tokens"][:, : args.seq_len],))
    systems = [("jaxformer", jaxformer_apply(family, model),
                jax.jit(model.init)(jax.random.key(0), *init_args))]
    hf = hf_flax_apply(family, cfg)
    if hf is not None:
        systems.append(("hf-flax", *hf))
    entries = []
    for name, apply, params in systems:
        tx = optax.adamw(LR, weight_decay=WEIGHT_DECAY)
        step_name = "step_" + name.replace("-", "_")
        compiled = jitted_step(family, apply, tx, step_name).lower(
            params, jax.eval_shape(tx.init, params), batch).compile()
        entries.append({"system": name, "module": "jit_" + step_name, "compiled": compiled,
                        "state": [params, jax.jit(tx.init)(params)], "batch": batch,
                        "hlo": parse_hlo(compiled.as_text())})
    return entries


def run_step(e: dict) -> float:
    t0 = time.perf_counter()
    e["state"][0], e["state"][1], loss = e["compiled"](*e["state"], e["batch"])
    block(loss)
    return time.perf_counter() - t0


def profile(entries: list[dict], steps: int) -> None:
    """Round-robin ``steps`` profiled steps of every entry; fills ``wall_s`` and ``ops``."""
    for e in entries:
        run_step(e)
        e["wall"] = []
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp):
            for _ in range(steps):
                for e in entries:
                    e["wall"].append(run_step(e))
        intervals = thunk_intervals(glob.glob(f"{tmp}/**/*.xplane.pb", recursive=True)[0])
    for e in entries:
        e["wall_ms"] = 1e3 * sorted(e["wall"])[len(e["wall"]) // 2]
        e["ops"] = []
        shares = attribute(intervals[e["module"]])
        for name, runs in intervals[e["module"]].items():
            inst = e["hlo"]["instructions"].get(name, {"opcode": "?", "calls": None, "op_name": "",
                                                       "type": ""})
            category, flops, summary = classify(inst, e["hlo"])
            # ms: its share of the wall time, the least disturbed run (the smallest) times runs per
            # step; span_ms: start to finish of that run (concurrent thunks overlap)
            e["ops"].append({"system": e["system"], "name": name,
                             "ms": min(shares[name]) * len(runs) / steps / 1e6,
                             "span_ms": min(t1 - t0 for t0, t1 in runs) * len(runs) / steps / 1e6,
                             "category": category, "gflop": flops / 1e9, "fused": summary,
                             "shape": inst["type"].split("{")[0][:40],
                             "source": source(inst["op_name"])})


def category_rows(e: dict) -> list[dict]:
    total = sum(o["ms"] for o in e["ops"])
    rows = []
    span_total = sum(o["span_ms"] for o in e["ops"])
    for c in CATEGORIES:
        ops = [o for o in e["ops"] if o["category"] == c]
        ms = sum(o["ms"] for o in ops)
        gflop = sum(o["gflop"] for o in ops)
        rows.append({"system": e["system"], "category": c, "ops": len(ops), "ms": ms,
                     "share": ms / total if total else 0.0, "gflop": gflop,
                     "gflops": gflop / ms * 1e3 if ms and gflop else None})
    gflop = sum(o["gflop"] for o in e["ops"])
    rows.append({"system": e["system"], "category": "all ops", "ops": len(e["ops"]), "ms": total,
                 "share": 1.0, "gflop": gflop, "wall_ms": e["wall_ms"], "span_ms": span_total})
    return rows


def by_source(ops: list[dict]) -> list[dict]:
    """Ops summed per (category, source path)."""
    groups: dict[tuple, dict] = {}
    for o in ops:
        g = groups.setdefault((o["system"], o["category"], o["source"]),
                              {"system": o["system"], "category": o["category"],
                               "source": o["source"], "ms": 0.0, "n": 0, "gflop": 0.0})
        g["ms"] += o["ms"]
        g["n"] += 1
        g["gflop"] += o["gflop"]
    return list(groups.values())


def by_shape(entries: list[dict]) -> list[dict]:
    """Ops of every system summed per (category, result shape, fused opcodes): the same piece of
    work side by side, ``ms:<system>`` and ``n:<system>`` per system, largest difference first."""
    groups: dict[tuple, dict] = {}
    for e in entries:
        for o in e["ops"]:
            g = groups.setdefault((o["category"], o["shape"], o["fused"]),
                                  {"category": o["category"], "shape": o["shape"], "fused": o["fused"]})
            g[f"ms:{e['system']}"] = g.get(f"ms:{e['system']}", 0.0) + o["ms"]
            g[f"n:{e['system']}"] = g.get(f"n:{e['system']}", 0) + 1
    names = [e["system"] for e in entries]
    for g in groups.values():
        g["diff"] = g.get(f"ms:{names[0]}", 0.0) - g.get(f"ms:{names[-1]}", 0.0)
    return sorted(groups.values(), key=lambda g: -abs(g["diff"]))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--family", default="gpt", choices=("gpt", "bert", "t5"))
    p.add_argument("--steps", type=int, default=2, help="profiled steps per system")
    p.add_argument("--top", type=int, default=20, help="instructions (or sources) listed per system")
    p.add_argument("--by", default="op", choices=("op", "source", "shape"),
                   help="list single instructions, sums per source path, or sums per (category, "
                        "shape, fused ops) side by side with the largest differences first")
    for flag, default in (("batch", 8), ("seq_len", 256), ("target_len", 64), ("d_model", 512),
                          ("layers", 6), ("heads", 8), ("d_ff", 2048), ("vocab", 8192)):
        p.add_argument(f"--{flag}", type=int, default=default)
    args = p.parse_args(argv)
    entries = prepare(args.family, args)
    profile(entries, args.steps)
    categories = [r for e in entries for r in category_rows(e)]
    listed = []
    for e in entries if args.by != "shape" else []:
        ops = e["ops"] if args.by == "op" else by_source(e["ops"])
        listed += sorted(ops, key=lambda o: -o["ms"])[: args.top]
    if args.by == "shape":
        listed = by_shape(entries)[: args.top]
    report = {"benchmark": "op_profile", "family": args.family, "jax": jax.__version__,
              "steps": args.steps, "categories": categories, "top": listed,
              "ops": [o for e in entries for o in e["ops"]]}
    print(json.dumps(report))
    print(f"\n{args.family}: ms per step by category (ops ms: each op's share of the wall time, "
          "least disturbed run; span ms: start-to-finish sums; wall: median step time)")
    print(format_table(categories, [
        ("system", "system", ""), ("category", "category", ""), ("ops", "ops", "d"),
        ("ms", "ops ms", ".1f"), ("share", "share", ".1%"), ("gflop", "GFLOP", ".1f"),
        ("gflops", "GFLOP/s", ".1f"), ("span_ms", "span ms", ".1f"), ("wall_ms", "wall ms", ".1f")]))
    cols = {"op": [("system", "system", ""), ("ms", "ms", ".2f"), ("category", "category", ""),
                   ("name", "instruction", ""), ("shape", "shape", ""), ("fused", "fused ops", ""),
                   ("source", "source", "")],
            "source": [("system", "system", ""), ("ms", "ms", ".2f"), ("n", "ops", "d"),
                       ("category", "category", ""), ("source", "source", "")],
            "shape": [("category", "category", ""), ("shape", "shape", ""), ("fused", "fused ops", "")]
            + [(f"{k}:{e['system']}", f"{k} {e['system']}", f) for e in entries
               for k, f in (("n", "d"), ("ms", ".1f"))] + [("diff", "diff ms", "+.1f")]}[args.by]
    print(f"\ntop {args.top} by time" + (" difference" if args.by == "shape" else " per system"))
    print(format_table([dict(r, source=r.get("source", "")[-90:]) for r in listed], cols))
    return report


if __name__ == "__main__":
    main()
