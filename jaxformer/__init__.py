"""jaxformer: transformers in JAX/Flax — pure ops, three families, one sharded trainer."""

from jaxformer.config import ModelConfig

__version__ = "0.1.0"
__all__ = ["ModelConfig", "__version__"]
