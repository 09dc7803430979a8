"""XLA's own cost of the train step (no timing): bytes accessed, FLOPs, dots and temporary memory
of the compiled jaxformer and Hugging Face Flax steps of `bench/train_families.py`, same sizes.

Timings on the shared machines swing by ±30%; these figures are deterministic for a given jax and
XLA build, so they show the effect of a change in the model's program on its own. ``bytes`` is the
compiled executable's `cost_analysis()` "bytes accessed" (every fusion's operands and results:
the memory traffic XLA:CPU plans), ``dots`` the dot instructions in the optimised HLO (one per
matmul; fused projections lower it), ``temp MiB`` the temporary buffer (`memory_analysis`).

    .venv-peers/bin/python bench/step_cost.py                  # GPT, BERT and T5, forward + step
    .venv-peers/bin/python bench/step_cost.py --families gpt
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import format_table  # noqa: E402
from peer_models import hf_flax_apply, jaxformer_apply, make_batch, mean_loss, model_config  # noqa: E402
from train_families import LR, WEIGHT_DECAY, jitted_step  # noqa: E402

from jaxformer.models import build_model  # noqa: E402


def compiled_cost(compiled) -> dict:
    """``bytes``, ``flops``, ``dots`` and ``temp_mib`` of a compiled executable."""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    mem = compiled.memory_analysis()
    return {"bytes": float(cost.get("bytes accessed", 0.0)), "flops": float(cost.get("flops", 0.0)),
            "dots": len(re.findall(r"= \S+ dot\(", compiled.as_text())),
            "temp_mib": mem.temp_size_in_bytes / 2**20 if mem is not None else None}


def system_costs(family: str, name: str, apply, params, batch) -> list[dict]:
    """Rows (forward loss; forward + backward + AdamW step) of one system."""
    forward = jax.jit(lambda p, b: mean_loss(family, apply(p, b), b))
    tx = optax.adamw(LR, weight_decay=WEIGHT_DECAY)
    step = jitted_step(family, apply, tx)
    opt_state = jax.eval_shape(tx.init, params)
    rows = []
    for part, fn, args in (("forward", forward, (params, batch)),
                           ("step", step, (params, opt_state, batch))):
        rows.append({"family": family, "system": name, "part": part,
                     **compiled_cost(fn.lower(*args).compile())})
    return rows


def family_costs(family: str, args) -> list[dict]:
    cfg = model_config(family, args)
    batch = {k: jnp.asarray(v) for k, v in make_batch(family, cfg, args).items()}
    model = build_model(cfg)
    params = model.abstract()
    rows = system_costs(family, "jaxformer", jaxformer_apply(family, model), params, batch)
    hf = hf_flax_apply(family, cfg)
    if hf is not None:
        peer = system_costs(family, "hf-flax", hf[0], hf[1], batch)
        for ours, theirs in zip(rows, peer):
            ours["bytes_vs_hf"] = ours["bytes"] / theirs["bytes"]
        rows += peer
    return rows


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--families", default="gpt,bert,t5")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq_len", type=int, default=256)
    p.add_argument("--target_len", type=int, default=64)
    p.add_argument("--d_model", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--d_ff", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=8192)
    args = p.parse_args(argv)
    rows = [r for family in args.families.split(",") for r in family_costs(family, args)]
    for r in rows:
        r["mbytes"] = r["bytes"] / 1e6
        r["gflops"] = r["flops"] / 1e9
    print(json.dumps({"benchmark": "step_cost", "jax": jax.__version__, "results": rows}))
    print(format_table(rows, [
        ("family", "family", ""), ("system", "system", ""), ("part", "part", ""),
        ("mbytes", "MB accessed", ".1f"), ("bytes_vs_hf", "vs hf-flax", ".3f"),
        ("gflops", "GFLOP", ".2f"), ("dots", "dots", "d"), ("temp_mib", "temp MiB", ".0f")]))
    return rows


if __name__ == "__main__":
    main()
