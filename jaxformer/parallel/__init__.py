"""Scale-out: device meshes, the logical axis rules, sharded compilation, the data-parallel
shard_map and pmap paths, multi-host start-up.

See `jaxformer.parallel.rules` for the table mapping logical axes to the ``(data, fsdp, context,
tensor)`` mesh axes, `jaxformer.parallel.mesh` for what each mesh axis splits and
`jaxformer.parallel.context` for the sequence split (ring attention).

Three ways to run the train step (``config.parallel``); all compute the same update (tested):

=========  ===================================================================================
jit        (default; use it) `jax.jit` of the global step over the mesh (`sharded_jit`): the
           logical rules shard state and activations, the compiler inserts the collectives, and
           DP, FSDP and tensor parallelism are mesh sizes.
shard_map  data parallel, written per device (`shard_map.data_parallel_step`): state replicated,
           batch split over ``data``, gradient and loss/token sums `lax.psum`-ed in the step
           where they can be read; global arrays, so multi-host as is. The migration target for
           pmap code, and the place for hand-written collectives.
pmap       kept for old code (`jaxformer.parallel.pmap`): `jax.pmap` is in maintenance mode (implemented
           with ``jit(shard_map)`` since JAX 0.8), stacks the state once per local device and
           reshapes each batch on the host.
=========  ===================================================================================

`jaxformer.parallel.runner.compile_step` makes the choice for the trainer (one `StepRunner` whatever
the mode).
"""

from jaxformer.parallel.distributed import maybe_initialize_distributed
from jaxformer.parallel.mesh import MESH_AXES, check_batch_size, describe, make_mesh, mesh_shape
from jaxformer.parallel.partition import mesh_rules, sharded_jit
from jaxformer.parallel.rules import LOGICAL_AXIS_RULES, batch_sharding, param_shardings
from jaxformer.parallel.runner import StepRunner, axis_name, compile_step
from jaxformer.parallel.shard_map import data_parallel_step

__all__ = ["LOGICAL_AXIS_RULES", "MESH_AXES", "StepRunner", "axis_name",
           "batch_sharding", "check_batch_size", "compile_step", "data_parallel_step", "describe",
           "make_mesh", "maybe_initialize_distributed", "mesh_rules", "mesh_shape",
           "param_shardings", "sharded_jit"]
