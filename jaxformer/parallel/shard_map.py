"""The explicit data-parallel path (``config.parallel="shard_map"``): `jax.jit` of `jax.shard_map`.

The train step is written per device and its collectives are in the code: the state is replicated
(``P()``), the global batch is split over the mesh's ``data`` axis (``P("data")``), and the step —
the same `make_train_step(..., axis_name="data")` as the pmap path — `lax.psum`-s the gradient and
the loss/token *sums* over ``data`` before normalising, so every device applies the same update,
equal to the jit path's (tested). Unlike pmap, it takes and returns global arrays: no per-device
stacking, no host-side reshapes, and across processes the mesh spans every host's devices (each
feeds its rows with `jax.make_array_from_process_local_data`, as on the jit path).

`check_vma` is on: JAX verifies that what ``out_specs`` declares replicated (the new state, the
metrics) is the same on every device, so a forgotten psum fails at trace time instead of silently
returning device 0's values. It also makes autodiff psum the gradient of a replicated input by
itself (the transpose of its implicit broadcast), so the step casts the parameters to
device-varying (`lax.pcast`) before differentiating: the gradient stays per device and the one
psum is the step's own (summed twice, it would be N times too large — Adam hides that, the
gradient norm does not; tested). Data parallel only: ``mesh.fsdp`` and ``mesh.tensor`` must be 1
(`jaxformer.train.config.validate_config` refuses the rest, as for pmap).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import Mesh, PartitionSpec

from jaxformer.parallel.partition import ShardedFunction, sharded_jit

AXIS = "data"  # the mesh axis the batch is split over and the step's collectives run over


def data_parallel_step(step_fn: Callable, mesh: Mesh, state_shardings: Any = None
                       ) -> ShardedFunction:
    """``jit(shard_map(step_fn))``: ``(state, batch) -> (state, metrics)`` on global arrays.

    ``step_fn`` must be built with ``axis_name=AXIS``. ``state_shardings`` (the jit path's
    `state_shardings`, replicated on a data-only mesh) keep the state where checkpoints and
    evaluation expect it; the state is donated. The logical activation constraints are off: inside
    the per-device body there is no global array left to constrain.
    """
    extra = set(mesh.axis_names) - {AXIS}
    if any(mesh.shape[a] > 1 for a in extra):
        raise ValueError(f"shard_map data parallelism needs a data-only mesh, got "
                         f"{dict(mesh.shape)}; set mesh.fsdp=1 and mesh.tensor=1 (or use "
                         "parallel='jit' for FSDP / tensor parallelism)")
    replicated, rows = PartitionSpec(), PartitionSpec(AXIS)
    per_device = jax.shard_map(step_fn, mesh=mesh, in_specs=(replicated, rows),
                               out_specs=(replicated, replicated))
    shardings = None if state_shardings is None else (state_shardings, None)
    return sharded_jit(per_device, mesh, in_shardings=shardings, out_shardings=shardings,
                       donate_argnums=(0,), rules=())
