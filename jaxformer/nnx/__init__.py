"""Flax NNX modules for the three families and all heads: the recommended module API.

    from jaxformer.nnx import build_model, from_hf, param_dict, from_params
    model = build_model(cfg, nnx.Rngs(0))           # cfg: jaxformer.config.ModelConfig
    logits = model(tokens)                            # [batch, length] → [batch, length, vocab]
    graphdef, state = nnx.split(model)                # pure state for jax.jit / optax
    params = param_dict(model)                        # = the Linen model's params tree

Same parameter tree, same computation (`jaxformer.models.forward`, `jaxformer.ops`) and same
logical sharding names as the Linen models in `jaxformer.models`; see `jaxformer.nnx.models`.
"""

from jaxformer.nnx.convert import (
    abstract_model,
    build_sharded,
    check_params,
    from_hf,
    from_params,
    to_linen,
)
from jaxformer.nnx.functional import FunctionalModel
from jaxformer.nnx.models import DecoderOnly, EncoderDecoder, EncoderOnly, build_model
from jaxformer.nnx.params import ParamNode, boxed_params, logical_axes, param_dict, param_shardings

__all__ = [
    "EncoderOnly", "DecoderOnly", "EncoderDecoder", "build_model", "ParamNode", "FunctionalModel",
    "param_dict", "logical_axes", "param_shardings", "boxed_params", "abstract_model",
    "check_params", "from_params", "from_hf", "to_linen", "build_sharded",
]
