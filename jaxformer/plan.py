"""Memory and compute planning from a config alone — nothing is allocated (`plan`); its command
line is `jaxformer.cli.plan`:

    python -m jaxformer.cli.plan --config configs/gpt_pretrain_tiny.py --config.mesh.fsdp=8
    python -m jaxformer.cli.plan --preset gpt2_small --batch 8 --seq_len 1024 --mesh fsdp=8
    python -m jaxformer.cli.plan ... --json plan.json --nocompile

The report (the CLI prints it as a table and a JSON line; ``--json PATH`` also writes it) holds

* the parameter count ``N`` (from `jax.eval_shape` of ``model.init``: what is stored, the
  padding rows of a padded vocabulary included, ``model.vocab_pad_multiple``);
* model FLOPs per step and per token (`jaxformer.flops.train_step_flops`, which the trainer logs too;
  training = forward + backward, no rematerialisation)::

      6 · Σ_p |p| · tokens(p)  +  Σ_attention 12 · B · T_q · T_k · H · Dh · (½ if causal)

  i.e. 6N per token for every matmul weight (Kaplan et al. 2020 §2.1): the ``kernel`` of each
  projection, and the token table where it is also the output projection (tied LM / MLM head).
  Lookup tables (positions, token types, relative-position buckets, a token table used only for
  lookup), biases and norm scales are left out. Plus QKᵀ and AV of each attention layer
  (Chowdhery et al. 2022, App. B; causal self-attention computes half the score matrix).
  Encoder parameters see the ``seq_len`` input tokens, decoder parameters and the output
  projection the ``target_len`` target tokens, the pooler and sequence-classifier heads one
  row each. Per token = per step / (batch · tokens per row);
* per-device bytes of parameters and optimizer state, exact, from the state's shardings on the
  configured mesh (`jaxformer.train.state.state_shardings`);
* activations and temporaries, from XLA: the train step is lowered with abstract inputs
  (``jax.jit(step).lower(...).compile().memory_analysis()``) and its temp bytes, argument/output
  bytes and the compiled FLOP count (`cost_analysis`, per device) are reported.

``--topology v5e:2x2`` (etc.; ``h100:8`` for GPUs): the step is compiled for that slice's chips by
their own compiler on this host (`jaxformer.parallel.topology`: libtpu, or jax's CUDA plugin), so the
activation bytes are the accelerator compiler's;
`python -m jaxformer.cli.compile` reports more of that program (collectives, roofline).

Devices: the plan is for ``--devices`` devices (default: this machine's count if the mesh fits it,
else the product of the mesh sizes). Parameter/optimizer bytes need no devices (an `AbstractMesh`).
When the mesh's devices exist here the step is compiled for them (real GPU/TPU numbers); when they
do not, it is compiled in a child process on that many simulated CPU devices
(``JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=N``): the state bytes are
exact, the activation bytes are the CPU compiler's, an estimate of what the accelerator compiler
allocates (fusion and layout choices differ). ``--nocompile`` skips that step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import subprocess
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import AbstractMesh, AxisType, Mesh

from jaxformer.checkpoint import with_shardings
from jaxformer.config import ModelConfig
from jaxformer.data.preference import PAIR_FEATURES
from jaxformer.flops import train_step_flops
from jaxformer.models import build_model, lora
from jaxformer.models.presets import preset
from jaxformer.objectives import bind_objective, check_data_task
from jaxformer.ops.kernel_choice import target_platform
from jaxformer.parallel.mesh import (
    DCN_AXES,
    MESH_AXES,
    MeshSettings,
    check_batch_size,
    make_mesh,
    mesh_shape,
)
from jaxformer.parallel.partition import sharded_jit
from jaxformer.parallel.rules import batch_sharding, param_shardings
from jaxformer.parallel.topology import Topology, topology_devices
from jaxformer.train.config import base_config
from jaxformer.train.dpo_run import DPO_OBJECTIVES, DPOLoss
from jaxformer.train.inputs import ImageInputs, inputs_of
from jaxformer.train.lora_run import adapted, trainable_abstract
from jaxformer.train.setup import ResolvedConfig, resolve_config
from jaxformer.train.state import state_shardings
from jaxformer.train.step import StepHooks, make_train_step
from jaxformer.vocab import SpecialTokens

CHILD_FLAG = "--plan_compile_child"  # `jaxformer.cli.plan`: compile on simulated devices
_OBJECTIVE = {"decoder": "clm", "encoder": "mlm", "encoder_decoder": "seq2seq"}


def preset_config(name: str, *, batch: int, seq_len: int, target_len: int | None = None,
                  mesh: str = "") -> ml_collections.ConfigDict:
    """A training config for model preset ``name`` with the family's usual objective."""
    c = base_config()
    c.name = name
    c.model.update(preset(name))
    c.objective.name = _OBJECTIVE[c.model["family"]]
    c.data.batch_size, c.data.seq_len = batch, seq_len
    c.data.target_len = target_len or seq_len
    c.data.tokenizer.vocab_size = min(c.data.tokenizer.vocab_size, c.model.vocab_size)  # fits
    for part in filter(None, (p.strip() for p in mesh.split(","))):
        axis, _, size = part.partition("=")
        if axis not in MESH_AXES + DCN_AXES or not size.lstrip("-").isdigit():
            raise ValueError(f"--mesh {mesh!r}: expected 'axis=size,…' with axes "
                             f"{MESH_AXES + DCN_AXES}")
        c.mesh[axis] = int(size)
    return c


