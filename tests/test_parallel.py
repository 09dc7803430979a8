"""Sharded training on 8 simulated CPU devices: meshes, logical rules, FSDP, tensor parallelism,
the shard_map and pmap paths, restoring onto another mesh, and the memory planner.

The same tiny GPT is trained for a few steps (same seed, same batches, dropout off) on a one-device
mesh, on ``data=8``, ``fsdp=8``, ``data=2,fsdp=2,tensor=2``, ``tensor=4,data=2`` (with two
accumulated micro-batches per step) and through the explicit shard_map and the pmap data-parallel
paths (on 8 devices, and on 4 with two micro-batches). The batches' rows hold different numbers of
tokens, so only a global token-weighted loss (psum of sums, not a mean of per-device means)
matches. Each train step is compiled once (module fixture) and reused by the tests below.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import math
import os
import tempfile

import jax
import ml_collections
import numpy as np
import pytest

from jaxformer.checkpoint import Checkpointer, with_shardings
from jaxformer.config import ModelConfig
from jaxformer.models import build_model
from jaxformer.models.presets import preset
from jaxformer.objectives import bind_objective
from jaxformer.objectives.mlm import MLMOptions
from jaxformer.parallel import shard_map
from jaxformer.parallel.distributed import distributed_requested
from jaxformer.parallel.mesh import check_batch_size, describe, make_mesh, mesh_shape
from jaxformer.parallel.partition import sharded_jit
from jaxformer.parallel.rules import LOGICAL_AXIS_RULES, batch_sharding, param_shardings
from jaxformer.parallel.runner import axis_name, compile_step
from jaxformer.parallel.shard_map import data_parallel_step
from jaxformer.train.config import base_config, load_config, train_settings
from jaxformer.train.optim import (
    OptimizerSettings,
    default_optimizer_config,
    make_optimizer,
    optimizer_settings,
)
from jaxformer.train.state import (
    create_train_state,
    state_shardings,
)
from jaxformer.train.step import make_eval_step, make_train_step
from jaxformer.vocab import SpecialTokens

TINY = dict(vocab_size=128, d_model=64, num_heads=4, d_ff=128, num_layers=1, max_len=16,
            dropout_rate=0.0, attention_dropout_rate=0.0, ffn_dropout_rate=0.0)
FAMILY = {"gpt": ("gpt_tiny", "clm"), "bert": ("bert_tiny", "mlm"), "t5": ("t5_tiny", "seq2seq")}
MESHES = {"data8": {"data": 8}, "fsdp8": {"fsdp": 8},
          "mixed": {"data": 2, "fsdp": 2, "tensor": 2}, "tensor4": {"tensor": 4, "data": 2}}
BATCH, LEN, STEPS = 8, 16, 3
REMAT_WARNING = "Involuntary full rematerialization"
# Float32 runs that differ only in how sums are split across devices (the loss over batch shards,
# matmul contractions split by tensor parallelism, then all-reduced) round differently: ~1e-7
# relative per reduction (observed here: losses within 4e-7 relative, parameters within 6e-8 after
# 3 steps). Adam's epsilon is raised to 1e-3 so that near-zero gradients, whose sign is rounding
# noise, cannot flip an update of size lr.
LOSS_RTOL, PARAM_ATOL = 1e-5, 1e-6
# LLVM's optimisation level only affects the speed of the CPU code; it compiles ~3x faster.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def _setup(family: str, **model_overrides):
    name, objective = FAMILY[family]
    cfg = ModelConfig.from_dict(preset(name, **{**TINY, **model_overrides}))
    model = build_model(cfg)
    opt = optimizer_settings("gpt3", peak_lr=1e-2, warmup_steps=1, eps=1e-3)
    tx, schedule = make_optimizer(opt, cfg.d_model, 10)
    options = MLMOptions(mask_rate=0.3) if objective == "mlm" else None
    prepare = bind_objective(objective, options, SpecialTokens(cfg.vocab_size))
    return cfg, model, tx, schedule, prepare


def _batches(family: str, n: int, ragged: bool = False) -> list[dict]:
    """``ragged``: row i ends in 2·i pad tokens, so every device of ``data=8`` holds a different
    number of tokens."""
    r = np.random.default_rng(1)
    out = []
    for _ in range(n):
        b = {"inputs": r.integers(7, TINY["vocab_size"], (BATCH, LEN)).astype(np.int32)}
        if ragged:
            b["inputs"][np.arange(LEN) >= LEN - 2 * np.arange(BATCH)[:, None]] = 0
        if family == "t5":
            b["targets"] = r.integers(7, TINY["vocab_size"], (BATCH, LEN // 2)).astype(np.int32)
        out.append(b)
    return out


def _to_global(batch: dict, mesh) -> dict:
    return {k: jax.make_array_from_process_local_data(batch_sharding(mesh, v.ndim), v)
            for k, v in batch.items()}


@contextlib.contextmanager
def captured_stderr():
    """Collect what native code (XLA's C++ logging) writes to file descriptor 2."""
    with tempfile.TemporaryFile(mode="w+") as f:
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        result = {"text": ""}
        try:
            yield result
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            result["text"] = f.read()


def _train_jit(mesh, setup, state, batches, grad_accum_steps: int = 1, explicit: bool = False):
    """Compile the real train step for ``mesh`` (capturing XLA's warnings) and run it; with
    ``explicit``, the shard_map data-parallel step instead of the jit over the mesh."""
    cfg, model, tx, schedule, prepare = setup
    _, shardings = state_shardings(model, tx, mesh)
    step_fn = make_train_step(model, tx, prepare, schedule, run=_run_settings(cfg, grad_accum_steps),
                              axis_name=axis_name("shard_map" if explicit else "jit"))
    if explicit:
        step = data_parallel_step(step_fn, mesh, shardings)
    else:
        step = sharded_jit(step_fn, mesh,
                           in_shardings=(shardings, None), out_shardings=(shardings, None))
    with captured_stderr() as err:
        compiled = step.lower(state, _to_global(batches[0], mesh)).compile(FAST_COMPILE)
    metrics = []
    for b in batches:
        state, m = compiled(state, _to_global(b, mesh))
        metrics.append(m)
    return {**_columns(metrics), "state": state, "shardings": shardings,
            "memory": compiled.memory_analysis(), "stderr": err["text"], "hlo": compiled.as_text()}


def _run_settings(cfg: ModelConfig, grad_accum_steps: int):
    """The run's settings (`make_train_step`'s ``run``) with ``grad_accum_steps`` micro-batches."""
    return dataclasses.replace(train_settings(base_config(), cfg),
                               optimizer=OptimizerSettings(grad_accum_steps=grad_accum_steps))


def _columns(metrics: list[dict]) -> dict:
    """Per-step losses, token sums and gradient norms of a run."""
    get = lambda k: np.array([float(m[k]) for m in metrics])
    return {"losses": get("loss"), "tokens": list(get("tokens")), "grad_norms": get("grad_norm")}


def _train_pmap(setup, host_state, batches, mesh, grad_accum_steps: int = 1):
    """The trainer's pmap runner (`compile_step`) over ``mesh``'s devices, from the host state."""
    cfg, model, tx, schedule, prepare = setup
    runner = compile_step("pmap", make_train_step(model, tx, prepare, schedule,
                                                  axis_name=axis_name("pmap"),
                                                  run=_run_settings(cfg, grad_accum_steps)),
                          mesh, None)
    state, metrics = runner.place(host_state), []
    for b in batches:
        state, m = runner(state, b)
        metrics.append(m)
    return {**_columns(metrics), "params": runner.host_state(state).params}


def _host_state(setup, seed: int = 0):
    """The unsharded initial state on one device, through `create_train_state(params=…)`: the
    parameters come from a fast-compiled `Model.init` with the trainer's init key."""
    cfg, model, tx, _, _ = setup
    init = jax.jit(lambda k: model.init(k), compiler_options=FAST_COMPILE)
    params = init(jax.random.fold_in(jax.random.key(seed), 0))
    single = make_mesh({"data": 1}, jax.devices()[:1])
    return jax.device_get(create_train_state(model, tx, single, seed, params=params)[0])


@pytest.fixture(scope="module")
def runs():
    setup = _setup("gpt")
    cfg, model, tx, schedule, prepare = setup
    batches = _batches("gpt", STEPS, ragged=True)
    host0 = _host_state(setup)
    single = make_mesh({"data": 1}, jax.devices()[:1])
    out = {"host0": host0, "setup": setup,
           "single": _train_jit(single, setup, jax.device_put(host0, jax.devices()[0]), batches)}
    for name, sizes in MESHES.items():
        mesh = make_mesh(sizes)
        if name == "fsdp8":  # initialised directly into its shards, as the trainer does
            state, _ = create_train_state(model, tx, mesh, seed=0)
            out["fsdp8_init"] = jax.device_get(state)
        else:
            state = jax.device_put(host0, state_shardings(model, tx, mesh)[1])
        accum = 2 if name == "tensor4" else 1  # also: micro-batches sum to the full batch
        out[name] = {**_train_jit(mesh, setup, state, batches, accum), "mesh": mesh}
    data4 = make_mesh({"data": 4}, jax.devices()[:4])  # 2 rows per device: 2 micro-batches
    for name, mesh, accum in (("shard_map", out["data8"]["mesh"], 1),
                              ("shard_map_accum2", data4, 2)):
        state = jax.device_put(host0, state_shardings(model, tx, mesh)[1])
        out[name] = {**_train_jit(mesh, setup, state, batches, accum, explicit=True), "mesh": mesh}
    out["pmap"] = _train_pmap(setup, host0, batches, out["data8"]["mesh"])
    out["pmap_accum2"] = _train_pmap(setup, host0, batches, data4, 2)
    return out


DATA_PARALLEL = ("shard_map", "shard_map_accum2", "pmap", "pmap_accum2")


def test_parameters_drawn_on_the_host_equal_the_devices_draw(monkeypatch):
    """GPU meshes draw fresh parameters on the host CPU and then place them (`draws_on_host`: the
    GPU compiles the initialiser 6–8× slower). On CPU meshes the devices draw; the host path,
    forced here, must give the same values in the same shardings, for the train state and for
    `create_params` (fine-tuning's fresh heads)."""
    from jaxformer.train import state as state_module

    cfg, model, tx, _, _ = _setup("gpt")
    mesh = make_mesh({"fsdp": 8})
    assert not state_module.draws_on_host(mesh)
    drawn, shardings = create_train_state(model, tx, mesh, seed=0)
    fresh = state_module.create_params(model, shardings.params, seed=0)
    calls = []
    monkeypatch.setattr(state_module, "draws_on_host", lambda m: calls.append(m) or True)
    on_host, _ = create_train_state(model, tx, mesh, seed=0)
    fresh_on_host = state_module.create_params(model, shardings.params, seed=0)
    assert len(calls) == 2  # both went through the host path
    for got, want in ((on_host, drawn), (fresh_on_host, fresh)):
        assert jax.tree.map(lambda x: x.sharding, got) == jax.tree.map(lambda x: x.sharding, want)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
                     jax.device_get(got), jax.device_get(want))


