"""How the train step runs over the devices (``config.parallel``): the one place that chooses.

``compile_step(mode, step_fn, mesh, state_shardings, frozen_shardings)`` turns the trainer's
``train_step(state, batch, frozen=None) -> (state, metrics)`` (`jaxformer.train.step`) into a
`StepRunner` for one of the three modes of `jaxformer.parallel` (what each is for: its docstring):

=========  =====================================================================================
jit        `sharded_jit` of the global step: state and ``frozen`` in their mesh shardings, the
           state donated.
shard_map  `jaxformer.parallel.shard_map.data_parallel_step`: the step per device, its sums
           `lax.psum`-ed over ``data`` (build it with ``axis_name("shard_map")``).
pmap       `jax.pmap` over the local devices of a state replicated per device
           (`jaxformer.parallel.pmap`; build it with ``axis_name("pmap")``).
=========  =====================================================================================

The loop is the same for all three: ``state = runner.place(state)``, then per step ``state,
metrics = runner(state, batch, frozen)`` with ``batch`` this process's rows as the data pipeline
yields them, and ``runner.host_state(state)`` for evaluation and checkpoints. ``frozen`` (a
feature's parameters that are not trained: `jaxformer.train.extension.Extension`) is jit-only; the
config checks refuse the features that need it with the data-parallel modes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from jaxformer.parallel import pmap, shard_map
from jaxformer.parallel.partition import sharded_jit
from jaxformer.parallel.rules import batch_sharding

AXES = {"jit": None, "shard_map": shard_map.AXIS, "pmap": pmap.AXIS}


def axis_name(mode: str) -> str | None:
    """The axis the step of ``mode`` sums its gradients over (`make_train_step`'s ``axis_name``):
    None under jit (the compiler inserts the collectives), the mesh's ``data`` axis under shard_map,
    pmap's own axis under pmap."""
    if mode not in AXES:
        raise ValueError(f"parallel={mode!r}: choose one of {tuple(AXES)}")
    return AXES[mode]


def global_batch(batch: dict, mesh: Mesh) -> dict:
    """This process's rows of a batch as global arrays split over the mesh's batch axes."""
    return {k: jax.make_array_from_process_local_data(batch_sharding(mesh, np.ndim(v)), np.asarray(v))
            for k, v in batch.items()}


class StepRunner:
    """``runner(state, batch, frozen=None) -> (state, metrics)`` on global arrays (jit, shard_map).

    ``place(state)`` gives the state the runner steps and ``host_state(state)`` the state
    evaluation and checkpoints read; both are the identity here (`PmapStepRunner` differs).
    ``fn`` is the compiled step (`jaxformer.parallel.partition.ShardedFunction`: ``fn.lower``
    gives its AOT program).
    """

    def __init__(self, fn: Callable, mesh: Mesh, takes_frozen: bool):
        self.fn, self.mesh, self.takes_frozen = fn, mesh, takes_frozen

    def place(self, state: Any) -> Any:
        return state

    def __call__(self, state: Any, batch: dict, frozen: Any = None) -> tuple[Any, dict]:
        batch = global_batch(batch, self.mesh)
        if self.takes_frozen:
            return self.fn(state, batch, frozen)
        _check_no_frozen(frozen)
        return self.fn(state, batch)

    def host_state(self, state: Any) -> Any:
        return state


class PmapStepRunner(StepRunner):
    """The pmap runner: the state is stacked once per local device (`place`), each batch split
    over them, the metrics and `host_state` are replica 0's (all replicas are identical)."""

    def __init__(self, fn: Callable, devices: list):
        super().__init__(fn, None, takes_frozen=False)
        self.devices = devices

    def place(self, state: Any) -> Any:
        return pmap.replicate(state, self.devices)

    def __call__(self, state: Any, batch: dict, frozen: Any = None) -> tuple[Any, dict]:
        _check_no_frozen(frozen)
        state, metrics = self.fn(state, pmap.split(batch, len(self.devices)))
        return state, jax.tree.map(pmap.first, metrics)

    def host_state(self, state: Any) -> Any:
        return jax.device_get(jax.tree.map(pmap.first, state))


def _check_no_frozen(frozen: Any) -> None:
    if jax.tree.leaves(frozen):
        raise ValueError("a feature with frozen parameters (LoRA, distillation) trains with "
                         "parallel='jit'; set --config.parallel=jit")


def compile_step(mode: str, step_fn: Callable, mesh: Mesh, state_shardings: Any,
                 frozen_shardings: Any = None) -> StepRunner:
    """The `StepRunner` of ``step_fn`` (``train_step(state, batch, frozen=None)``, built with
    ``axis_name=axis_name(mode)``) for ``mode`` (``config.parallel``) on ``mesh``.

    jit: the step is jitted itself (XLA names the program after it), in ``state_shardings`` and
    ``frozen_shardings`` (None: where ``frozen`` is), out in ``state_shardings``, the state donated;
    ``frozen=None`` has no leaves, so a run without a frozen tree compiles the program it did
    before ``frozen`` existed. shard_map: `shard_map.data_parallel_step` (state in
    ``state_shardings``, replicated on a data-only mesh). pmap: over the mesh's devices (a mesh
    of every device: each process feeds its local ones, the gradient sums span all processes);
    ``state_shardings`` are not used (the state is stacked per device).
    """
    axis_name(mode)  # a bad mode: refused by name
    if mode == "pmap":  # over the mesh's devices; a mesh of every device: every process's own
        every = mesh.devices.size == jax.device_count()
        devices = jax.local_devices() if every else list(mesh.devices.flat)
        return PmapStepRunner(pmap.pmapped(step_fn, None if every else devices), devices)
    if mode == "shard_map":
        return StepRunner(shard_map.data_parallel_step(step_fn, mesh, state_shardings), mesh, False)
    return StepRunner(sharded_jit(step_fn, mesh,
                                  in_shardings=(state_shardings, None, frozen_shardings),
                                  out_shardings=(state_shardings, None), donate_argnums=(0,)),
                      mesh, takes_frozen=True)
