"""Dropout masks from each `jax.random` implementation (``dropout_prng``): the compiled train step's
cost and its CPU step time, measured round-robin in one run.

For threefry2x32 (jax's default), rbg and unsafe_rbg:

* ``cpu``: the trainer's own step (`jaxformer.train.step.make_train_step`, objective ``mlm``,
  dropout 0.1 on the residual, attention and FFN) of a small BERT compiled for this host: XLA's
  bytes accessed and FLOPs (`cost_analysis`, deterministic), then the step time of the three
  programs, one step of each per round (the machine's load is shared alike), and each median as a
  ratio of threefry's;
* ``--topology v5p:2x2x1``: the same for a preset's one-layer unrolled step compiled by libtpu
  (`jaxformer.compile.compile_report`, `bench/fits.py`'s cell: 4 rows a chip, fsdp over the slice):
  its bytes per chip and FLOPs (nothing runs).

    python bench/dropout_prng.py                                  # CPU: cost and time
    python bench/dropout_prng.py --topology v5p:2x2x1 --preset bert_base_bf16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")


def cpu_rows(args) -> list[dict]:
    import dataclasses

    import jax
    import numpy as np
    import optax
    from common import compile_seconds, round_robin_times

    from jaxformer.config import ModelConfig
    from jaxformer.models import build_model
    from jaxformer.models.presets import preset
    from jaxformer.objectives import bind_objective
    from jaxformer.train.config import base_config, train_settings
    from jaxformer.train.config.schema import ObjectiveSettings
    from jaxformer.train.state import TrainState
    from jaxformer.train.step import make_train_step
    from jaxformer.vocab import SpecialTokens

    cfg = ModelConfig.from_dict(preset(
        "bert_tiny", vocab_size=args.vocab, d_model=args.d_model, num_heads=args.d_model // 64,
        d_ff=4 * args.d_model, num_layers=args.layers, max_len=args.seq_len, dropout_rate=0.1,
        attention_dropout_rate=0.1))
    model = build_model(cfg)
    params = model.init(jax.random.key(0))
    tx = optax.adamw(1e-4)
    state = TrainState(step=jax.numpy.int32(0), params=params, opt_state=tx.init(params),
                       rng=jax.random.key_data(jax.random.key(1)))
    tokens = np.random.default_rng(0).integers(10, args.vocab, (args.batch, args.seq_len))
    batch = {"inputs": tokens.astype(np.int32)}
    prepare = bind_objective("mlm", None, SpecialTokens(args.vocab))
    rows, calls = [], {}
    for impl in IMPLS:
        run = dataclasses.replace(train_settings(base_config(), cfg), dropout_prng=impl)
        step = jax.jit(make_train_step(model, tx, prepare, lambda s: 1e-4, run=run,
                                       objective=ObjectiveSettings(
                                           vocab_block_size=args.vocab_block_size)))
        compiled, seconds = compile_seconds(step, state, batch)
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        rows.append({"impl": impl, "bytes": float(cost["bytes accessed"]),
                     "flops": float(cost["flops"]), "compile_s": seconds})
        calls[impl] = lambda c=compiled: c(state, batch)[1]["loss"]
    for f in calls.values():  # one untimed run each
        jax.block_until_ready(f())
    times = round_robin_times(calls, args.rounds)
    for r in rows:
        r["step_s"] = statistics.median(times[r["impl"]])
    ref = rows[0]
    for r in rows:
        r["bytes_vs_threefry"] = r["bytes"] / ref["bytes"]
        r["flops_vs_threefry"] = r["flops"] / ref["flops"]
        r["time_vs_threefry"] = r["step_s"] / ref["step_s"]
    return rows


def tpu_rows(args) -> list[dict]:
    from fits import cell_config

    from jaxformer.compile import compile_report
    from jaxformer.parallel.topology import parse_topology

    topo = parse_topology(args.topology)
    rows = []
    for impl in IMPLS:
        c = cell_config(args.preset, topo.num_chips, (f"dropout_prng={impl}",))
        c.model.scan_layers, c.model.num_layers = False, 1
        r = compile_report(c, topo)
        rows.append({"impl": impl, "bytes": r["xla"]["bytes"], "flops": r["xla"].get("flops"),
                     "compile_s": r["compile_s"]})
    for r in rows:
        r["bytes_vs_threefry"] = r["bytes"] / rows[0]["bytes"]
    return rows


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--topology", default="", help="compile for this TPU slice instead (nothing runs)")
    p.add_argument("--preset", default="bert_base_bf16", help="with --topology")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--d_model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--vocab_block_size", type=int, default=8192)
    p.add_argument("--rounds", type=int, default=10, help="timed steps of each implementation")
    args = p.parse_args(argv)
    if args.topology:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        rows = tpu_rows(args)
        cols = [("impl", "dropout_prng", "s"), ("bytes", "bytes/chip", ".4g"),
                ("bytes_vs_threefry", "vs threefry", ".3f"), ("flops", "flops", ".4g")]
    else:
        from jaxformer.host import skip_absent_tpu

        skip_absent_tpu()
        rows = cpu_rows(args)
        cols = [("impl", "dropout_prng", "s"), ("bytes", "bytes", ".4g"),
                ("bytes_vs_threefry", "vs threefry", ".3f"), ("flops", "flops", ".4g"),
                ("flops_vs_threefry", "vs threefry", ".3f"), ("step_s", "step s", ".4f"),
                ("time_vs_threefry", "time vs threefry", ".3f")]
    from common import format_table

    print(json.dumps({"args": vars(args), "rows": rows}))
    print(format_table(rows, cols))
    return rows


if __name__ == "__main__":
    main()
