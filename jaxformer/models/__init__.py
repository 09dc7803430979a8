"""The three transformer families (their forward passes, `jaxformer.models.forward`), their one config
type and the head registry. The modules holding the parameters are NNX (`jaxformer.nnx`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from jaxformer.config import ModelConfig
from jaxformer.models.heads import HEAD_MODULE_NAMES, HEAD_MODULES, HeadModule

if TYPE_CHECKING:
    from jaxformer.nnx.functional import FunctionalModel


def build_model(cfg: ModelConfig) -> FunctionalModel:
    """The model of ``cfg.family`` as the pure ``init`` / ``apply`` pair the trainer, evaluation and
    decoding call: `jaxformer.nnx.FunctionalModel` over the NNX model (``jaxformer.nnx.build_model``
    gives the NNX model itself)."""
    # imported here: jaxformer.nnx builds on this package (`forward`), not the other way round
    from jaxformer.nnx.functional import FunctionalModel

    return FunctionalModel(cfg)


__all__ = ["ModelConfig", "build_model", "HEAD_MODULES", "HEAD_MODULE_NAMES", "HeadModule"]
