"""The three transformer families as users build them: `build_model` (`Model`: the pure ``init`` /
``apply`` over the parameter dict), `Transformer` (the same model as one Flax NNX module), the one
`init_cache`, their one config type, the presets and LoRA; the parameter table (`spec`), the head registry
(`head_parts`), the forward passes (`forward`) and vocabulary re-padding (`vocab_padding`)."""

from __future__ import annotations

from jaxformer.config import ModelConfig
from jaxformer.models.head_parts import HEAD_MODULE_NAMES, HEAD_MODULES, HeadModule
from jaxformer.models.model import Model, build_model, check_params, init_cache, param_shardings
from jaxformer.models.module import Transformer

__all__ = ["ModelConfig", "Model", "build_model", "Transformer", "init_cache", "check_params",
           "param_shardings", "HEAD_MODULES", "HEAD_MODULE_NAMES", "HeadModule"]