def abstract_batch(data_cfg, model_cfg: ModelConfig, task: str) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes of one global batch as the pipeline yields it for data ``task``
    (`Objective.data_task`; `jaxformer.data.pipeline`; an image model's images:
    `jaxformer.train.inputs.ImageInputs.batch_shapes`)."""
    if not inputs_of(model_cfg).needs_tokenizer:
        return {k: jax.ShapeDtypeStruct(shape, dtype)
                for k, (shape, dtype) in ImageInputs.batch_shapes(data_cfg, model_cfg).items()}
    b, out = data_cfg.batch_size, {}
    features = {"inputs": data_cfg.seq_len}
    if model_cfg.family == "encoder_decoder":
        features["targets"] = data_cfg.target_len
    for name, length in features.items():
        for suffix in ("", "_segment_ids", "_positions"):
            out[name + suffix] = jax.ShapeDtypeStruct((b, length), jnp.int32)
    if task == "classify":
        out["label"] = jax.ShapeDtypeStruct((b,), jnp.int32)
    if task == "sft":
        out["inputs_loss_mask"] = jax.ShapeDtypeStruct((b, data_cfg.seq_len), jnp.int32)
    for name in PAIR_FEATURES.get(task, ()):  # DPO's pairs, `jaxformer.data.preference`
        out[name] = jax.ShapeDtypeStruct((b, features[name.partition("_")[0]]), jnp.int32)
    if task == "sentence_pairs":  # `jaxformer.data.sentence_pairs`
        out["inputs_token_types"] = jax.ShapeDtypeStruct((b, data_cfg.seq_len), jnp.int32)
        out["nsp_label"] = out["nsp_weight"] = jax.ShapeDtypeStruct((b,), jnp.int32)
    return out


def state_bytes(abstract, shardings) -> dict:
    """Total and per-device bytes of a tree of ShapeDtypeStructs under its shardings (the largest
    shard on any device; shardings here are even, so every device holds the same)."""
    leaves = jax.tree.leaves(abstract)
    shards = jax.tree.leaves(shardings)
    total = sum(math.prod(a.shape) * a.dtype.itemsize for a in leaves)
    per_device = sum(math.prod(s.shard_shape(a.shape)) * a.dtype.itemsize
                     for a, s in zip(leaves, shards))
    return {"total": int(total), "per_device": int(per_device)}


def _setup(config, mesh):
    """(model_cfg, abstract state, state shardings, step function) for ``config`` on ``mesh``."""
    return _built(resolve_config(config), mesh)  # validated; init_from's architecture if it has one


def _built(resolved: ResolvedConfig, mesh):
    """`_setup` of a resolved config: the step reads its typed sections (`TrainSettings`)."""
    model_cfg, tx, settings = resolved.model_cfg, resolved.tx, resolved.settings
    model = build_model(model_cfg)
    trained, hooks, _, _ = planned_features(resolved, model, mesh)
    abstract, shardings = state_shardings(model, tx, mesh, trained)
    objective = settings.objective
    prepare = bind_objective(objective.name, settings.objective_options,
                             SpecialTokens(model_cfg.vocab_size),
                             decoder_start_id=objective.decoder_start_id)
    step = make_train_step(model, tx, prepare, resolved.schedule, objective=objective, run=settings,
                           hooks=hooks)
    return model_cfg, abstract, shardings, step


def planned_features(resolved: ResolvedConfig, model, mesh) -> tuple[Any, StepHooks, Any, Any]:
    """(trained parameters or None, step hooks, frozen parameters or None, their shardings) of the
    features whose memory a plan counts, abstract: LoRA (`jaxformer.train.lora_run`: adapters
    trained, the base frozen) and DPO (`jaxformer.train.dpo_run`: the reference frozen, which is
    LoRA's base when LoRA is on, else a second copy of the parameters)."""
    settings = resolved.settings
    lora_cfg, trained, hooks, frozen = settings.optimizer.lora, None, StepHooks(), None
    if lora_cfg.rank:
        trained, frozen = trainable_abstract(model, lora_cfg), model.abstract()
        hooks = StepHooks(model_params=functools.partial(adapted, lora.lora_scale(lora_cfg)))
    if settings.objective.name in DPO_OBJECTIVES:
        hooks = dataclasses.replace(hooks, loss=DPOLoss(settings.objective_options))
        frozen = model.abstract()
    if frozen is None:
        return trained, hooks, None, None
    return trained, hooks, frozen, param_shardings(model.logical_axes(), frozen, mesh)


def compile_train_step(config, mesh) -> tuple[jax.stages.Compiled, float]:
    """(the train step of ``config`` compiled for ``mesh`` from abstract inputs, seconds to lower
    and compile it). The devices may be compile-only (`jaxformer.parallel.topology`)."""
    resolved = resolve_config(config)  # validated; init_from's architecture if it has one
    model_cfg, abstract, shardings, step = _built(resolved, mesh)
    _, _, frozen, frozen_shardings = planned_features(resolved, build_model(model_cfg), mesh)
    settings = resolved.settings
    task = check_data_task(settings.objective.name, settings.objective_options).data_task
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_sharding(mesh, len(v.shape)))
             for k, v in abstract_batch(settings.data, model_cfg, task).items()}
    fn = sharded_jit(step, mesh, in_shardings=(shardings, None, frozen_shardings),
                     out_shardings=(shardings, None), donate_argnums=(0,))
    frozen = None if frozen is None else with_shardings(frozen, frozen_shardings)
    start = time.perf_counter()
    compiled = fn.lower(with_shardings(abstract, shardings), batch, frozen).compile()
    return compiled, time.perf_counter() - start


