"""Knowledge distillation (Hinton et al. 2015; DistilBERT, Sanh et al. 2019): a teacher and its loss.

The config's model is the student; ``distill.teacher`` names a trained model (a jaxformer run or a
Hugging Face directory, opened like ``init_from``: `jaxformer.train.setup.open_pretrained`). Per
batch, on the positions the objective weights (w: masked tokens for MLM, every target for causal
LM, one per row for classification), the student minimises (DistilBERT §3)

    L = α·T²·Σ w·KL(softmax(z_t/T) ‖ softmax(z_s/T)) + β·Σ w·CE(z_s, y) + γ·Σ w·(1 − cos(h_s, h_t))

divided by Σ w like every loss of the trainer; z are the logits (MLM / LM logits, or the class
logits), h the last hidden states the head reads (classification: pooled by ``model.pooling``),
T the temperature. T² keeps the soft term's gradient scale independent of T (Hinton et al. §2).
The teacher runs deterministically, without gradients (`jax.lax.stop_gradient`), inside the same
jitted step, its parameters sharded on the student's mesh by the same logical-axis rules; it is
never part of the train state, so checkpoints hold the student only and a resume reloads it.

``distill.init_student``: the student starts from the teacher's layers 0, 2, 4, … (DistilBERT §3,
"taking one layer out of two"), its embeddings and heads (`select_layers`). A DistilBERT-shaped
encoder student (``type_vocab_size=0``, ``pooler=False``) leaves the teacher's token-type table and
pooler out (`dropped_token_types`), and exports as a Hugging Face DistilBERT.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from jaxformer.checkpoint import load_run_params
from jaxformer.config import ModelConfig, architecture_fields
from jaxformer.convert.hf import load_hf
from jaxformer.models import Model, build_model
from jaxformer.ops.heads import pool
from jaxformer.ops.losses import cosine_distance, soft_target_kl
from jaxformer.parallel.rules import param_shardings
from jaxformer.train.distill_config import DistillSettings, settings
from jaxformer.train.extension import Extension
from jaxformer.train.setup import Built, Pretrained, ResolvedConfig, merge_backbone, open_pretrained
from jaxformer.train.state import TrainState, create_params, create_train_state
from jaxformer.train.step import StepHooks

TEACHER_KEY = "distill.teacher"
LAYER_COUNTS = ("num_layers", "num_encoder_layers", "num_decoder_layers")
STACKS = {"encoder": "encoder", "decoder": "decoder"}  # family → the stack's parameter module


def with_teacher_tokenizer(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """``config``, or a copy whose ``data.tokenizer.path`` is the teacher's tokenizer when it
    distils, names no tokenizer and has no ``init_from`` (whose tokenizer is used then): the student
    must read the token ids the teacher was trained on (a given tokenizer that differs from the
    teacher's is warned about)."""
    if settings(config) is None:
        return config
    teacher, given = open_pretrained(config, TEACHER_KEY), config.data.tokenizer.get("path")
    if given and teacher.tokenizer and Path(given).is_file() and Path(teacher.tokenizer).is_file() \
            and Path(given).read_bytes() != Path(teacher.tokenizer).read_bytes():
        logging.warning("data.tokenizer.path=%s is not the teacher's tokenizer %s: the student's "
                        "token ids must mean what the teacher's do", given, teacher.tokenizer)
    if given or config.init_from or not teacher.tokenizer:
        return config
    derived = copy.deepcopy(config)
    with derived.unlocked():
        derived.data.tokenizer.path = teacher.tokenizer
    return derived


def check_student(student: ModelConfig, teacher: ModelConfig, s: DistillSettings) -> None:
    """ValueError naming every ``model.*`` field the student must share with the teacher: family
    and head; the output size (``vocab_size`` and its padding, or ``num_classes`` for
    classification); ``d_model`` for the cosine term (γ > 0); with ``init_student`` every
    architecture field but the layer counts (and ``type_vocab_size``: an encoder student may drop
    the teacher's token types, `dropped_token_types`), and at most ⌈teacher layers / 2⌉ layers."""
    if student.family not in STACKS:
        raise ValueError(f"model.family={student.family!r}: distillation supports {tuple(STACKS)}")
    names = ["family", "head", *(["num_classes"] if student.head == "classify" else
                                 ["vocab_size", "vocab_pad_multiple"])]  # logits of one width
    names += ["d_model"] if s.gamma else []
    names += [f for f in architecture_fields() if s.init_student and f not in LAYER_COUNTS
              and not (f == "type_vocab_size" and dropped_token_types(student, teacher))]
    differ = [f"model.{f}={getattr(student, f)!r} (teacher: {getattr(teacher, f)!r})"
              for f in dict.fromkeys(names) if getattr(student, f) != getattr(teacher, f)]
    if differ:
        raise ValueError(f"the student cannot be distilled from {s.teacher}: {'; '.join(differ)}. "
                         "Set these fields as the teacher has them")
    most = (teacher.num_layers + 1) // 2
    if s.init_student and student.num_layers > most:
        raise ValueError(f"model.num_layers={student.num_layers}: distill.init_student takes the "
                         f"teacher's layers 0, 2, 4, … of {teacher.num_layers}, so at most {most}")


def dropped_token_types(student: ModelConfig, teacher: ModelConfig) -> bool:
    """Whether an encoder student is DistilBERT-shaped: it has no token-type embeddings where its
    teacher has them (Sanh et al. 2019 §3: "the token-type embeddings and the pooler are removed";
    the pooler is a head option). ``init_student`` then leaves the teacher's type table out: the
    student's embedding of a segment-A row differs from the teacher's by the type-0 row."""
    return student.family == "encoder" and student.type_vocab_size == 0 < teacher.type_vocab_size


def _layer(stack: dict, i: int) -> dict:
    """Layer ``i`` of a stack's parameters, unrolled (``layer_i``) or stacked (``layers``)."""
    if "layers" in stack:
        return jax.tree.map(lambda a: np.asarray(a)[i], stack["layers"])
    return stack[f"layer_{i}"]


def select_layers(teacher_params: dict, teacher_cfg: ModelConfig, num_layers: int,
                  scan_layers: bool) -> dict:
    """The teacher's parameters with its stack cut to layers 0, 2, …, 2·(num_layers − 1)
    (DistilBERT §3), laid out stacked (``scan_layers``) or unrolled; embeddings, norms and heads
    as they are. A shared (ALBERT) stack is kept whole: its one block serves any depth."""
    name = STACKS[teacher_cfg.family]
    stack = teacher_params[name]
    if "shared" in stack:
        return dict(teacher_params)
    picked = [_layer(stack, 2 * i) for i in range(num_layers)]
    layers = ({"layers": jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *picked)}
              if scan_layers else {f"layer_{i}": p for i, p in enumerate(picked)})
    return {**teacher_params, name: layers}


