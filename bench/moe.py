"""MoE step against the dense step at equal active FLOPs, on this machine, same run, round-robin.

Two tables (`jaxformer.ops.moe`):

* **Train step** (forward + backward + SGD update, jitted) of a Llama-style decoder: dense (FFN
  width F) against MoE variants whose tokens each run F hidden units — 8 experts of width F with
  k = 1, or 8 of width F/2 with k = 2 — on the capacity path (factor 1.25) and the dropless path
  (`jax.lax.ragged_dot`). ``ratio`` = step time / the dense step's (same round-robin rounds).
* **Where the MoE FFN's time goes**: the FFN sublayer alone (forward + backward of `[B, L, D]`) in
  pieces — router (logits, top-k, losses), dispatch + combine with identity experts (capacity:
  GShard's one-hot einsums; dropless: sort, gather, scatter), the experts' matmuls (capacity:
  batched over `[G, E, C]` slots; dropless: grouped matmuls over the sorted assignments), the
  whole layer — against the dense FFN.

Timings: median of ``--steps`` calls per variant, variants interleaved call by call, so that the
shared machine's load shifts hit every variant alike. The active-FLOP accounting counts the
experts' matmuls only where assignments exist (capacity slots run even when empty: C·E ≥ L·k).

    python bench/moe.py                    # JSON to stdout and bench/results/moe.json, tables
    python bench/moe.py --steps 5 --d_model 128
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import block, format_table, machine  # noqa: E402

from jaxformer.config import ModelConfig  # noqa: E402
from jaxformer.models import build_model  # noqa: E402
from jaxformer.models.presets import preset  # noqa: E402
from jaxformer.ops import moe  # noqa: E402
from jaxformer.ops.ffn import ffn  # noqa: E402


def round_robin(fns: dict, steps: int) -> dict[str, float]:
    """Median seconds per call of each ``fns[name]()`` (compiled and warmed first), interleaved."""
    for f in fns.values():
        block(f())
        block(f())
    times = {k: [] for k in fns}
    for _ in range(steps):
        for k, f in fns.items():
            t0 = time.perf_counter()
            block(f())
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def step_variants(args) -> dict[str, ModelConfig]:
    f = args.d_ff
    base = preset("llama_tiny", vocab_size=1024, d_model=args.d_model, num_heads=4, num_kv_heads=2,
                  d_ff=f, num_layers=args.layers, max_len=args.seq_len)
    moe8 = dict(num_experts=8, capacity_factor=1.25)
    return {
        "dense": ModelConfig.from_dict(base),
        "E8 k1 capacity": ModelConfig.from_dict(dict(base, **moe8, experts_per_token=1)),
        "E8 k1 dropless": ModelConfig.from_dict(dict(base, **moe8, experts_per_token=1,
                                                     moe_dropless=True)),
        "E8 k2 F/2 capacity": ModelConfig.from_dict(dict(base, **moe8, experts_per_token=2,
                                                         moe_d_ff=f // 2)),
        "E8 k2 F/2 dropless": ModelConfig.from_dict(dict(base, **moe8, experts_per_token=2,
                                                         moe_d_ff=f // 2, moe_dropless=True)),
    }


def train_step(cfg: ModelConfig, tokens):
    model = build_model(cfg)
    params = model.init(jax.random.key(0))

    def loss(p):
        logits, stats = model.apply(p, tokens, router_stats=True)
        ce = -jnp.mean(jax.nn.log_softmax(logits[:, :-1]).max(-1))
        return ce + (0.0 if stats is None else 0.01 * stats.aux_loss)

    @jax.jit
    def step(p):
        g = jax.grad(loss)(p)
        return jax.tree.map(lambda a, b: a - 1e-3 * b, p, g)

    return lambda: step(params)


def layer_pieces(args) -> dict:
    """FFN-sublayer pieces (forward + backward) on `[B, L, D]`, k = 1, E = 8, capacity 1.25."""
    b, length, d, f, e = args.batch, args.seq_len, args.d_model, args.d_ff, 8
    keys = jax.random.split(jax.random.key(1), 6)
    x = jax.random.normal(keys[0], (b, length, d))
    dense_p = {"wi": {"kernel": 0.02 * jax.random.normal(keys[1], (d, f))},
               "wi_gate": {"kernel": 0.02 * jax.random.normal(keys[2], (d, f))},
               "wo": {"kernel": 0.02 * jax.random.normal(keys[3], (f, d))}}
    experts = jax.tree.map(lambda a: jnp.broadcast_to(a, (e, *a.shape)), dense_p)
    params = {"router": {"kernel": 0.02 * jax.random.normal(keys[4], (d, e))}, **experts}
    kw = dict(experts_per_token=1, capacity_factor=1.25, activation="silu", norm_topk_prob=False)
    cap = moe.expert_capacity(length, 1, e, 1.25)

    def routed(p, x):
        logits = moe.router_logits(p["router"]["kernel"], x)
        gates, idx, probs = moe.top_k_gates(logits, 1, norm_topk_prob=False)
        return gates, idx, moe.load_balancing_loss(probs, idx) + moe.router_z_loss(logits)

    def router_only(p, x):
        gates, _, loss = routed(p, x)
        return jnp.sum(gates) + loss

    def dispatch_capacity(p, x):  # identity experts
        gates, idx, _ = routed(p, x)
        pos = moe.positions_in_expert(idx, e)
        disp, comb, _ = moe.dispatch_and_combine(gates, idx, pos, e, cap)
        slots = jnp.einsum("gtec,gtd->gecd", disp, x)
        return jnp.sum(jnp.einsum("gtec,gecd->gtd", comb, slots) ** 2)

    def dispatch_dropless(p, x):  # identity experts
        gates, idx, _ = routed(p, x)
        order = jnp.argsort(idx.reshape(-1), stable=True)
        xs = x.reshape(-1, d)[order]
        back = jnp.zeros_like(xs).at[order].set(xs, unique_indices=True)
        return jnp.sum((back.reshape(b, length, d) * gates) ** 2)

    slots_x = jax.random.normal(keys[5], (b, e, cap, d))
    sorted_x = x.reshape(-1, d)
    sizes = jnp.full((e,), b * length // e, jnp.int32)
    expert_of = jnp.repeat(jnp.arange(e), b * length // e)

    pieces = {
        "dense FFN": (lambda p, x: jnp.sum(ffn(dense_p, x, activation="silu") ** 2), dense_p, x),
        "router": (router_only, params, x),
        "dispatch+combine, capacity": (dispatch_capacity, params, x),
        "dispatch+combine, dropless": (dispatch_dropless, params, x),
        "experts, capacity slots": (lambda p, s: jnp.sum(moe.expert_ffns(p, s, activation="silu") ** 2),
                                    experts, slots_x),
        "experts, grouped matmul": (lambda p, s: jnp.sum(moe.grouped_ffn(
            p, s, expert_of, sizes, activation="silu") ** 2), experts, sorted_x),
        "MoE layer, capacity": (lambda p, x: jnp.sum(moe.moe_ffn(p, x, dropless=False, **kw)[0] ** 2),
                                params, x),
        "MoE layer, dropless": (lambda p, x: jnp.sum(moe.moe_ffn(p, x, dropless=True, **kw)[0] ** 2),
                                params, x),
    }
    out = {}
    for name, (fn, p, arg) in pieces.items():
        g = jax.jit(jax.grad(fn, argnums=(0, 1)))
        out[name] = (lambda g=g, p=p, arg=arg: g(p, arg))
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--d_model", type=int, default=128)
    ap.add_argument("--d_ff", type=int, default=512)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq_len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "moe.json"))
    args = ap.parse_args(argv)
    tokens = jax.random.randint(jax.random.key(2), (args.batch, args.seq_len), 3, 1024)
    steps = round_robin({k: train_step(c, tokens) for k, c in step_variants(args).items()},
                        args.steps)
    pieces = round_robin(layer_pieces(args), args.steps)
    result = {"machine": machine(), "args": vars(args),
              "train_step": [{"variant": k, "ms": 1e3 * v, "ratio": v / steps["dense"]}
                             for k, v in steps.items()],
              "ffn_pieces": [{"piece": k, "ms": 1e3 * v, "ratio": v / pieces["dense FFN"]}
                             for k, v in pieces.items()]}
    print(json.dumps(result))
    cols = [("variant", "train step", "s"), ("ms", "ms", ".1f"), ("ratio", "/ dense", ".2f")]
    print(format_table(result["train_step"], cols))
    cols[0] = ("piece", "FFN sublayer piece (fwd+bwd)", "s")
    print(format_table(result["ffn_pieces"], cols))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    return result


if __name__ == "__main__":
    main()
