"""A LoRA run on a Hugging Face model, merged for export (``python -m jaxformer.cli.convert --from``).

A LoRA run saves its adapters and task heads only; its base is read from ``init_from`` again.
`jaxformer.checkpoint.load_run_params` merges a run whose base is a jaxformer run; a base that is a
Hugging Face directory is read here through the importer, as the trainer reads it
(`jaxformer.train.setup.load_pretrained`: `load_hf` with the run's layout, head and seed, cast to
the parameter dtype), and merged as W + alpha/rank · A B (`jaxformer.models.lora`).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.checkpoint import (
    SavedRun,
    load_checkpoint_params,
    load_for_inference,
    load_run_params,
    open_run,
)
from jaxformer.config import ModelConfig
from jaxformer.convert.hf import load_hf
from jaxformer.convert.hf_io import is_hf_directory
from jaxformer.data.tokenizer import Tokenizer
from jaxformer.models import lora
from jaxformer.models.spec import model_spec


def load_merged(path: str | os.PathLike, *, step: int | None = None, best: bool = False
                ) -> tuple[ModelConfig, Any, Tokenizer | None]:
    """(ModelConfig, params, tokenizer or None) of a run's checkpoint like
    `jaxformer.checkpoint.load_for_inference` (which merges a LoRA run on a jaxformer run); a LoRA
    run on a Hugging Face model is merged here (`merged_params`)."""
    config = open_run(path, step=step, best=best, verify=False).run_config  # which reader
    if not is_lora_on_hf(config):
        return load_for_inference(path, step=step, best=best)  # verified there
    run = open_run(path, step=step, best=best)
    tokenizer = None if run.tokenizer is None else Tokenizer.load(str(run.tokenizer))
    return ModelConfig.from_dict(run.run_config["model"]), merged_params(run), tokenizer


def is_lora_on_hf(run_config: dict) -> bool:
    """Whether a run's config is that of a LoRA run on a Hugging Face model."""
    return lora.is_lora(run_config) and is_hf_directory(run_config["init_from"])


def merged_params(run: SavedRun) -> Any:
    """The parameters (NumPy arrays) ``run``'s model applies: `load_run_params`'s, or for a LoRA
    run on a Hugging Face model its base read from ``init_from`` through `load_hf`, the adapters
    added, the task heads taken from the checkpoint."""
    c = run.run_config
    if not is_lora_on_hf(c):
        return jax.tree.map(np.asarray, load_run_params(run))
    model_cfg = ModelConfig.from_dict(c["model"])
    base = load_hf(c["init_from"], scan_layers=model_cfg.scan_layers, head=model_cfg.head,
                   num_classes=model_cfg.num_classes, seed=c["seed"],
                   vocab_pad_multiple=model_cfg.vocab_pad_multiple)[1]
    dtype = jnp.dtype(model_cfg.param_dtype)
    base = jax.tree.map(lambda x: np.asarray(x, dtype=dtype), base)
    trained = load_checkpoint_params(run.step_dir, verified=True)
    merged = lora.inference_params(base, trained, c["optimizer"]["lora"], model_spec(model_cfg))
    return jax.tree.map(np.asarray, merged)
