"""Expert parallelism (issue 62): an MoE model's experts split over the ``expert`` mesh axis, tokens
sent to them and back by all-to-all; ``expert=4 × data=2`` and ``expert=2 × fsdp=2 × tensor=2`` on
8 simulated devices train as one device does (losses and parameters after 3 steps), and what it
cannot run is refused by name."""

from __future__ import annotations

import functools
import math

import jax
import numpy as np
import pytest

from jaxformer.config import ModelConfig
from jaxformer.models import build_model
from jaxformer.models.presets import preset
from jaxformer.objectives import bind_objective
from jaxformer.parallel.mesh import make_mesh
from jaxformer.parallel.partition import sharded_jit
from jaxformer.parallel.rules import batch_sharding
from jaxformer.train.config.validation import check_expert_parallel
from jaxformer.train.optim import default_optimizer_config, make_optimizer
from jaxformer.train.state import create_train_state, state_shardings
from jaxformer.train.step import make_train_step
from jaxformer.vocab import SpecialTokens

MOE = dict(vocab_size=64, d_model=32, num_heads=4, num_kv_heads=2, d_ff=48, num_layers=2,
           max_len=16, num_experts=4, experts_per_token=2, capacity_factor=1.0,
           router_aux_loss_weight=0.01, router_z_loss_weight=0.001)

OPTIMIZER = default_optimizer_config("gpt3", peak_lr=1e-2, warmup_steps=1, eps=1e-3)


def _train(mesh_sizes: dict, host_state=None, steps: int = 3):
    """(state after ``steps`` steps, their losses, the compiled step's HLO text) on ``mesh_sizes``."""
    cfg = ModelConfig.from_dict(preset("llama_tiny", **MOE))
    model = build_model(cfg)
    tx, schedule = make_optimizer(OPTIMIZER, cfg.d_model, 10)
    prepare = bind_objective("clm", None, SpecialTokens(cfg.vocab_size))
    mesh = make_mesh(mesh_sizes, jax.devices()[:math.prod(mesh_sizes.values())])
    shardings = state_shardings(model, tx, mesh)[1]
    state = (create_train_state(model, tx, mesh, seed=0)[0] if host_state is None
             else jax.device_put(host_state, shardings))
    rows = np.random.default_rng(0).integers(3, cfg.vocab_size, (8, 16)).astype(np.int32)
    batch = {"inputs": jax.make_array_from_process_local_data(batch_sharding(mesh, 2), rows)}
    step = sharded_jit(make_train_step(model, tx, prepare, schedule), mesh,
                       in_shardings=(shardings, None), out_shardings=(shardings, None))
    hlo = step.lower(state, batch).compile().as_text()
    losses = []
    for _ in range(steps):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]) + float(metrics["router_loss"]))
    return jax.device_get(state), np.array(losses), hlo, shardings


@functools.cache
def _one_device():
    """(the initial state on the host, the state after 3 steps and their losses) on one device."""
    host = jax.device_get(create_train_state(
        build_model(ModelConfig.from_dict(preset("llama_tiny", **MOE))),
        make_optimizer(OPTIMIZER, 32, 10)[0], make_mesh({"data": 1}, jax.devices()[:1]), seed=0)[0])
    state, losses, _, _ = _train({"data": 1}, host)
    return host, state, losses


@pytest.mark.parametrize("mesh", [{"data": 2, "expert": 4}, {"fsdp": 2, "expert": 2, "tensor": 2}])
def test_expert_parallel_mesh_trains_as_one_device_with_all_to_alls(mesh):
    host, single, single_losses = _one_device()
    sharded, sharded_losses, hlo, shardings = _train(mesh, host)
    wi = shardings.params["decoder"]["layer_0"]["ffn"]["wi"]["kernel"].spec
    assert wi[0] == "expert"  # [E, D, F]: the experts split over the expert axis
    assert "all-to-all" in hlo
    assert np.all(np.isfinite(single_losses)) and single_losses[-1] < single_losses[0]
    np.testing.assert_allclose(sharded_losses, single_losses, rtol=1e-5)
    # (Adam's eps 1e-3: with 1e-8 its normalised update turns float-order differences of near-zero
    # gradients into steps of ~lr; a wrong routing would move parameters by ~lr = 1e-2)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=2e-6),
                 sharded.params, single.params)


@pytest.mark.parametrize("kw,match", [
    (dict(num_experts=0), r"mesh.expert=4 splits MoE experts, but model.num_experts=0"),
    (dict(num_experts=6), r"mesh.expert=4 must divide model.num_experts=6"),
    (dict(moe_dropless=True), r"model.moe_dropless=True with mesh.expert=4 is not supported"),
])
def test_unsupported_expert_parallel_settings_are_refused_by_name(kw, match):
    cfg = ModelConfig.from_dict(preset("llama_tiny", **{**MOE, **kw}))
    with pytest.raises(ValueError, match=match):
        check_expert_parallel(4, cfg)
