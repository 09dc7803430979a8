"""Train state and its sharded creation on a mesh.

The state's shardings come from the model's logical axis annotations: the model is initialised
abstractly (`jax.eval_shape`, nothing allocated), `jaxformer.parallel.rules` maps the logical names to
mesh axes, and the real initialisation is jit-compiled with those output shardings, so each device
only ever materialises its own shards.

One exception, for start-up time (`draws_on_host`): on GPUs, in a single process, fresh parameters
are drawn by the host CPU and then placed shard by shard.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from jaxformer.models import Model
from jaxformer.parallel.rules import match_shardings_by_path, param_shardings, replicated


@flax.struct.dataclass
class TrainState:
    """Everything a step needs and a checkpoint holds.

    Attributes:
      step: int32 scalar, optimizer updates done.
      params: parameter pytree (plain arrays, sharded by logical rules).
      opt_state: optax state (moments sharded like their parameters).
      rng: raw uint32 key data of the run's base key; step ``s`` uses ``fold_in(rng, s)``, so
        dropout and masking depend only on (seed, step) and a resumed run repeats them exactly.
    """

    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array

    def step_key(self) -> jax.Array:
        return jax.random.fold_in(jax.random.wrap_key_data(self.rng), self.step)


def dummy_model_inputs(model_cfg, batch: int = 1, length: int = 8) -> dict:
    """Smallest inputs of every ``model_cfg.family`` (keyword arguments of ``Model.apply``)."""
    toks = jnp.ones((batch, length), jnp.int32)
    if model_cfg.family == "encoder_decoder":
        return {"inputs": toks, "targets_in": toks}
    return {"tokens": toks}


def draws_on_host(mesh: Mesh) -> bool:
    """Whether fresh parameters for ``mesh`` are drawn by the host CPU and then placed shard by
    shard (`jax.device_put`), rather than drawn on the devices by one jitted program.

    True on GPUs in a single process, where a CPU backend is there (``JAX_PLATFORMS`` may leave it
    out). The initialiser is one random-number kernel per parameter and layer, and compiling them for
    an H100 took 62 s for gpt2_small_bf16 and 97 s for gpt2_medium_bf16, the host CPU's compile 8
    and 15 s (jax 0.11.2, `bench/init_compile.py`, docs/benchmarks.md). The
    values are the same threefry draws, computed by the CPU. Elsewhere the devices draw: on TPU
    slices and across processes each device materialises only its own shards, never the whole
    model, and the host is already the device on a CPU.
    """
    if _platform(mesh) != "gpu" or jax.process_count() > 1:
        return False
    try:
        jax.devices("cpu")
    except RuntimeError:
        return False
    return True


def _platform(mesh: Mesh) -> str:
    return mesh.devices.flat[0].platform


def init_compiler_options(platform: str) -> dict | None:
    """XLA options for the programs that draw fresh parameters on ``platform``.

    On the CPU, backend optimisation level 1 instead of the default 2: the initialiser runs once,
    and at level 1 XLA:CPU compiles it 2–3× faster and runs it as fast (gpt2_small_bf16: compile
    14.9 → 6.5 s, run 1.65 → 1.80 s; gpt_tiny: 3.5 → 1.2 s). Level 0 would compile a little faster
    still but runs 6× slower (9.4 s). Other backends keep their defaults."""
    return {"xla_backend_optimization_level": 1} if platform == "cpu" else None


def init_params_on_host(model: Model, init_key_data: np.ndarray) -> Any:
    """``model.init`` computed by the host CPU (one jitted program) from raw key data."""
    with jax.default_device(jax.devices("cpu")[0]):
        return jax.jit(lambda k: model.init(jax.random.wrap_key_data(k)),
                       compiler_options=init_compiler_options("cpu"))(init_key_data)


def state_shardings(model: Model, tx: optax.GradientTransformation, mesh: Mesh,
                    trained: tuple[Any, Any] | None = None):
    """(abstract TrainState, TrainState of NamedShardings) for ``mesh``. The state's params are the
    model's, or ``trained`` = (abstract parameters, their logical axes) when a feature trains
    others (`jaxformer.train.extension.Extension.trained`)."""
    p_abs, axes = trained or (model.abstract(), model.logical_axes())
    p_sh = param_shardings(axes, p_abs, mesh)
    o_abs = jax.eval_shape(tx.init, p_abs)
    o_sh = match_shardings_by_path(o_abs, p_sh, p_abs, mesh)
    rep = replicated(mesh)
    abstract = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=p_abs, opt_state=o_abs,
                          rng=jax.ShapeDtypeStruct((2,), jnp.uint32))
    shardings = TrainState(step=rep, params=p_sh, opt_state=o_sh, rng=rep)
    return abstract, shardings


def create_train_state(model: Model, tx: optax.GradientTransformation, mesh: Mesh,
                       seed: int, params: Any | None = None, trained: tuple[Any, Any] | None = None
                       ) -> tuple[TrainState, TrainState]:
    """Initialise (or wrap given ``params``) directly into the mesh's shardings.

    Returns (state, shardings). The parameter init key is ``fold_in(key(seed), 0)``; the step keys
    derive from ``fold_in(key(seed), 1)``. A state of other parameters than the model's
    (``trained``, as for `state_shardings`) needs them as ``params``. Fresh parameters are drawn by
    the host CPU where `draws_on_host` says so (GPUs).
    """
    _, shardings = state_shardings(model, tx, mesh, trained)
    # The keys are arguments (host data, replicated), not constants: one compiled program per
    # model serves every seed.
    key_data = [np.asarray(jax.random.key_data(k)) for k in (
        _init_key(seed), jax.random.fold_in(jax.random.key(seed), 1))]
    rep = replicated(mesh)
    if params is None and draws_on_host(mesh):
        params = init_params_on_host(model, key_data[0])

    def build(p, init_data, rng):
        if p is None:
            p = model.init(jax.random.wrap_key_data(init_data))
        return TrainState(step=jnp.zeros((), jnp.int32), params=p, opt_state=tx.init(p), rng=rng)

    if params is None:
        state = jax.jit(lambda k, r: build(None, k, r), in_shardings=(rep, rep),
                        out_shardings=shardings,
                        compiler_options=init_compiler_options(_platform(mesh)))(*key_data)
    else:
        params = jax.device_put(params, shardings.params)
        state = jax.jit(lambda p, r: build(p, None, r), in_shardings=(shardings.params, rep),
                        out_shardings=shardings)(params, key_data[1])
    return state, shardings


def _init_key(seed: int) -> jax.Array:
    return jax.random.fold_in(jax.random.key(seed), 0)


def create_params(model: Model, shardings: Any, seed: int) -> Any:
    """The fresh parameters `create_train_state` would start from, initialised directly into
    ``shardings`` (the ``params`` part of `state_shardings`), without optimizer state."""
    key_data = np.asarray(jax.random.key_data(_init_key(seed)))  # an argument: one program
    mesh = jax.tree.leaves(shardings)[0].mesh
    if draws_on_host(mesh):
        return jax.device_put(init_params_on_host(model, key_data), shardings)
    return jax.jit(lambda k: model.init(jax.random.wrap_key_data(k)),
                   in_shardings=replicated(mesh), out_shardings=shardings,
                   compiler_options=init_compiler_options(_platform(mesh)))(key_data)
