"""The three transformer families, their one config type and the head registry."""

from jaxformer.config import ModelConfig
from jaxformer.models.heads import HEAD_MODULE_NAMES, HEAD_MODULES, HeadModule
from jaxformer.models.transformer import DecoderOnly, EncoderDecoder, EncoderOnly, build_model

__all__ = ["ModelConfig", "EncoderOnly", "DecoderOnly", "EncoderDecoder", "build_model",
           "HEAD_MODULES", "HEAD_MODULE_NAMES", "HeadModule"]