def test_sharded_init_equals_single_device_init(runs):
    """`create_train_state` on fsdp=8 draws the same values as the unsharded init (threefry
    random bits do not depend on the sharding; the reference is compiled at another LLVM
    optimisation level, which may round the normal samples' last bit differently)."""
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
                 runs["fsdp8_init"], runs["host0"])


@pytest.mark.parametrize("name", [*MESHES, *DATA_PARALLEL])
def test_same_losses_and_parameters_on_every_mesh(runs, name):
    ref = runs["single"]
    got = runs[name]
    np.testing.assert_allclose(got["losses"], ref["losses"], rtol=LOSS_RTOL)
    assert ref["losses"][-1] < ref["losses"][0]  # it trains
    assert got["tokens"] == ref["tokens"]  # token sums of all devices
    # Adam's update barely depends on the gradient's scale: the norm catches a gradient summed
    # twice (e.g. by shard_map's autodiff and by the step's psum)
    np.testing.assert_allclose(got["grad_norms"], ref["grad_norms"], rtol=LOSS_RTOL)
    params = got["params"] if "params" in got else jax.device_get(got["state"].params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=PARAM_ATOL),
                 params, jax.device_get(ref["state"].params))


def test_shard_map_step_needs_its_psum(runs):
    """The equalities above are not vacuous. Without the psum (a step built without
    ``axis_name``) each device normalises its own rows: `jax.shard_map`'s replication check
    refuses to return such a loss as one value, and unchecked, device 0's result is another run."""
    cfg, model, tx, schedule, prepare = runs["setup"]
    mesh, ref = runs["data8"]["mesh"], runs["single"]
    host = _batches("gpt", STEPS, ragged=True)
    rows = [np.sum(b["inputs"] != 0, axis=1) - 1 for b in host]  # predicted tokens per row
    assert len(set(rows[0])) == BATCH  # a different count on each device of data=8
    assert ref["tokens"] == [r.sum() for r in rows]
    batches = [_to_global(b, mesh) for b in host]
    shardings = runs["shard_map"]["shardings"]
    state = jax.device_put(runs["host0"], shardings)
    local = make_train_step(model, tx, prepare, schedule)
    with pytest.raises(ValueError, match="out_specs"):
        data_parallel_step(local, mesh, shardings).lower(state, batches[0])
    P = jax.sharding.PartitionSpec
    unchecked = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P(shard_map.AXIS)),
                                      out_specs=(P(), P()), check_vma=False))
    unchecked = unchecked.lower(state, batches[0]).compile(FAST_COMPILE)
    losses = []
    for b in batches:
        state, metrics = unchecked(state, b)
        losses.append(float(metrics["loss"]))
    assert not np.allclose(losses, ref["losses"], rtol=100 * LOSS_RTOL), (losses, ref["losses"])
    gap = max(np.max(np.abs(a - b)) for a, b in zip(jax.tree.leaves(jax.device_get(state.params)),
                                                  jax.tree.leaves(ref["state"].params)))
    assert gap > 100 * PARAM_ATOL, gap


