"""LoRA runs (`jaxformer.models.lora`): the frozen base beside the train state.

A run with ``optimizer.lora.rank`` > 0 trains ``TrainState.params`` = adapters + task heads; its
base (``init_from``'s parameters, with fresh parameters for heads it lacks, seeded by ``seed``) is
loaded again, never saved: at the start, at every resume (its ``config.json`` records
``init_from``) and for inference and export, which add the adapters back:
`jaxformer.checkpoint.load_run_params` (a base that is a jaxformer run) and
`jaxformer.convert.lora.load_merged` / `merged_params` (any base, a Hugging Face model included:
what ``generate``, ``evaluate``, ``predict``, ``answer`` and ``python -m jaxformer.cli.convert
--from <lora run> --to-hf <dir>`` read).

In the trainer LoRA is one `Extension` (`extension`): the base is the step's ``frozen`` tree, the
step's ``model_params`` hook merges it with the trained adapters (`jaxformer.models.lora`), a fresh
run starts from `init_lora_state`, and evaluation applies the merged parameters (the same hook).
"""

from __future__ import annotations

import functools
from typing import Any

import jax

from jaxformer.models import Model, lora
from jaxformer.models.lora import LoraSettings
from jaxformer.train.extension import Extension
from jaxformer.train.setup import (
    Built,
    ResolvedConfig,
    load_pretrained,
    report_init_from,
)
from jaxformer.train.state import TrainState, create_train_state
from jaxformer.train.step import StepHooks


def load_base(resolved: ResolvedConfig, built: Built) -> Any:
    """The frozen base of a LoRA run, placed shard by shard on the model's parameter shardings."""
    params, fresh = load_pretrained(resolved, built)
    report_init_from(resolved.pretrained, fresh)
    return jax.device_put(params, built.param_shardings)


def trainable_abstract(model: Model, lora_cfg: LoraSettings) -> tuple[Any, Any]:
    """(abstract parameters, their logical axes) a LoRA run trains: the adapters and task heads
    (`jaxformer.models.lora.trainable`, `jaxformer.models.lora.trainable_axes`)."""
    abstract = jax.eval_shape(lambda p: lora.trainable(p, jax.random.key(0), lora_cfg),
                              model.abstract())
    return abstract, lora.trainable_axes(model.logical_axes(), lora_cfg)


def init_lora_state(resolved: ResolvedConfig, built: Built, base: Any) -> TrainState:
    """A fresh LoRA train state: adapters (A ~ N, B = 0; key ``fold_in(key(seed), 2)``) and the
    base's task heads, with optimizer state for these only."""
    lora_cfg = resolved.settings.optimizer.lora
    key = jax.random.fold_in(jax.random.key(resolved.settings.seed), 2)
    trained = jax.jit(lambda p: lora.trainable(p, key, lora_cfg),
                      out_shardings=built.shardings.params)(base)
    state, _ = create_train_state(built.model, resolved.tx, built.mesh, resolved.settings.seed,
                                  params=trained,
                                  trained=trainable_abstract(built.model, lora_cfg))
    n_trained, n_base = lora.count(trained), lora.count(base)
    print(f"LoRA rank {lora_cfg.rank} on {tuple(lora_cfg.targets)}: {n_trained:,} trainable "
          f"parameters ({100 * n_trained / n_base:.2f}% of {n_base:,})")
    return state


def adapted(scale: float, trained: Any, base: Any) -> Any:
    """The step's ``model_params`` hook: ``base`` + scale · A B, the trained task heads."""
    return lora.model_params(base, trained, scale)


def extension(resolved: ResolvedConfig, built: Built) -> Extension | None:
    """The LoRA `Extension` of a run with ``optimizer.lora.rank`` > 0 (None otherwise): the state
    trains the adapters and task heads (`trainable_abstract`), its base read (`load_base`) is the
    step's frozen tree; fresh runs start from `init_lora_state`."""
    lora_cfg = resolved.settings.optimizer.lora
    if not lora_cfg.rank:
        return None
    base, scale = load_base(resolved, built), lora.lora_scale(lora_cfg)
    return Extension(hooks=StepHooks(model_params=functools.partial(adapted, scale)),
                     trained=trainable_abstract(built.model, lora_cfg), frozen=base,
                     frozen_shardings=built.param_shardings,
                     init_state=functools.partial(init_lora_state, base=base))
