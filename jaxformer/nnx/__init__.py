"""Flax NNX modules for the three families and all heads: the recommended module API.

    from jaxformer.nnx import build_model, param_dict, from_params
    model = build_model(cfg, nnx.Rngs(0))           # cfg: jaxformer.config.ModelConfig
    logits = model(tokens)                            # [batch, length] → [batch, length, vocab]
    graphdef, state = nnx.split(model)                # pure state for jax.jit / optax
    params = param_dict(model)                        # = the checkpoints' params tree

    model.init_cache(batch_size, max_length)         # KV cache as nnx.Cache state; then
    logits = model(tokens, decode=True)               # appends tokens at the cache's next slot

The library's one module implementation (`jaxformer.nnx.models`: forward passes of
`jaxformer.layers.forward`, one layer loop, `jaxformer.ops.stack.run_stack`). The trainer and the
decoding loops call it as pure functions of pytrees (`FunctionalModel`, what
``jaxformer.models.build_model`` returns); Linen code gets it through flax's bridge (`linen_model`,
`to_linen`), on the same parameter tree.
"""

from jaxformer.nnx.convert import (
    abstract_model,
    build_sharded,
    check_params,
    from_params,
    linen_model,
    to_linen,
)
from jaxformer.nnx.functional import FunctionalModel
from jaxformer.nnx.models import (
    DecodeCache,
    DecoderOnly,
    EncoderDecoder,
    EncoderOnly,
    build_model,
    cache_tree,
)
from jaxformer.nnx.params import ParamNode, boxed_params, logical_axes, param_dict, param_shardings

__all__ = [
    "EncoderOnly", "DecoderOnly", "EncoderDecoder", "build_model", "ParamNode", "FunctionalModel",
    "param_dict", "logical_axes", "param_shardings", "boxed_params", "abstract_model",
    "check_params", "from_params", "to_linen", "linen_model", "build_sharded",
    "DecodeCache", "cache_tree",
]