def test_shard_map_keeps_the_state_shardings(runs):
    """The shard_map step returns the state in the jit path's shardings (replicated on a data-only
    mesh), where evaluation and Orbax checkpoints expect it, and psums in compiled all-reduces."""
    run = runs["shard_map"]
    for leaf, sh in zip(jax.tree.leaves(run["state"]), jax.tree.leaves(run["shardings"])):
        assert leaf.sharding.is_equivalent_to(sh, leaf.ndim) and leaf.sharding.is_fully_replicated
    assert "all-reduce" in run["hlo"]


@pytest.mark.parametrize("name", list(MESHES))
def test_no_involuntary_rematerialization(runs, name):
    assert REMAT_WARNING not in runs[name]["stderr"], runs[name]["stderr"][-2000:]


def test_micro_batches_stay_on_their_devices(runs):
    """Gradient accumulation splits each device's own rows: no collective moves batch rows."""
    assert "collective-permute" not in runs["tensor4"]["hlo"]
    assert "all-to-all" not in runs["tensor4"]["hlo"]


def test_fsdp_shards_parameters_and_optimizer_state(runs):
    run = runs["fsdp8"]
    state, shardings = run["state"], run["shardings"]
    sharded = 0
    for leaf, sh in zip(jax.tree.leaves((state.params, state.opt_state)),
                        jax.tree.leaves((shardings.params, shardings.opt_state))):
        assert leaf.sharding.is_equivalent_to(sh, leaf.ndim)
        if "fsdp" not in jax.tree.leaves(tuple(sh.spec)):
            continue
        sharded += 1
        axis = [i for i, a in enumerate(sh.spec) if a == "fsdp"][0]
        shards = leaf.addressable_shards
        assert len(shards) == 8
        for s in shards:
            want = list(leaf.shape)
            want[axis] //= 8
            assert list(s.data.shape) == want  # each device holds 1/8 of the leaf
    # Every matrix has a d_model axis: params, Adam's mu and nu of them all are split.
    n_matrices = sum(p.ndim >= 2 for p in jax.tree.leaves(state.params))
    assert sharded >= 3 * n_matrices


