"""Our H100 target description against a real H100: `bench/accelerator.py`'s train steps (the rows
of docs/benchmarks.md's H100 table, whose "step HBM (compiled)" column was compiled on the GPU
itself) compiled for one compile-only H100 on this CPU host (`jaxformer.parallel.topology`, jax's
CUDA plugin: the ``[cuda-aot]`` extra), their high-water marks beside the measured ones.

    python bench/h100_memory.py                 # the five rows, one compile each (~25-60 s)
    python bench/h100_memory.py --rows gpt2_medium:cudnn

Same program as on the GPU: the ``<model>_bf16`` preset with ``--scan_layers``, batch 8, GPT-2 rows
of 1,024 tokens, BERT / T5 inputs of 512 and T5 targets of 128, AdamW, donated state; only the
inputs are abstract here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compile-only: no accelerator of its own

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import accelerator  # noqa: E402

from jaxformer.models import build_model  # noqa: E402
from jaxformer.objectives import bind_objective  # noqa: E402
from jaxformer.ops.kernel_choice import target_platform  # noqa: E402
from jaxformer.parallel.topology import parse_topology, topology_devices  # noqa: E402
from jaxformer.train.state import TrainState  # noqa: E402
from jaxformer.train.step import make_train_step  # noqa: E402
from jaxformer.vocab import SpecialTokens  # noqa: E402

# docs/benchmarks.md, one H100 80GB HBM3 (jax 0.11.2, 2026-11-26): "step HBM (compiled)", GiB.
MEASURED = {"gpt2_medium:xla": 37.6, "gpt2_medium:cudnn": 19.0, "bert_base:xla": 5.9,
            "bert_base:cudnn": 4.1, "t5_base:xla": 8.2}


def compile_row(row: str, device) -> dict:
    """``model:impl`` compiled for ``device`` as `accelerator.prepare` compiles it, abstractly."""
    name, impl = row.split(":")
    args = types.SimpleNamespace(seq_len=1024 if name.startswith("gpt") else 512, batch=8,
                                 scan_layers=True, tiny=False)
    on = jax.sharding.SingleDeviceSharding(device)
    with target_platform("cuda"):
        cfg = accelerator.model_config(name, impl, args)
        tx = optax.adamw(1e-4, weight_decay=0.01)
        step = make_train_step(build_model(cfg), tx,
                               bind_objective(accelerator.MODELS[name][2], None,
                                              SpecialTokens(cfg.vocab_size)),
                               optax.constant_schedule(1e-4))
        state = jax.eval_shape(lambda: TrainState(
            step=jnp.zeros((), jnp.int32),
            params=(p := build_model(cfg).init(jax.random.key(0))),
            opt_state=tx.init(p), rng=jax.random.key_data(jax.random.key(1))))
        batch = jax.eval_shape(lambda: accelerator.packed_batch(cfg, accelerator.MODELS[name][2],
                                                                args))
        place = lambda tree: jax.tree.map(  # noqa: E731
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=on), tree)
        compiled = jax.jit(step, donate_argnums=(0,)).lower(place(state), place(batch)).compile()
    mine = accelerator.compiled_memory(compiled)["hbm_gib"]
    return {"row": row, "device": device.device_kind, "compiled_here_gib": round(mine, 2),
            "measured_gib": MEASURED.get(row),
            "ratio": round(mine / MEASURED[row], 3) if row in MEASURED else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default=",".join(MEASURED))
    ap.add_argument("--topology", default="h100:1")
    args = ap.parse_args()
    device = topology_devices(parse_topology(args.topology))[0]
    for row in args.rows.split(","):
        print(json.dumps(compile_row(row, device)), flush=True)


if __name__ == "__main__":
    main()
