"""Where one cached decoding step goes, op by op, at several batch sizes (GPT d512 or T5 d512 of
`bench/decode.py`, float32, CPU).

One jitted greedy step (`jaxformer.decode.steps.step` + argmax, the cache donated) per batch size,
on a cache of ``--prompt_len + --new_tokens`` slots filled by a real prefill, runs round-robin under
`jax.profiler.trace`; its thunks are put in `bench/op_profile.py`'s categories (``dot``: matmuls,
``copy``: data movement such as transposes, ``reduce``, ``gather``, ``elementwise``) and summed per
category and per source (the JAX op path). ``busy ms`` is a step's mean busy time (thunks in
flight; ``wall ms`` adds the call's dispatch); ``ops ms`` and the categories sum each instruction's
share from its least disturbed profiled step, a lower bound of a step (below ``busy ms`` by what
the machine's other work and the threads' contention add). ``bytes`` and ``GFLOP`` are the step's
XLA cost analysis (deterministic: the memory traffic XLA plans, which does not depend on the
machine's load).

    PYTHONPATH=. python bench/decode_profile.py                  # batch 1, 8 and 32
    PYTHONPATH=. python bench/decode_profile.py --batch 8 --top 12
    PYTHONPATH=. python bench/decode_profile.py --model t5_d512     # the prompt is the source
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import time
from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import format_table  # noqa: E402
from decode import model_config, random_params  # noqa: E402
from op_profile import CATEGORIES, attribute, classify, parse_hlo, source, thunk_intervals  # noqa: E402

from jaxformer.decode import argmax, steps  # noqa: E402
from jaxformer.models import build_model  # noqa: E402


def compiled_step(model, params, batch: int, args) -> dict:
    """The compiled step of ``batch`` rows with its state after a prefill of random prompts."""
    prompt = jnp.asarray(np.random.default_rng(1).integers(7, model.cfg.vocab_size,
                                                           (batch, args.prompt_len)), jnp.int32)
    lengths = jnp.full((batch,), args.prompt_len, jnp.int32)
    # the cache grown to all prompt_len + new_tokens slots, as in the loop's last segment
    start = steps.start(model, params, prompt, lengths, max_new_tokens=args.new_tokens)
    state = start.grow(start.state, args.new_tokens)

    def step(p, st, tok, pos):
        logits, st = steps.step(model, p, st, tok, pos)
        return argmax(logits), st  # what greedy decoding picks with

    step.__name__ = step.__qualname__ = f"decode_step_b{batch}"
    tokens = jnp.zeros((batch,), jnp.int32)
    compiled = jax.jit(step, donate_argnums=1).lower(params, state, tokens,
                                                     start.positions).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return {"batch": batch, "compiled": compiled, "state": state, "tokens": tokens,
            "positions": start.positions, "hlo": parse_hlo(compiled.as_text()),
            "module": f"jit_{step.__name__}", "bytes": float(cost.get("bytes accessed", 0.0)),
            "flops": float(cost.get("flops", 0.0))}


def run(e: dict, params) -> float:
    t0 = time.perf_counter()
    e["tokens"], e["state"] = e["compiled"](params, e["state"], e["tokens"], e["positions"])
    e["tokens"].block_until_ready()
    return time.perf_counter() - t0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gpt_d512", choices=("gpt_d512", "t5_d512"))
    ap.add_argument("--batch", default="1,8,32")
    ap.add_argument("--prompt_len", type=int, default=16)
    ap.add_argument("--new_tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=10, help="profiled steps per batch size")
    ap.add_argument("--top", type=int, default=6, help="sources listed per batch size")
    ap.add_argument("--shapes", type=int, default=0,
                    help="also list this many (category, result shape, fused ops) groups per batch")
    args = ap.parse_args(argv)
    cfg = model_config(args.model, args.prompt_len + args.new_tokens)
    model = build_model(cfg)
    params = random_params(model)
    entries = [compiled_step(model, params, int(b), args) for b in args.batch.split(",")]
    for e in entries:
        for _ in range(3):
            run(e, params)
        e["wall"] = []
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp):
            for _ in range(args.steps):
                for e in entries:
                    e["wall"].append(run(e, params))
        intervals = thunk_intervals(glob.glob(f"{tmp}/**/*.xplane.pb", recursive=True)[0])
    rows, top, shapes = [], [], []
    for e in entries:
        ops = intervals[e["module"]]
        shares = attribute(ops)
        by_cat, by_src = defaultdict(float), defaultdict(float)
        by_shape = defaultdict(lambda: [0.0, 0, 0.0])  # ms, instructions, GFLOP per step
        for name, runs in ops.items():
            inst = e["hlo"]["instructions"].get(name, {"opcode": "?", "calls": None,
                                                       "op_name": "", "type": ""})
            category, flops, fused = classify(inst, e["hlo"])
            ms = min(shares[name]) * len(runs) / args.steps / 1e6  # least disturbed run
            by_cat[category] += ms
            g = by_shape[(category, inst["type"].split("{")[0], fused)]
            g[0], g[1], g[2] = g[0] + ms, g[1] + 1, g[2] + flops * len(runs) / args.steps / 1e9
            by_src[(category, source(inst["op_name"]) or "fwd:")] += ms
        busy = sum(sum(s) for s in shares.values()) / args.steps / 1e6  # shares sum to busy time
        row = {"batch": e["batch"], "wall_ms": 1e3 * float(np.median(e["wall"])), "busy_ms": busy,
               "ops_ms": sum(by_cat.values()), "MB": e["bytes"] / 1e6, "GFLOP": e["flops"] / 1e9}
        row.update({f"{c}_ms": by_cat.get(c, 0.0) for c in CATEGORIES})
        rows.append(row)
        top += [{"batch": e["batch"], "category": c, "source": s[:70], "ms": ms}
                for (c, s), ms in sorted(by_src.items(), key=lambda kv: -kv[1])[:args.top]]
        shapes += [{"batch": e["batch"], "category": c, "shape": t[:40], "fused": f[:40], "ms": ms,
                    "n": n, "GFLOP/s": gf / ms * 1e3 if gf and ms else None}
                   for (c, t, f), (ms, n, gf) in sorted(by_shape.items(),
                                                         key=lambda kv: -kv[1][0])[:args.shapes]]
    prefix = args.prompt_len if cfg.family == "decoder" else 1  # T5: the start token
    print(json.dumps({"benchmark": "decode_profile", "model": args.model,
                      "prompt_len": args.prompt_len, "cache_slots": prefix + args.new_tokens,
                      "rows": rows, "top": top, "shapes": shapes}))
    print(format_table(rows, [("batch", "B", "d"), ("wall_ms", "wall ms", ".2f"),
                              ("busy_ms", "busy ms", ".2f"), ("ops_ms", "ops ms", ".2f"),
                              ("dot_ms", "dot", ".2f"),
                              ("copy_ms", "copy", ".2f"), ("reduce_ms", "reduce", ".2f"),
                              ("elementwise_ms", "elementwise", ".2f"), ("MB", "MB accessed", ".1f"),
                              ("GFLOP", "GFLOP", ".2f")]))
    print(format_table(top, [("batch", "B", "d"), ("category", "category", "s"),
                             ("source", "source", "s"), ("ms", "ms", ".3f")]))
    if shapes:
        print(format_table(shapes, [("batch", "B", "d"), ("category", "category", "s"),
                                    ("shape", "result", "s"), ("fused", "fused ops", "s"),
                                    ("n", "n", "d"), ("ms", "ms", ".3f"),
                                    ("GFLOP/s", "GFLOP/s", ".1f")]))


if __name__ == "__main__":
    main()
