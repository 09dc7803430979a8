"""Scale-out: device meshes, the logical axis rules, sharded compilation, the pmap path, multi-host.

See `jaxformer.parallel.rules` for the table mapping logical axes to the ``(data, fsdp, tensor)``
mesh axes and `jaxformer.parallel.mesh` for what each mesh axis splits.
"""

from jaxformer.parallel.distributed import maybe_initialize_distributed
from jaxformer.parallel.mesh import MESH_AXES, check_batch_size, describe, make_mesh, mesh_shape
from jaxformer.parallel.partition import mesh_rules, sharded_jit
from jaxformer.parallel.pmap import PmapRunner
from jaxformer.parallel.rules import LOGICAL_AXIS_RULES, batch_sharding, param_shardings

__all__ = ["LOGICAL_AXIS_RULES", "MESH_AXES", "PmapRunner", "batch_sharding", "check_batch_size",
           "describe", "make_mesh", "maybe_initialize_distributed", "mesh_rules", "mesh_shape",
           "param_shardings", "sharded_jit"]