def test_fsdp_compiled_state_memory_is_an_eighth(runs):
    """Per-device arguments of the compiled step (parameters + optimizer state + batch)."""
    single = runs["single"]["memory"].argument_size_in_bytes
    fsdp = runs["fsdp8"]["memory"].argument_size_in_bytes
    assert fsdp <= single / 8 * 1.10, (fsdp, single)


def test_restore_onto_a_different_mesh(runs, tmp_path):
    cfg, model, tx, _, _ = runs["setup"]
    state = runs["data8"]["state"]
    ckpt = Checkpointer(tmp_path, async_save=False)
    ckpt.save(STEPS, state)
    ckpt.close()
    target_mesh = make_mesh({"fsdp": 4, "tensor": 2})
    abstract, shardings = state_shardings(model, tx, target_mesh)
    ckpt = Checkpointer(tmp_path, async_save=False)
    restored, step = ckpt.restore(with_shardings(abstract, shardings))
    ckpt.close()
    assert step == STEPS and int(restored.step) == STEPS
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), jax.device_get(state))
    for leaf, sh in zip(jax.tree.leaves(restored), jax.tree.leaves(shardings)):
        assert leaf.sharding.is_equivalent_to(sh, leaf.ndim)
    kernel = restored.params["decoder"]["layer_0"]["ffn"]["wi"]["kernel"]  # [embed, mlp]
    assert kernel.addressable_shards[0].data.shape == (TINY["d_model"] // 4, TINY["d_ff"] // 2)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bert", "t5"])
def test_family_trains_on_mixed_mesh(family):
    """First loss equals the unsharded loss of the same prepared batch; then it trains."""
    setup = cfg, model, tx, schedule, prepare = _setup(family)
    host0 = _host_state(setup)
    mesh = make_mesh(MESHES["mixed"])
    state = jax.device_put(host0, state_shardings(model, tx, mesh)[1])
    batch = _batches(family, 1)[0]
    run = _train_jit(mesh, setup, state, [batch] * 3)  # step 0 has learning rate 0 (warm-up)
    assert REMAT_WARNING not in run["stderr"], run["stderr"][-2000:]
    obj_key = jax.random.split(host0.step_key())[0]  # the key the train step prepares with
    sums = jax.jit(make_eval_step(model, prepare), compiler_options=FAST_COMPILE)(
        host0.params, batch, obj_key)
    np.testing.assert_allclose(run["losses"][0], sums["loss"] / sums["weight"], rtol=LOSS_RTOL)
    assert run["losses"][2] < run["losses"][0]


# ------------------------------------------------------------------------------------------------
# Mesh construction, rules and configs (no compilation).


def test_a_mesh_too_big_for_the_devices_says_how_to_get_them():
    """Issue 60: ``context=4`` on one device said "1 devices are not divisible by 4", and a
    multi-slice mesh compiled without ``--num_slices`` "2 devices are not divisible by 4"."""
    with pytest.raises(ValueError, match=r": 1 device is not divisible by 4; on a CPU host, simulate "
                                         r"4 devices by starting with XLA_FLAGS=--xla_force_host_"
                                         r"platform_device_count=4$"):
        mesh_shape({"context": 4}, 1)
    with pytest.raises(ValueError, match=r"has 8 devices but 2 are available; .*XLA_FLAGS=--xla_"
                                         r"force_host_platform_device_count=8$"):
        mesh_shape({"data": 2, "context": 4}, 2)
    with pytest.raises(ValueError, match=r"2 devices are not divisible by 4 \(mesh.dcn_data=2: 2 "
                                         r"slices of 2 of the 4 devices; the other mesh sizes are per "
                                         r"slice. For 2 slices of a TPU topology pass "
                                         r"--num_slices=2, else lower the sizes\)$"):
        mesh_shape({"fsdp": 4, "dcn_data": 2}, 4)
    with pytest.raises(ValueError, match=r"available; set one axis to -1 to fill the rest$"):
        mesh_shape({"data": 2, "fsdp": 2, "tensor": 1}, 8)  # more devices than the mesh: no hint
    with pytest.raises(ValueError, match=r"6 devices are not divisible by 4$"):
        mesh_shape({"tensor": 4}, 6)  # enough devices, a size that does not divide them


def test_mesh_shape_fills_and_validates():
    assert mesh_shape({}, 8) == {"data": 8, "fsdp": 1, "expert": 1, "context": 1, "tensor": 1}
    assert mesh_shape({"data": -1, "tensor": 2}, 8) == {"data": 4, "fsdp": 1, "expert": 1,
                                                        "context": 1, "tensor": 2}
    assert mesh_shape({"data": 1, "fsdp": -1, "tensor": 4}, 8)["fsdp"] == 2
    with pytest.raises(ValueError, match="has 4 devices but 8 are available"):
        mesh_shape({"data": 2, "fsdp": 2, "tensor": 1}, 8)
    with pytest.raises(ValueError, match="not divisible by 3"):
        mesh_shape({"tensor": 3}, 8)
    # data's default -1 gives way to another -1 (the README's `--config.mesh.fsdp=-1` commands
    # used to fail with "at most one axis may be -1", data's default being the other)
    assert mesh_shape({"data": -1, "fsdp": -1, "tensor": 1}, 8) == {"data": 1, "fsdp": 8,
                                                                     "expert": 1, "context": 1,
                                                                     "tensor": 1}
    assert mesh_shape({"fsdp": -1, "tensor": 4}, 8) == {"data": 1, "fsdp": 2, "expert": 1,
                                                     "context": 1, "tensor": 4}
    with pytest.raises(ValueError, match="at most one axis"):
        mesh_shape({"fsdp": -1, "tensor": -1}, 8)
    with pytest.raises(ValueError, match="unknown mesh axes"):
        mesh_shape({"model": 2}, 8)
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    assert mesh.axis_names == ("data", "fsdp", "expert", "context", "tensor")
    assert mesh.size == jax.device_count()
    assert describe(mesh) == "data=2 fsdp=2 expert=1 context=1 tensor=2 (8 devices, 1 process)"
    assert describe(make_mesh({"data": 1}, jax.devices()[:1])).endswith("(1 device, 1 process)")


def test_shard_map_step_refuses_a_sharded_state_mesh():
    with pytest.raises(ValueError, match=r"data-only mesh, got \{'data': 4, 'fsdp': 2"):
        data_parallel_step(lambda state, batch: (state, {}), make_mesh({"data": 4, "fsdp": 2}))


def test_indivisible_dimension_names_the_parameter():
    cfg, model, tx, _, _ = _setup("gpt")
    with pytest.raises(ValueError, match=r"self_attn.*\(4, 16\).*not divisible by mesh.tensor=8"):
        param_shardings(model.logical_axes(), model.abstract(), make_mesh({"tensor": 8}))
    with pytest.raises(ValueError, match="data.batch_size=12 is not divisible by the 8 batch"):
        check_batch_size(make_mesh({"fsdp": 8}), 12)
    with pytest.raises(ValueError, match="micro-batch"):
        check_batch_size(make_mesh({"data": 4, "tensor": 2}), 8, grad_accum_steps=4)


def test_head_dim_is_the_logical_name_of_the_per_head_width():
    """A user's rules shard the per-head width by its name ``head_dim``; a rule for the retired
    name ``kv`` (which would match nothing and replicate silently) is refused with the new name."""
    cfg, model, *_ = _setup("gpt")
    rules = tuple((name, "tensor" if name == "head_dim" else None) for name, _ in LOGICAL_AXIS_RULES)
    shardings = param_shardings(model.logical_axes(), model.abstract(), make_mesh({"tensor": 2}), rules)
    query = shardings["decoder"]["layer_0"]["self_attn"]["query"]["kernel"]  # [D, H, Dh]
    assert tuple(query.spec) == (None, None, "tensor")
    renamed = r"names 'kv', which is now called 'head_dim'.*\('head_dim', 'tensor'\)"
    with pytest.raises(ValueError, match=renamed):
        param_shardings(model.logical_axes(), model.abstract(), make_mesh({"tensor": 2}),
                        (("kv", "tensor"),))
    with pytest.raises(ValueError, match="'head_dim'"):
        sharded_jit(lambda x: x, make_mesh({"tensor": 2}), rules=(("kv", None),))


def test_constraints_are_no_ops_without_a_mesh(runs):
    """`model.apply` outside `sharded_jit` (tests, generation) ignores the logical constraints and
    equals the same forward traced under a tensor-parallel mesh."""
    cfg, model, *_ = runs["setup"]
    params = runs["host0"].params
    tokens = _batches("gpt", 1)[0]["inputs"]
    apply = lambda p, t: model.apply(p, t)
    plain = jax.jit(apply, compiler_options=FAST_COMPILE)(params, tokens)
    mesh = make_mesh(MESHES["tensor4"])
    fwd = sharded_jit(apply, mesh)
    tokens = _to_global({"t": tokens}, mesh)["t"]
    sharded = fwd.lower(params, tokens).compile(FAST_COMPILE)(params, tokens)
    assert sharded.sharding.spec[-1] == "tensor"  # logits split over the vocabulary
    np.testing.assert_allclose(sharded, plain, rtol=1e-5, atol=1e-5)


CONFIGS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "configs", "*_tiny.py")))


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_tiny_configs_fit_every_test_mesh(path):
    """``--config.mesh.*`` overrides alone move each tiny config between the meshes above."""
    config = load_config(path)
    cfg = ModelConfig.from_dict(config.model)
    model = build_model(cfg)
    for sizes in MESHES.values():
        mesh = make_mesh(sizes)
        check_batch_size(mesh, config.data.batch_size, config.optimizer.grad_accum_steps)
        param_shardings(model.logical_axes(), model.abstract(), mesh)  # raises if indivisible


