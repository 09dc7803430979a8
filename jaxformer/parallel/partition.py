"""Compiling a function over a mesh with the logical axis rules active.

The Flax layers mark activations with logical names (`flax.linen.with_logical_constraint`): the
residual stream ``("batch", "act_length", "act_embed")`` at block boundaries, attention heads
``("batch", "act_length", "heads", "head_dim")`` and the FFN hidden layer ``("batch", "act_length",
"mlp")`` inside blocks. Those marks bind only while both a mesh (`jax.set_mesh`) and the logical
rules (`flax.linen.logical_axis_rules`) are in context during tracing; everywhere else — a plain
``model.apply`` in a test, generation — they are no-ops. `sharded_jit` keeps both in context around
every trace, lowering and call of a jitted function, so the caller never has to.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import flax.linen as nn
import jax
from jax.sharding import Mesh

from jaxformer.ops.attention_kernels import kernel_mesh
from jaxformer.ops.ring_attention import context_parallel
from jaxformer.parallel.context import context_parallel_for
from jaxformer.parallel.rules import LOGICAL_AXIS_RULES, Rules, check_rules


@contextlib.contextmanager
def mesh_rules(mesh: Mesh, rules: Rules = LOGICAL_AXIS_RULES) -> Iterator[None]:
    """Context in which the layers' logical activation constraints bind to ``mesh``, the
    Pallas attention kernels run per device of it (`jaxformer.ops.attention_kernels.kernel_mesh`:
    rows over the rules' ``batch`` axes, heads over their ``heads`` axes), and attention runs as
    ring attention when the rules split the length (`jaxformer.parallel.context`)."""
    batch_axes, head_axes = nn.logical_to_mesh_axes(("batch", "heads"), check_rules(rules))
    with (jax.set_mesh(mesh), nn.logical_axis_rules(rules),
          kernel_mesh(mesh, batch_axes, head_axes),
          context_parallel(context_parallel_for(mesh, rules))):
        yield


class ShardedFunction:
    """`jax.jit` of ``fn`` whose tracing, lowering and calls happen inside `mesh_rules`.

    Call it like the function; ``.lower(*args)`` gives the AOT `jax.stages.Lowered` (e.g.
    ``.lower(*abstract_args).compile().memory_analysis()``), traced under the same context.
    """

    def __init__(self, fn: Callable, mesh: Mesh, *, in_shardings: Any = None,
                 out_shardings: Any = None, donate_argnums: int | Sequence[int] = (),
                 rules: Rules = LOGICAL_AXIS_RULES):
        self.mesh, self.rules = mesh, check_rules(rules)
        kwargs = {} if in_shardings is None else {"in_shardings": in_shardings}
        if out_shardings is not None:
            kwargs["out_shardings"] = out_shardings
        self.jitted = jax.jit(fn, donate_argnums=donate_argnums, **kwargs)

    def __call__(self, *args):
        with mesh_rules(self.mesh, self.rules):
            return self.jitted(*args)

    def lower(self, *args) -> jax.stages.Lowered:
        with mesh_rules(self.mesh, self.rules):
            return self.jitted.lower(*args)


def sharded_jit(fn: Callable, mesh: Mesh, *, in_shardings: Any = None, out_shardings: Any = None,
                donate_argnums: int | Sequence[int] = (),
                rules: Rules = LOGICAL_AXIS_RULES) -> ShardedFunction:
    """``jax.jit(fn, in_shardings=…, out_shardings=…)`` with the activation constraints active.

    ``in_shardings``/``out_shardings`` are pytrees of `NamedSharding` (None: let the compiler
    choose from the arguments' shardings), exactly as for `jax.jit`.
    """
    return ShardedFunction(fn, mesh, in_shardings=in_shardings, out_shardings=out_shardings,
                           donate_argnums=donate_argnums, rules=rules)