def _split(out) -> tuple[jax.Array, jax.Array | None]:
    return out if isinstance(out, tuple) else (out, None)


def distill_terms(student_logits, teacher_logits, student_hidden, teacher_hidden, weights,
                  temperature: float, *, with_cosine: bool = True) -> dict[str, jax.Array]:
    """Weighted sums (normalised later by Σ w) of the soft and cosine terms.

    Args:
      student_logits, teacher_logits: `[B, L, V]` (or `[B, C]` for classification).
      student_hidden, teacher_hidden: `[B, L, D]` (or pooled `[B, D]`).
      weights: `[B, L]` (or `[B]`), the objective's weights.

    Returns:
      ``distill_kl``: Σ w·T²·KL(softmax(z_t/T) ‖ softmax(z_s/T)); ``distill_cos``: Σ w·(1 − cos).
    """
    w = weights.astype(jnp.float32)
    kl = soft_target_kl(student_logits, teacher_logits, temperature) * temperature ** 2
    out = {"distill_kl": jnp.sum(jnp.where(w != 0, kl * w, 0.0))}
    cos = cosine_distance(student_hidden, teacher_hidden) if with_cosine else jnp.zeros_like(w)
    out["distill_cos"] = jnp.sum(jnp.where(w != 0, cos * w, 0.0))
    return out


@dataclasses.dataclass(frozen=True)
class DistillLoss:
    """The train step's loss hook (`jaxformer.train.step.StepHooks.loss`; the teacher's parameters
    are the step's ``frozen`` tree).

    ``__call__(model, params, teacher_params, prepared, *, dropout_rng, hard_sums)`` → the sums of
    `jaxformer.train.step.loss_and_metrics` with ``loss`` = α·distill_kl + β·hard + γ·distill_cos
    (``nsp_loss`` × β), and ``distill_hard_loss``, ``distill_kl``, ``distill_cos`` for the logs.
    ``hard_sums(logits, nsp_logits, prepared)`` is the objective's own cross-entropy sums.
    """

    teacher_model: Model
    settings: DistillSettings
    pooling: str | None  # classification: pool the hidden states as the head does; else None

    def __call__(self, model, params, teacher_params, prepared: dict, *,
                 dropout_rng: jax.Array | None, hard_sums: Callable) -> dict:
        inputs, s = prepared["model_inputs"], self.settings
        teacher_out, teacher_hidden = jax.lax.stop_gradient(self.teacher_model.apply(
            jax.lax.stop_gradient(teacher_params), **inputs, return_hidden=True))
        student_out, student_hidden = model.apply(params, **inputs, rng=dropout_rng,
                                                  return_hidden=True)
        logits, nsp_logits = _split(student_out)
        if self.pooling is not None:
            segments = inputs.get("segment_ids")
            student_hidden = pool(student_hidden, segments, self.pooling)
            teacher_hidden = pool(teacher_hidden, segments, self.pooling)
        sums = hard_sums(logits, nsp_logits, prepared)
        terms = distill_terms(logits, _split(teacher_out)[0], student_hidden, teacher_hidden,
                              prepared["weights"], s.temperature, with_cosine=bool(s.gamma))
        combined = s.alpha * terms["distill_kl"] + s.beta * sums["loss"] + s.gamma * terms[
            "distill_cos"]
        out = {**sums, **terms, "distill_hard_loss": sums["loss"], "loss": combined}
        if "nsp_loss" in sums:
            out["nsp_loss"] = s.beta * sums["nsp_loss"]
        return out


