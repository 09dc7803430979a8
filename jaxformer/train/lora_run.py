"""LoRA runs (`jaxformer.models.lora`): the frozen base beside the train state.

A run with ``optimizer.lora.rank`` > 0 trains ``TrainState.params`` = adapters + task heads; its
base (``init_from``'s parameters, with fresh parameters for heads it lacks, seeded by ``seed``) is
loaded again, never saved: at the start, at every resume (its ``config.json`` records
``init_from``) and for inference and export, which add the adapters back:
`jaxformer.checkpoint.load_run_params` (a base that is a jaxformer run) and
`jaxformer.convert.lora.load_merged` / `merged_params` (any base, a Hugging Face model included:
what ``generate``, ``evaluate``, ``predict``, ``answer`` and ``python -m jaxformer.cli.convert
--from <lora run> --to-hf <dir>`` read).
"""

from __future__ import annotations

from typing import Any

import jax

from jaxformer.models import lora
from jaxformer.train.setup import (
    Built,
    ResolvedConfig,
    load_pretrained,
    report_init_from,
)
from jaxformer.train.state import TrainState, create_train_state


def load_base(resolved: ResolvedConfig, built: Built) -> Any:
    """The frozen base of a LoRA run, placed shard by shard on the model's parameter shardings."""
    params, fresh = load_pretrained(resolved, built)
    report_init_from(resolved.pretrained, fresh)
    return jax.device_put(params, built.param_shardings)


def init_lora_state(resolved: ResolvedConfig, built: Built, base: Any) -> TrainState:
    """A fresh LoRA train state: adapters (A ~ N, B = 0; key ``fold_in(key(seed), 2)``) and the
    base's task heads, with optimizer state for these only."""
    lora_cfg = resolved.config.optimizer.lora
    key = jax.random.fold_in(jax.random.key(resolved.config.seed), 2)
    trained = jax.jit(lambda p: lora.trainable(p, key, lora_cfg),
                      out_shardings=built.shardings.params)(base)
    state, _ = create_train_state(built.model, resolved.tx, built.mesh, resolved.config.seed,
                                  params=trained, lora_cfg=lora_cfg)
    n_trained, n_base = lora.count(trained), lora.count(base)
    print(f"LoRA rank {lora_cfg.rank} on {tuple(lora_cfg.targets)}: {n_trained:,} trainable "
          f"parameters ({100 * n_trained / n_base:.2f}% of {n_base:,})")
    return state