# ------------------------------------------------------------------------------------------------
# Multi-host start-up decisions and the memory planner.


def test_distributed_trigger_from_environment():
    assert distributed_requested({}) is None
    assert distributed_requested({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"}) == \
        "JAX_COORDINATOR_ADDRESS"
    assert distributed_requested({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "4"}) == "SLURM"
    assert distributed_requested({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "1"}) is None
    assert distributed_requested({"OMPI_COMM_WORLD_SIZE": "2"}) == "OpenMPI"
    assert distributed_requested({"TPU_WORKER_HOSTNAMES": "a,b"}) == "TPU"
    assert distributed_requested({"JAXFORMER_DISTRIBUTED": "0",
                                  "JAX_COORDINATOR_ADDRESS": "x:1"}) is None


def test_plan_matches_the_real_sharded_state(runs):
    """The planner's abstract per-device bytes equal what the fsdp=8 run actually holds."""
    from jaxformer import plan
    from jaxformer.train.config import base_config

    cfg, *_ = runs["setup"]
    config = base_config()
    config.model.update(preset(FAMILY["gpt"][0], **TINY))
    config.data.batch_size, config.data.seq_len = BATCH, LEN
    config.data.tokenizer.vocab_size = cfg.vocab_size
    config.optimizer = default_optimizer_config("gpt3", peak_lr=1e-2, warmup_steps=1, eps=1e-3)
    config.num_train_steps = 10
    config.mesh = ml_collections.ConfigDict(MESHES["fsdp8"])
    report = plan.plan(config, devices=8, compile=False)
    state = runs["fsdp8"]["state"]
    held = lambda tree: sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(tree))
    assert report["params_bytes"]["per_device"] == held(state.params)
    assert report["opt_state_bytes"]["per_device"] == held(state.opt_state)
    assert report["parameters"] == sum(x.size for x in jax.tree.leaves(state.params))
    # 6N + attention, N the matmul weights (projection kernels + the tied unembedding): by hand.
    d = TINY["d_model"]
    n_dense = TINY["num_layers"] * (4 * d * d + 2 * d * TINY["d_ff"]) + TINY["vocab_size"] * d
    attn = 12 * BATCH * TINY["d_model"] * TINY["num_layers"] * LEN ** 2 / 2
    assert report["model_flops_per_step"] == 6 * n_dense * BATCH * LEN + attn


def test_plan_gpt2_small_parameters_and_flops():
    """GPT-2 small: 124,439,808 parameters, stored with the preset's 47 vocabulary padding rows
    (50,304 = 393 · 128); per token 6N' + 6·n_layer·n_ctx·d (Kaplan et al. 2020), N' the matmul
    weights: per layer QKVO 4·d² and the FFN 2·d·4d, plus the tied unembedding V·d, which
    multiplies the padding rows too."""
    from jaxformer import plan

    config = plan.preset_config("gpt2_small", batch=8, seq_len=1024, mesh="fsdp=8")
    report = plan.plan(config, devices=8, compile=False)
    assert report["parameters"] == 124_439_808 + 47 * 768
    d, layers, vocab = 768, 12, 50304
    n_dense = layers * (4 * d * d + 2 * d * 4 * d) + vocab * d
    assert n_dense == 123_532_032 + 47 * 768  # without positions (a lookup), biases and norm scales
    assert report["flops_per_token"] == pytest.approx(6 * n_dense + 6 * 12 * 1024 * 768)
    assert report["params_bytes"]["per_device"] == pytest.approx(
        report["params_bytes"]["total"] / 8, rel=0.01)
    assert report["opt_state_bytes"]["total"] == pytest.approx(
        2 * report["params_bytes"]["total"], rel=1e-6)
    assert math.isclose(report["devices"], 8)
    # checked like train.py does, before compiling (was an IndivisibleError from the child)
    with pytest.raises(ValueError, match="data.batch_size=4 is not divisible by the 8 batch"):
        plan.plan(plan.preset_config("gpt2_small", batch=4, seq_len=64, mesh="fsdp=8"),
                  devices=8, compile=False)
    assert plan.plan(plan.preset_config("gpt2_small", batch=8, seq_len=64, mesh="fsdp=-1"),
                     devices=8, compile=False)["mesh"] == {"data": 1, "fsdp": 8, "expert": 1,
                                                           "context": 1, "tensor": 1}


def test_a_mesh_the_heads_do_not_divide_fails_before_any_work(tmp_path):
    """The trainer refuses tensor=8 for 4 heads, naming the field, before it trains a tokenizer
    or writes config.json."""
    from jaxformer.train.config import set_key
    from jaxformer.train.loop import Trainer

    config = load_config(os.path.join(os.path.dirname(__file__), "..", "configs",
                                      "gpt_pretrain_tiny.py"))
    set_key(config, "mesh.tensor", 8)
    with pytest.raises(ValueError, match=r"cannot be sharded .* not divisible by mesh.tensor=8"):
        Trainer(config, tmp_path / "run8")
    assert not list((tmp_path / "run8").glob("*"))


# --------------------------------------------------------------------------------------------------
# docs/scaling.md's table of the tensor sizes each preset takes (bench/tensor_sizes.py).

@functools.cache
def _tensor_sizes_module():
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), os.pardir, "bench", "tensor_sizes.py")
    spec = importlib.util.spec_from_file_location("tensor_sizes", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _tensor_size_rows() -> list[dict]:
    return _tensor_sizes_module().rows()


def test_tensor_sizes_are_the_common_divisors_of_heads_kv_heads_d_ff_and_vocabulary():
    """What the trainer's sharding check accepts on ``tensor=t`` equals, by arithmetic, the ``t``
    dividing the heads, kv heads, d_ff and the padded vocabulary rows of every preset."""
    for row in _tensor_size_rows():
        cfg = ModelConfig.from_dict(preset(row["preset"]))
        rows = math.ceil(cfg.vocab_size / cfg.vocab_pad_multiple) * cfg.vocab_pad_multiple
        dims = (cfg.num_heads, cfg.num_kv_heads, cfg.d_ff) + (() if cfg.image_size else (rows,))
        assert row["tensor"] == [t for t in range(2, 129) if all(d % t == 0 for d in dims)], row
    by_name = {r["preset"]: r["tensor"] for r in _tensor_size_rows()}
    assert 8 not in by_name["gpt2_small"] and 8 in by_name["gpt2_medium"]  # issue 60


def test_the_docs_tensor_sizes_table_is_generated_from_the_presets():
    sizes = _tensor_sizes_module()
    with open(os.path.join(os.path.dirname(__file__), os.pardir, "docs", "scaling.md")) as f:
        doc = f.read()
    start = "<!-- tensor-sizes: generated by python bench/tensor_sizes.py --markdown -->\n"
    quoted = doc.split(start, 1)[1].split("\n<!-- /tensor-sizes -->", 1)[0]
    assert quoted == sizes.markdown(_tensor_size_rows()), (
        "docs/scaling.md's tensor-size table is stale: paste `python bench/tensor_sizes.py --markdown`")


def test_gpt2_small_refuses_tensor_8_and_gpt2_medium_plans_it():
    """The table's example through the planner (the trainer's checks, before compiling)."""
    from jaxformer import plan

    with pytest.raises(ValueError, match=r"size 12\) is not divisible by mesh.tensor=8"):
        plan.plan(plan.preset_config("gpt2_small", batch=8, seq_len=64, mesh="tensor=8"),
                  devices=8, compile=False)
    report = plan.plan(plan.preset_config("gpt2_medium", batch=8, seq_len=64, mesh="tensor=8"),
                       devices=8, compile=False)
    assert report["mesh"]["tensor"] == 8


@pytest.mark.parametrize("with_bias", [False, True])
def test_blockwise_cross_entropy_runs_under_shard_map_and_equals_one_device(with_bias):
    """The blockwise loss (`ops.losses.blockwise_cross_entropy`, the trainer's default for a large
    vocabulary) inside `jax.shard_map` over a 4-way data axis, with the weights made device-varying
    as the shard_map step makes them: its loop carries and custom-VJP gradients must carry the
    manual-axis types (jax's check_vma refused both before), and the loss and gradients summed
    over the shards equal the one-device ones."""
    from jax.sharding import PartitionSpec as P

    from jaxformer.ops.losses import blockwise_cross_entropy

    r = np.random.default_rng(0)
    h = r.normal(size=(8, 6, 16)).astype(np.float32)
    w = r.normal(size=(37, 16)).astype(np.float32)  # 37 columns: the last block is ragged
    bias = r.normal(size=(37,)).astype(np.float32) if with_bias else None
    labels = r.integers(0, 37, size=(8, 6)).astype(np.int32)

    def loss_sum(h, w, bias, labels):
        return blockwise_cross_entropy(h, w, bias, labels, block_size=8, label_smoothing=0.1)[0].sum()

    grad = jax.value_and_grad(loss_sum, argnums=(0, 1, 2) if with_bias else (0, 1))
    want_loss, want_grads = grad(h, w, bias, labels)

    def per_shard(h, w, bias, labels):
        w, bias = jax.lax.pcast((w, bias), "data", to="varying")
        loss, grads = grad(h, w, bias, labels)
        return jax.lax.psum(loss, "data"), grads[0], jax.lax.psum(grads[1:], "data")

    mesh = make_mesh({"data": 4}, jax.devices()[:4])
    run = jax.shard_map(per_shard, mesh=mesh, in_specs=(P("data"), P(), P(), P("data")),
                        out_specs=(P(), P("data"), P()))
    loss, dh, rest = jax.jit(run)(h, w, bias, labels)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(dh, want_grads[0], rtol=1e-4, atol=1e-6)
    for got, want in zip(rest, want_grads[1:], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