@dataclasses.dataclass(frozen=True)
class Teacher:
    """A run's teacher: where it is, its model, and (once `load_teacher` ran) its parameters on the
    student's mesh with their shardings."""

    source: Pretrained
    settings: DistillSettings
    model_cfg: ModelConfig
    model: Model
    params: Any = None
    shardings: Any = None

    def loss(self, student_cfg: ModelConfig) -> DistillLoss:
        return DistillLoss(self.model, self.settings,
                           student_cfg.pooling if student_cfg.head == "classify" else None)


def open_teacher(resolved: ResolvedConfig) -> Teacher | None:
    """The teacher of ``distill.teacher`` (None when unset), its model checked against the student
    (`check_student`); its parameters are not read yet."""
    s = resolved.settings.distill  # the typed section, read once (`resolve_config`)
    if not s.teacher:
        return None
    source = open_pretrained(resolved.config, TEACHER_KEY)
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    teacher_cfg = ModelConfig.from_dict({k: v for k, v in source.model.items() if k in fields})
    check_student(resolved.model_cfg, teacher_cfg, s)
    return Teacher(source, s, teacher_cfg, build_model(teacher_cfg))


def load_teacher(teacher: Teacher, mesh, seed: int) -> Teacher:
    """``teacher`` with its parameters read (a run's verified, a LoRA run's merged; a Hugging Face
    directory imported as ``init_from`` imports it) and placed on ``mesh`` by the logical-axis rules
    (`jaxformer.parallel.rules.param_shardings`), shard by shard."""
    cfg, source = teacher.model_cfg, teacher.source
    if source.is_hf:
        params = load_hf(source.path, scan_layers=cfg.scan_layers, head=cfg.head,
                         num_classes=cfg.num_classes, seed=seed)[1]
    else:
        params = load_run_params(source.run)
    params, missing = merge_backbone(teacher.model.abstract(), params)  # the model's tree, dtypes, shapes
    if missing:
        raise ValueError(f"distill.teacher={source.path} lacks its head's parameters {missing}")
    placed = jax.device_put(params, shardings := param_shardings(
        teacher.model.logical_axes(), teacher.model.abstract(), mesh))
    print(f"Distilling from {source.run.step_dir if source.run else source.path} "
          f"({cfg.num_layers} layers; T={teacher.settings.temperature}, α={teacher.settings.alpha}, "
          f"β={teacher.settings.beta}, γ={teacher.settings.gamma})")
    return dataclasses.replace(teacher, params=placed, shardings=shardings)


def init_student_state(resolved: ResolvedConfig, built: Built, teacher: Teacher) -> TrainState:
    """A fresh train state whose parameters are the teacher's layers 0, 2, 4, … with its embeddings
    and heads (`select_layers`; a head the teacher lacks keeps its fresh init)."""
    cfg = resolved.model_cfg
    host = jax.tree.map(np.asarray, jax.device_get(teacher.params))
    picked = select_layers(host, teacher.model_cfg, cfg.num_layers, cfg.scan_layers)
    fresh = create_params(built.model, built.param_shardings, resolved.settings.seed)
    params, new = merge_backbone(fresh, picked)
    print(f"Student initialised from the teacher's layers {list(range(0, 2 * cfg.num_layers, 2))}; "
          f"fresh parameters: {new or 'none'}")
    return create_train_state(built.model, resolved.tx, built.mesh, resolved.settings.seed,
                              params=params)[0]


def extension(resolved: ResolvedConfig, built: Built) -> Extension | None:
    """The distillation `Extension` of a run with ``distill.teacher`` (None otherwise): the teacher
    checked against the student (`open_teacher`), its parameters read on the student's mesh once
    (`load_teacher`, never checkpointed: a resume reads them again) as the step's frozen tree, the
    loss hook `DistillLoss`; with ``distill.init_student`` a fresh run starts from its layers
    (`init_student_state`)."""
    teacher = open_teacher(resolved)
    if teacher is None:
        return None
    teacher = load_teacher(teacher, built.mesh, resolved.settings.seed)
    init = (functools.partial(init_student_state, teacher=teacher) if teacher.settings.init_student
            else None)
    return Extension(hooks=StepHooks(loss=teacher.loss(resolved.model_cfg)), frozen=teacher.params,
                     frozen_shardings=teacher.shardings, init_state=init)