def compiled_memory(compiled) -> dict[str, int]:
    """Per-device bytes of a compiled program (XLA's buffer assignment) and the live peak."""
    mem = compiled.memory_analysis()
    out = {k: int(getattr(mem, k + "_in_bytes")) for k in
           ("argument_size", "output_size", "alias_size", "temp_size")}
    # Live at once: inputs, temporaries, and outputs that do not reuse (alias) a donated input.
    out["peak_estimate"] = (out["argument_size"] + out["temp_size"] + out["output_size"]
                            - out["alias_size"])
    return out


def compiled_cost(compiled) -> dict[str, float]:
    """FLOPs and bytes accessed per device as the backend reports them (absent where it does
    not). With ``scan_layers`` a loop body is counted once, not once per layer."""
    cost = compiled.cost_analysis()
    cost = (cost[0] if cost else {}) if isinstance(cost, list) else (cost or {})
    return {k: float(cost[key]) for k, key in (("flops", "flops"), ("bytes", "bytes accessed"))
            if cost.get(key, -1) > 0}


def compile_step(config, mesh) -> dict:
    """Compile the train step for ``mesh`` from abstract inputs; XLA's memory and FLOP figures."""
    compiled, _ = compile_train_step(config, mesh)
    return {**compiled_memory(compiled),
            "xla_flops_per_device": compiled_cost(compiled).get("flops", 0.0),
            "platform": mesh.devices.flat[0].platform}


