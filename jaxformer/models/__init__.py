"""The three transformer families as users build them: `build_model` (the pure ``init`` / ``apply``
pair over the NNX model, `jaxformer.nnx`), their one config type, the presets and LoRA. Their
forward passes and head registry are `jaxformer.layers`'."""

from __future__ import annotations

from jaxformer.config import ModelConfig
from jaxformer.layers.heads import HEAD_MODULE_NAMES, HEAD_MODULES, HeadModule
from jaxformer.nnx.functional import FunctionalModel


def build_model(cfg: ModelConfig) -> FunctionalModel:
    """The model of ``cfg.family`` as the pure ``init`` / ``apply`` pair the trainer, evaluation and
    decoding call: `jaxformer.nnx.FunctionalModel` over the NNX model (``jaxformer.nnx.build_model``
    gives the NNX model itself)."""
    return FunctionalModel(cfg)


__all__ = ["ModelConfig", "build_model", "HEAD_MODULES", "HEAD_MODULE_NAMES", "HeadModule"]
