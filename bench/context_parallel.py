"""Train-step time of context parallelism (``mesh.context=8``, ring attention) against data
parallelism (``mesh.data=8``) at equal tokens, on 8 simulated CPU devices, timed round-robin.

    python bench/context_parallel.py --seq_len 2048 --steps 5

The same GPT (learned positions, float32, dropout off) and the same global batch (``--batch`` rows
of ``--seq_len`` tokens): ``data=8`` gives each device whole rows and computes each row's full
`[L, L]` causal attention; ``context=8`` gives each device 1/8 of every row in zig-zag order and
computes ``1 + 7/2`` unmasked `[L/8, L/8]` blocks per row, passing keys/values around the ring.
Both steps are compiled first, then run one step each per round (`common.round_robin_times`), so
that both see the same machine load. Prints JSON lines and a table; the losses of the first step
must agree (same model, same batch).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import block, round_robin_times  # noqa: E402

from jaxformer.config import ModelConfig  # noqa: E402
from jaxformer.models import build_model  # noqa: E402
from jaxformer.models.presets import preset  # noqa: E402
from jaxformer.objectives import bind_objective  # noqa: E402
from jaxformer.parallel.mesh import make_mesh  # noqa: E402
from jaxformer.parallel.partition import sharded_jit  # noqa: E402
from jaxformer.parallel.rules import batch_sharding  # noqa: E402
from jaxformer.train.optim import make_optimizer, optimizer_settings  # noqa: E402
from jaxformer.train.state import create_train_state  # noqa: E402
from jaxformer.train.step import make_train_step  # noqa: E402
from jaxformer.vocab import SpecialTokens  # noqa: E402


def build(mesh_axes: dict, a) -> tuple:
    """(compiled step, state, batch) on ``mesh_axes``."""
    cfg = ModelConfig.from_dict(preset(
        "gpt_tiny", vocab_size=1024, d_model=a.d_model, num_heads=a.heads, d_ff=4 * a.d_model,
        num_layers=a.layers, max_len=a.seq_len, dropout_rate=0.0, attention_dropout_rate=0.0,
        ffn_dropout_rate=0.0))
    model = build_model(cfg)
    tx, schedule = make_optimizer(optimizer_settings("gpt3", peak_lr=1e-3, warmup_steps=1),
                                  cfg.d_model, 100)
    prepare = bind_objective("clm", None, SpecialTokens(cfg.vocab_size))
    mesh = make_mesh(mesh_axes)
    state, shardings = create_train_state(model, tx, mesh, seed=0)
    tokens = np.random.default_rng(0).integers(7, 1024, (a.batch, a.seq_len)).astype(np.int32)
    batch = {"inputs": jax.device_put(tokens, batch_sharding(mesh, 2))}
    step = sharded_jit(make_train_step(model, tx, prepare, schedule), mesh,
                       in_shardings=(shardings, None), out_shardings=(shardings, None))
    compiled = step.lower(state, batch).compile()
    return compiled, state, batch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seq_len", type=int, default=2048)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--d_model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    a = p.parse_args()
    runs = {name: build(axes, a) for name, axes in
            (("data=8", {"data": 8}), ("context=8", {"data": 1, "context": 8}))}
    # the state is not donated (no donate_argnums): every call starts from the same state
    calls = {name: (lambda c=c, s=s, b=b: c(s, b)[1]["loss"]) for name, (c, s, b) in runs.items()}
    losses = {name: float(block(f())) for name, f in calls.items()}
    times = round_robin_times(calls, a.steps)
    rows = []
    for name in calls:
        med = statistics.median(times[name])
        rows.append({"mesh": name, "seq_len": a.seq_len, "batch": a.batch, "step_s": med,
                     "min_s": min(times[name]), "tokens_per_s": a.batch * a.seq_len / med,
                     "loss": losses[name], "device": "cpu x8 (simulated)"})
        print(json.dumps(rows[-1]))
    base = rows[0]["step_s"]
    print(f"\n{'mesh':>10} {'step ms':>9} {'min ms':>8} {'vs data=8':>10} {'loss':>8}")
    for r in rows:
        print(f"{r['mesh']:>10} {r['step_s'] * 1e3:>9.1f} {r['min_s'] * 1e3:>8.1f} "
              f"{r['step_s'] / base:>10.2f} {r['loss']:>8.4f}")


if __name__ == "__main__":
    main()
