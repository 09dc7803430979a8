"""`nnx.Param`s from the parameter-spec table, their logical axes, and their mesh shardings.

A `ParamNode` holds one spec of `jaxformer.layers.params` (e.g. a `model_spec` part): an
`nnx.Param` per `ParamSpec` leaf, named as the spec names it, and a child node per nested dict, so
``nnx.to_pure_dict(nnx.state(model, nnx.Param))`` is exactly the checkpoints' ``params`` tree. Each
Param carries the spec's logical axis names (``("embed", "mlp")``; scanned stacks prepend
``"layers"``) as its ``out_sharding`` metadata, which `nnx.get_partition_spec` reads and
`param_shardings` maps to the mesh with the one rules table of `jaxformer.parallel.rules`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, PartitionSpec

from jaxformer.layers.params import ParamSpec
from jaxformer.parallel.rules import LOGICAL_AXIS_RULES, Rules, logical_to_shardings


class ParamNode(nnx.Module):
    """The parameters of a nested spec, as attributes: ``node.kernel`` is an `nnx.Param` `[d, f]`.

    Args:
      spec: nested dict of `ParamSpec` (`jaxformer.layers.params`).
      rngs: its ``params`` stream (or default) initialises each leaf by the spec's initialiser.
      param_dtype: storage dtype.
    """

    def __init__(self, spec: Mapping, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
        self._names = tuple(spec)
        for name, s in spec.items():
            if isinstance(s, ParamSpec):
                value = s.initializer()(rngs.params(), s.shape, param_dtype)
                # Placed on a mesh by jit out_shardings (`param_shardings`), not at creation, so a
                # model can also be built without a mesh.
                setattr(self, name, nnx.Param(value, out_sharding=s.axes, eager_sharding=False))
            else:
                setattr(self, name, ParamNode(s, rngs=rngs, param_dtype=param_dtype))

    def tree(self) -> dict:
        """The parameter arrays as a nested dict laid out like the spec (what `jaxformer.ops` takes)."""
        out = {}
        for name in self._names:
            v = getattr(self, name)
            out[name] = v.tree() if isinstance(v, ParamNode) else v[...]
        return out


def _axes(v: nnx.Variable) -> tuple[str | None, ...]:
    return tuple(v.get_metadata("out_sharding", None) or (None,) * v.ndim)


def param_dict(model: nnx.Module) -> dict:
    """The model's parameters as the one pure-dict format of checkpoints, the HF converter and
    former Linen modules' ``params`` collection (arrays, nested by name)."""
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def logical_axes(model: nnx.Module) -> dict:
    """Pure dict like `param_dict` holding each parameter's logical axis names (a tuple)."""
    return nnx.to_pure_dict(nnx.state(model, nnx.Param), extract_fn=_axes)


def param_shardings(model: nnx.Module, mesh: Mesh, rules: Rules = LOGICAL_AXIS_RULES) -> dict:
    """`NamedSharding` per parameter (pure dict like `param_dict`), by the logical rules; the same
    function, divisibility checks included, as `jaxformer.parallel.rules.param_shardings` on boxed trees.
    ``model`` may be abstract (`nnx.eval_shape`)."""
    specs = jax.tree.map(lambda axes: PartitionSpec(*axes), logical_axes(model),
                         is_leaf=lambda x: isinstance(x, tuple))
    return logical_to_shardings(specs, param_dict(model), mesh, rules)


def boxed_params(model: nnx.Module) -> dict[str, Any]:
    """`param_dict` with each array boxed as `flax.linen.LogicallyPartitioned` (its logical axes),
    the form of `FunctionalModel.init`'s output that the trainer's sharding code reads."""
    return nnx.to_pure_dict(nnx.state(model, nnx.Param),
                            extract_fn=lambda v: nn.LogicallyPartitioned(v[...], _axes(v)))