def plan_devices(mesh: MeshSettings, requested: int = 0) -> int:
    """Devices to plan for: ``requested``, else this machine's count if the mesh fits, else the
    product of the explicit mesh sizes."""
    if requested:
        return requested
    have, sizes = jax.device_count(), list(dataclasses.asdict(mesh).values())
    explicit = math.prod(v for v in sizes if v != -1)
    if have % explicit == 0 and (have == explicit or -1 in sizes):
        return have
    return explicit


def compile_on_topology(config, topology: Topology) -> tuple[jax.stages.Compiled, float, Mesh]:
    """(train step compiled for the compile-only devices of ``topology``, seconds, its mesh);
    kernel choices are checked against the topology's platform, not this machine's."""
    mesh = make_mesh(config.mesh, topology_devices(topology))
    with target_platform(topology.chip.platform):
        compiled, seconds = compile_train_step(config, mesh)
    return compiled, seconds, mesh


def plan(config, *, devices: int = 0, compile: bool = True, argv: list[str] | None = None,
         topology: Topology | None = None) -> dict:
    """The planning report (a JSON-able dict) for ``config``; with ``topology``, for its chips
    (compiled by the accelerator's own compiler, `jaxformer.parallel.topology`)."""
    if topology is not None:
        devices = len(topology_devices(topology))
    resolved = resolve_config(config)
    settings, data = resolved.settings, resolved.settings.data
    n = plan_devices(settings.mesh, devices)
    sizes = mesh_shape(settings.mesh, n)
    abstract_mesh = AbstractMesh(tuple(sizes.values()), tuple(sizes),
                                 axis_types=(AxisType.Auto,) * len(sizes))
    check_batch_size(abstract_mesh, data.batch_size, settings.optimizer.grad_accum_steps)
    with target_platform(topology.chip.platform) if topology else contextlib.nullcontext():
        model_cfg, abstract, shardings, _ = _built(resolved, abstract_mesh)
        attention = model_cfg.attention_summary(sizes["context"])  # for the target platform
    params, model = abstract.params, build_model(model_cfg)
    weights = model.abstract()  # the model's (LoRA trains adapters: `params`, counted in bytes)
    report = {
        "name": settings.name, "family": model_cfg.family, "mesh": sizes,
        "attention": attention,
        "devices": n, "batch": data.batch_size, "seq_len": data.seq_len,
        "target_len": data.target_len if model_cfg.family == "encoder_decoder" else None,
        "param_dtype": model_cfg.param_dtype, "dtype": model_cfg.dtype,
        "parameters": int(sum(math.prod(p.shape) for p in jax.tree.leaves(weights))),
        **train_step_flops(settings, weights),
        "params_bytes": state_bytes(params, shardings.params),
        "opt_state_bytes": state_bytes(abstract.opt_state, shardings.opt_state),
    }
    _, _, frozen, frozen_shardings = planned_features(resolved, model, abstract_mesh)
    if frozen is not None:  # LoRA's base, DPO's reference: parameters kept beside the state
        report["frozen_bytes"] = state_bytes(frozen, frozen_shardings)
    if compile and topology is not None:
        compiled, seconds, _ = compile_on_topology(config, topology)
        report["compiled"] = {**compiled_memory(compiled), "simulated": False,
                              "xla_flops_per_device": compiled_cost(compiled).get("flops", 0.0),
                              "platform": topology.chip.platform, "compile_s": seconds}
    elif compile:
        if n <= jax.device_count():
            mesh = make_mesh(sizes, jax.devices()[:n])
            report["compiled"] = {**compile_step(config, mesh), "simulated": False}
        else:
            report["compiled"] = {**_compile_in_child(n, argv), "simulated": True}
    return report


def _compile_in_child(n: int, argv: list[str] | None) -> dict:
    if argv is None:
        raise ValueError(f"the mesh needs {n} devices but {jax.device_count()} exist here; pass "
                         "argv (the CLI does) to compile on simulated CPU devices")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n}")
    proc = subprocess.run([sys.executable, "-m", "jaxformer.cli.plan", *argv, CHILD_FLAG,
                           f"--devices={n}"],
                          env=env, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        raise RuntimeError(f"compiling on {n} simulated CPU devices failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])
