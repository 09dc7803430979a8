"""The optimizer: AdamW with masked weight decay, clipping and fine-tuning groups.

`make_optimizer` builds, from the ``optimizer`` config section (`OptimizerSettings`),

    clip_by_global_norm(clip_norm)                # clip_norm > 0
    → AdamW(schedule, b1, b2, eps, weight_decay, mask=decay_mask)
    → scale_by_layer_decay(layer_lr_decay)        # layer_lr_decay < 1
    → freeze_embeddings(freeze_embeddings_steps)  # freeze_embeddings_steps > 0

Gradient accumulation (``grad_accum_steps``) is not an optimizer wrapper: the train step sums the
micro-batches' gradients and token counts in a `lax.scan` and normalises once
(`jaxformer.train.step.make_train_step`), so every token weighs the same whatever micro-batch
holds it.

AdamW is Loshchilov & Hutter 2019 (decoupled decay; optax's convention multiplies the decay by
the learning rate, like PyTorch's ``AdamW``). Weight decay applies only to ``kernel`` parameters of
rank ≥ 2 (`decay_mask`): never to biases, norm scales, or the token/position/type/relative-bias
embedding tables. Names decide, not ranks alone, because scanned stacks add a leading ``layers``
axis that makes biases rank 2.

Fine-tuning: ``head_lr_multiplier`` gives the head parameters (top-level modules named in
``head_param_prefixes``) their own AdamW with ``multiplier × schedule``; ``freeze_backbone`` sets
every other update to zero (no optimizer state, no decay) and clips the head's gradients alone.
Both use `optax.multi_transform` over `param_labels`.

Per-depth groups (`jaxformer.train.param_groups`, which defines the depth of every parameter of
each family): ``layer_lr_decay`` ξ < 1 multiplies the final update of a parameter at depth d by
ξ^(D − d) (Clark et al. 2020, ELECTRA), so each depth trains at that fraction of the (backbone or
head) learning rate, weight decay included; ``freeze_embeddings_steps`` zeroes the embeddings'
updates for the first N updates. Both compose with the head group, ``freeze_backbone`` and LoRA
(whose adapters take the depth of the kernel they adapt); at their defaults (1.0, 0) the optimizer
is exactly the one above.

LoRA (``lora.rank`` > 0, `jaxformer.models.lora`): the optimizer sees only the trainable tree
(adapters + task heads), so its state exists only for them; the adapters (``lora_a``/``lora_b``)
get no weight decay.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import optax

from jaxformer.models.head_parts import HEAD_MODULE_NAMES
from jaxformer.models.lora import LoraSettings, check_lora_config
from jaxformer.settings import (
    at_least,
    check_tree,
    config_dict,
    one_of,
    positive,
    read,
    section,
    setting,
    subsection,
)
from jaxformer.train.param_groups import (
    EMBEDDING_MODULES,
    freeze_embeddings,
    map_params_by_path,
    scale_by_layer_decay,
)
from jaxformer.train.schedules import (
    SCHEDULES,
    constant,
    inverse_sqrt,
    make_schedule,
    warmup_cosine,
    warmup_linear,
    warmup_rsqrt,
)

HEAD_PARAM_PREFIXES = HEAD_MODULE_NAMES  # every head module (`jaxformer.models.head_parts`)

def _decay_rate(v: float) -> str | None:
    return None if 0.0 <= v < 1.0 else "must lie in [0, 1)"


@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
    """``config.optimizer``: AdamW, its schedule, clipping, fine-tuning groups and LoRA (module
    docstring). `make_optimizer` checks how they combine."""

    name: str = setting("adamw", "the optimizer: 'adamw' (Loshchilov & Hutter 2019)",
                        check=one_of("adamw"))
    schedule: str = setting(
        "inverse_sqrt", "learning-rate schedule: 'inverse_sqrt' (Vaswani eq. 3), 'warmup_rsqrt', "
        "'warmup_cosine', 'warmup_linear' or 'constant' (train.schedules)", check=one_of(*SCHEDULES))
    # a learning rate <= 0 climbs the loss or stands still, and optax accepts it silently
    peak_lr: float = setting(1e-3, "peak learning rate (all schedules but inverse_sqrt)",
                             check=positive)
    scale: float = setting(
        1.0, "inverse_sqrt: multiplier of d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)",
        check=positive)
    warmup_steps: int = setting(
        4000, "linear warmup updates; warmup_cosine / warmup_linear clip it (with a warning) to "
        "num_train_steps - 1 when the run is shorter")
    end_lr: float = setting(
        0.0, "learning rate reached at num_train_steps by warmup_cosine / warmup_linear",
        check=at_least(0))
    b1: float = setting(0.9, "Adam β1", check=_decay_rate)
    b2: float = setting(0.98, "Adam β2", check=_decay_rate)
    eps: float = setting(1e-9, "Adam ε", check=positive)
    weight_decay: float = setting(0.0, "decoupled weight decay (kernels of rank >= 2 only)",
                                  check=at_least(0))
    clip_norm: float = setting(0.0, "clip gradients to this global norm (0 = no clipping)",
                               check=at_least(0))
    grad_accum_steps: int = setting(
        1, "micro-batches per update (data.batch_size must divide by it)", check=at_least(1))
    freeze_backbone: bool = setting(False, "update only the head parameters (head_param_prefixes)")
    head_lr_multiplier: float = setting(1.0, "learning-rate multiplier of the head parameters",
                                        check=at_least(0))
    head_param_prefixes: tuple[str, ...] = setting(
        HEAD_PARAM_PREFIXES, "top-level modules that are the head (fine-tuning groups)")
    layer_lr_decay: float = setting(
        1.0, "layer-wise LR decay ξ in (0, 1] (Clark et al. 2020): a parameter at depth d trains at "
        "lr·ξ^(D-d); embeddings d=0, layer i d=i+1, heads D (1.0 = off; train.param_groups)",
        check=lambda v: None if 0.0 < v <= 1.0 else "must lie in (0, 1] (1.0 = off; ELECTRA and "
        "BEiT use 0.65–0.9)")
    freeze_embeddings_steps: int = setting(
        0, "the embeddings (depth 0) get no update for this many first optimizer updates "
        "(ULMFiT-style; 0 = off)", check=at_least(0))
    lora: LoraSettings = subsection(LoraSettings, "LoRA adapters (optimizer.lora.*)")


_DEFAULTS = config_dict(section(OptimizerSettings)).to_dict()

OPTIMIZER_PRESETS: dict[str, dict[str, Any]] = {
    # Vaswani et al. 2017 §5.3: Adam β = (0.9, 0.98), ε = 1e-9, eq. (3) with 4000 warmup steps.
    "vaswani": {},
    # Devlin et al. 2019 §A.2 (+ the released code's ε and clipping): lr 1e-4, β2 0.999, decay
    # 0.01, 10k warmup steps, linear decay.
    "bert": dict(schedule="warmup_linear", peak_lr=1e-4, warmup_steps=10_000, b2=0.999, eps=1e-6,
                 weight_decay=0.01, clip_norm=1.0),
    # Brown et al. 2020 §B (125M model): β = (0.9, 0.95), ε = 1e-8, clip 1.0, decay 0.1, cosine to
    # 10% of the 6e-4 peak.
    "gpt3": dict(schedule="warmup_cosine", peak_lr=6e-4, end_lr=6e-5, warmup_steps=2000, b2=0.95,
                 eps=1e-8, weight_decay=0.1, clip_norm=1.0),
}


def default_optimizer_config(preset: str = "vaswani", **overrides) -> ml_collections.ConfigDict:
    """The ``optimizer`` config section: the defaults (Vaswani's Adam) updated by ``preset`` and
    ``overrides``; the keys are declared in `OptimizerSettings`."""
    if preset not in OPTIMIZER_PRESETS:
        raise ValueError(f"unknown optimizer preset {preset!r}; choose one of "
                         f"{sorted(OPTIMIZER_PRESETS)}")
    out = dict(_DEFAULTS, **OPTIMIZER_PRESETS[preset])
    unknown = sorted(set(overrides) - set(_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown optimizer config keys {unknown}; known keys: {sorted(_DEFAULTS)}")
    out.update(overrides)
    return ml_collections.ConfigDict(out)


# ------------------------------------------------------------------------------------------------
# Per-parameter decisions by path.


def decay_mask(params: Any) -> Any:
    """True for parameters that get weight decay: those named ``kernel`` with rank ≥ 2."""
    return map_params_by_path(
        lambda path, x: path.rsplit("/", 1)[-1] == "kernel" and len(x.shape) >= 2, params)


def is_head(path: str, prefixes: Sequence[str]) -> bool:
    """Whether ``path`` ("a/b/kernel") lies under one of ``prefixes`` (module paths like ``lm_head``
    or ``encoder/layer_1``)."""
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in prefixes)


def param_labels(params: Any, head_prefixes: Sequence[str] = HEAD_PARAM_PREFIXES) -> Any:
    """``"head"`` or ``"backbone"`` for every parameter (the labels of `optax.multi_transform`)."""
    return map_params_by_path(
        lambda path, _: "head" if is_head(path, head_prefixes) else "backbone", params)


# ------------------------------------------------------------------------------------------------


def optimizer_settings(preset: str = "vaswani", **overrides) -> OptimizerSettings:
    """The typed ``optimizer`` section of ``preset`` and ``overrides`` (`default_optimizer_config`),
    each key checked by its setting (ValueError naming it): what `make_optimizer` takes outside a
    training config (a training config's is `jaxformer.train.config.TrainSettings.optimizer`,
    checked with the whole config)."""
    stated = default_optimizer_config(preset, **overrides)
    check_tree(section(OptimizerSettings), stated, "optimizer.")
    return read(OptimizerSettings, stated)


def make_optimizer(opt: OptimizerSettings, d_model: int, total_steps: int, params: Any = None
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The gradient transformation and its (backbone) learning-rate schedule.

    Args:
      opt: the typed ``optimizer`` section (a run's ``TrainSettings.optimizer``, or
        `optimizer_settings`); each key was checked alone with it, how they combine is checked here.
      d_model: model width, for the ``inverse_sqrt`` schedule.
      total_steps: number of optimizer updates (not micro-batches), for decaying schedules.
      params: optional parameter tree (arrays or ``ShapeDtypeStruct``); when
        given, a fine-tuning config whose ``head_param_prefixes`` match no parameter is an error
        now rather than a silently frozen model later.

    Returns:
      ``(tx, schedule)``; ``schedule(step)`` is the backbone learning rate at optax update count
      ``step`` (the head's is ``head_lr_multiplier`` times it).
    """
    check_lora_config(opt.lora)
    if opt.lora.rank and opt.freeze_backbone:
        raise ValueError("optimizer.lora.rank > 0 already freezes the base weights; unset "
                         "optimizer.freeze_backbone")
    if opt.freeze_embeddings_steps and (opt.lora.rank or opt.freeze_backbone and not any(
            p in EMBEDDING_MODULES for p in opt.head_param_prefixes)):
        raise ValueError(f"optimizer.freeze_embeddings_steps={opt.freeze_embeddings_steps} has "
                         "nothing to freeze: optimizer.lora.rank > 0 / freeze_backbone already "
                         "keep the embeddings frozen; set it to 0")
    schedule = make_schedule(opt, d_model, total_steps)
    prefixes = tuple(opt.head_param_prefixes)
    mult = float(opt.head_lr_multiplier)
    grouped = opt.freeze_backbone or mult != 1.0
    if grouped and params is not None:
        labels = jax.tree_util.tree_leaves(param_labels(params, prefixes))
        if "head" not in labels:
            raise ValueError("optimizer.freeze_backbone / head_lr_multiplier need head "
                             "parameters, but no parameter path starts with one of "
                             f"optimizer.head_param_prefixes={list(prefixes)}")

    def adamw(lr):
        return optax.adamw(lr, b1=opt.b1, b2=opt.b2, eps=opt.eps, weight_decay=opt.weight_decay,
                           mask=decay_mask)

    clip = [optax.clip_by_global_norm(opt.clip_norm)] if opt.clip_norm > 0 else []
    head_schedule = schedule if mult == 1.0 else (lambda step: mult * schedule(step))
    label_fn = lambda p: param_labels(p, prefixes)
    if opt.freeze_backbone:
        tx = optax.multi_transform(
            {"head": optax.chain(*clip, adamw(head_schedule)), "backbone": optax.set_to_zero()},
            label_fn)
    elif grouped:
        tx = optax.chain(*clip, optax.multi_transform(
            {"head": adamw(head_schedule), "backbone": adamw(schedule)}, label_fn))
    else:
        tx = optax.chain(*clip, adamw(schedule))
    by_depth = ([scale_by_layer_decay(opt.layer_lr_decay)] if opt.layer_lr_decay != 1.0 else []) \
        + ([freeze_embeddings(opt.freeze_embeddings_steps)] if opt.freeze_embeddings_steps else [])
    return (optax.chain(tx, *by_depth) if by_depth else tx), schedule


__all__ = [
    "HEAD_PARAM_PREFIXES", "OptimizerSettings", "OPTIMIZER_PRESETS", "default_optimizer_config",
    "optimizer_settings", "make_optimizer", "make_schedule", "decay_mask", "param_labels", "is_head",
    "map_params_by_path",
    "inverse_sqrt", "warmup_rsqrt", "warmup_cosine", "warmup_linear", "constant",
]
