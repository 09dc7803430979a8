"""LoRA runs (`jaxformer.train.lora`): the frozen base beside the train state, and the export.

A run with ``optimizer.lora.rank`` > 0 trains ``TrainState.params`` = adapters + task heads; its
base (``init_from``'s parameters, with fresh parameters for heads it lacks, seeded by ``seed``) is
loaded again, never saved: at the start, at every resume (its ``config.json`` records
``init_from``) and for inference and export, which add the adapters back:
`jaxformer.train.checkpoint.load_run_params` (a base that is a jaxformer run: what ``generate``,
``evaluate`` and ``predict`` read) and `load_merged` (any base, a Hugging Face model included:
``python -m jaxformer.convert --from <lora run> --to-hf <dir>``).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import ml_collections
import numpy as np

from jaxformer.config import ModelConfig
from jaxformer.convert.hf_io import is_hf_directory
from jaxformer.data.tokenizer import Tokenizer
from jaxformer.train import lora
from jaxformer.train.checkpoint import load_checkpoint_params, load_for_inference, open_run
from jaxformer.train.setup import (
    Built,
    ResolvedConfig,
    build,
    load_pretrained,
    report_init_from,
    resolve_config,
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
    state, _ = create_train_state(built.model, resolved.model_cfg, resolved.tx, built.mesh,
                                  resolved.config.seed, params=trained, lora_cfg=lora_cfg)
    n_trained, n_base = lora.count(trained), lora.count(base)
    print(f"LoRA rank {lora_cfg.rank} on {tuple(lora_cfg.targets)}: {n_trained:,} trainable "
          f"parameters ({100 * n_trained / n_base:.2f}% of {n_base:,})")
    return state


def load_merged(path: str | os.PathLike, *, step: int | None = None, best: bool = False
                ) -> tuple[ModelConfig, Any, Tokenizer | None]:
    """(ModelConfig, params, tokenizer or None) of a run's checkpoint like
    `jaxformer.train.checkpoint.load_for_inference` (which merges a LoRA run on a jaxformer run);
    a LoRA run on a Hugging Face model is merged here: W + alpha/rank · A B into its base, read
    from ``init_from`` again as training reads it (`load_base`), task heads from the checkpoint."""
    run = open_run(path, step=step, best=best)
    if not (lora.is_lora(run.run_config) and is_hf_directory(run.run_config["init_from"])):
        return load_for_inference(path, step=step, best=best)
    config = ml_collections.ConfigDict(run.run_config)
    with config.unlocked():
        config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))  # replicated
    resolved = resolve_config(config)
    built = build(resolved)
    base = load_base(resolved, built)
    trained = load_checkpoint_params(run.step_dir, verified=True)
    merged = lora.model_params(base, trained, lora.lora_scale(config.optimizer.lora))
    tokenizer = None if run.tokenizer is None else Tokenizer.load(str(run.tokenizer))
    return resolved.model_cfg, jax.tree.map(np.asarray, merged), tokenizer
