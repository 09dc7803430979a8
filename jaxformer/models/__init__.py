"""The three transformer families and their one config type."""

from jaxformer.config import ModelConfig
from jaxformer.models.transformer import DecoderOnly, EncoderDecoder, EncoderOnly, build_model

__all__ = ["ModelConfig", "EncoderOnly", "DecoderOnly", "EncoderDecoder", "build_model"]
