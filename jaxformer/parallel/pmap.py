"""The pmap path (``config.parallel="pmap"``): data parallelism with a replicated train state.

Kept for code written against pmap. `jax.pmap` is in maintenance mode (since JAX 0.8 it is
implemented with `jax.jit` and `jax.shard_map`): new data-parallel code should use
``parallel="shard_map"`` (`jaxformer.parallel.shard_map`: the same per-device step on global
arrays, without stacking the state per device or reshaping batches on the host), and the jit path
over a mesh is the default, also covering FSDP and tensor parallelism.

The pieces here (`replicate`, `pmapped`, `split`, `first`) make the runner of
`jaxformer.parallel.runner.compile_step`. It wraps the same train step (`make_train_step(...,
axis_name="batch")`), so every path computes the same update: each local device gets
``batch_size / local_device_count`` rows,
gradient and loss *sums* are `lax.psum`-ed across all devices (of all processes), and every
replica applies the identical optimizer update. With dropout off it matches the jit path with a
data-only mesh to float rounding (tested).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXIS = "batch"


def replicate(tree, devices: Sequence[jax.Device]):
    """Stack ``tree`` along a new leading axis with one copy per device (pmap's input layout)."""
    sharding = NamedSharding(Mesh(np.asarray(devices), (AXIS,)), PartitionSpec(AXIS))
    host = jax.device_get(tree)
    return jax.device_put(
        jax.tree.map(lambda x: np.broadcast_to(np.asarray(x)[None], (len(devices), *np.shape(x))),
                     host), sharding)


def pmapped(step_fn: Callable, devices: Sequence[jax.Device] | None = None) -> Callable:
    """``jax.pmap`` of ``step_fn(state, batch)`` over ``AXIS``, the state donated; ``devices``
    None: every process's local devices (each feeds its own: restricting pmap to this process's
    devices would psum gradients within each process only)."""
    return jax.pmap(step_fn, axis_name=AXIS, donate_argnums=(0,),
                    devices=None if devices is None else list(devices))


def split(batch: dict, n: int) -> dict:
    """`[rows, ...]` → `[n, rows / n, ...]` (one slice per local device); ValueError if rows don't
    divide."""
    out = {}
    for k, v in batch.items():
        v = np.asarray(v)
        if v.shape[0] % n:
            raise ValueError(f"pmap: batch[{k!r}] has {v.shape[0]} rows, not divisible by the "
                             f"{n} local devices; make data.batch_size / process count a "
                             f"multiple of {n}")
        out[k] = v.reshape(n, v.shape[0] // n, *v.shape[1:])
    return out


def first(x: jax.Array) -> jax.Array:
    """Replica 0 of a pmapped array, without a gather (its first addressable shard)."""
    return x.addressable_shards[0].data[0]
