"""Flax wrapper of `jaxformer.ops.blocks.transformer_block`: declares parameters and the decode cache.

The module holds no computation of its own: its output is exactly
``transformer_block(params, x, cfg=cfg, ...)`` on its own parameters (tested).
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from jaxformer.config import ModelConfig
from jaxformer.layers.params import block_spec, declare
from jaxformer.ops.blocks import ACTIVATION_AXES, transformer_block
from jaxformer.ops.stack import has_dropout, stack_block


class Block(nn.Module):
    """One encoder or decoder layer.

    Attributes:
      cfg: model config.
      causal: causal self-attention (decoder).
      cross_attention: add cross-attention over ``encoder_out`` (encoder-decoder decoder).
      deterministic: disable dropout.
      decode: use and update the ``cache`` collection (autoregressive decoding).
    """

    cfg: ModelConfig
    causal: bool = False
    cross_attention: bool = False
    deterministic: bool = True
    decode: bool = False

    @nn.compact
    def __call__(self, x, positions=None, segment_ids=None, bias=None, encoder_out=None,
                 encoder_segment_ids=None, cross_bias=None, cache_index=None, two_stream=None):
        """`[B, L, D]` → (`[B, L, D]`, None); the second output makes the module `nn.scan`-able.
        With ``two_stream`` (XLNet, see `jaxformer.ops.stack.stack_block`) ``x`` and the output are
        the pair (content stream, query stream)."""
        cfg = self.cfg
        params = declare(self, block_spec(cfg, cross_attention=self.cross_attention),
                         jnp.dtype(cfg.param_dtype))
        rng = None if self.deterministic or not has_dropout(cfg) else self.make_rng("dropout")
        kwargs = dict(cfg=cfg, causal=self.causal, positions=positions, segment_ids=segment_ids,
                      bias=bias, encoder_out=encoder_out, encoder_segment_ids=encoder_segment_ids,
                      cross_bias=cross_bias, dropout_rng=rng,
                      constrain=nn.with_logical_constraint)
        if not self.decode:
            return stack_block(params, x, two_stream=two_stream, **kwargs)[0], None
        x = nn.with_logical_constraint(x.astype(jnp.dtype(cfg.dtype)), ACTIVATION_AXES)
        b, slots = x.shape[:2]  # the cache holds as many slots as the initialising input has tokens
        kv_shape = (b, cfg.num_kv_heads, slots, cfg.head_dim)  # heads-major (`ops.blocks`)
        dtype = jnp.dtype(cfg.dtype)
        initializing = not self.has_variable("cache", "self")
        self_cache = self.variable("cache", "self", lambda: {
            "key": jnp.zeros(kv_shape, dtype), "value": jnp.zeros(kv_shape, dtype),
            "valid": jnp.zeros((b, slots), bool)})
        cross = None
        if self.cross_attention:
            s = encoder_out.shape[1] if encoder_out is not None else 1
            ckv = (b, cfg.num_kv_heads, s, cfg.head_dim)
            cross = self.variable("cache", "cross", lambda: (jnp.zeros(ckv, dtype), jnp.zeros(ckv, dtype)))
        if initializing:  # cache shapes come from this call's (maximum-length) input
            return transformer_block(params, x, **kwargs)[0], None
        if encoder_out is not None:
            kwargs["cross_kv"] = None
        elif self.cross_attention:
            kwargs["cross_kv"] = cross.value
        y, new = transformer_block(params, x, cache=self_cache.value, cache_index=cache_index,
                                   **kwargs)
        self_cache.value = new["self"]
        if self.cross_attention:
            cross.value = new["cross"]
        return y, None
