"""Invariants of the pure blocks (`jaxformer.ops.blocks`): equivariance, KV-cache decoding, errors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.config import ModelConfig
from jaxformer.models.spec import ParamSpec, block_spec, init_params
from jaxformer.ops import decoder_block, encoder_block, transformer_block

KEY = functools.partial(jax.random.key, impl="rbg")  # as threefry, but compiles fast on CPU
TINY = dict(vocab_size=64, d_model=32, num_heads=4, d_ff=64, num_layers=2, max_len=32)
B, L, S = 2, 8, 6


def _inputs(rng, cfg):
    x = rng.normal(size=(B, L, cfg.d_model)).astype(np.float32)
    enc = rng.normal(size=(B, S, cfg.d_model)).astype(np.float32)
    seg = np.array([[1] * 5 + [2] * 3, [1] * 6 + [0] * 2], np.int32)
    pos = np.array([[0, 1, 2, 3, 4, 0, 1, 2], list(range(8))], np.int32)
    enc_seg = np.array([[1] * 4 + [2] * 2, [1] * 5 + [0]], np.int32)
    return x, enc, seg, pos, enc_seg


def test_encoder_block_without_positions_is_permutation_equivariant(rng):
    cfg = ModelConfig(**TINY, family="encoder", head="mlm", position="none", norm_position="post")
    params = init_params(KEY(0), block_spec(cfg))
    for name in ("query", "key"):  # sharper attention, so that order would matter if it leaked in
        params["self_attn"][name]["kernel"] *= 20.0
    x = rng.normal(size=(B, L, cfg.d_model)).astype(np.float32)
    perm = rng.permutation(L)
    f = jax.jit(functools.partial(encoder_block, cfg=cfg))
    np.testing.assert_allclose(f(params, x[:, perm]), f(params, x)[:, perm], atol=1e-5)
    # with a learned/rope position signal the same test must fail: equivariance is not vacuous
    cfg_rope = cfg.replace(position="rope")
    pos = np.broadcast_to(np.arange(L), (B, L))
    g = jax.jit(functools.partial(encoder_block, cfg=cfg_rope))
    assert not np.allclose(g(params, x[:, perm], positions=pos),
                           g(params, x, positions=pos)[:, perm], atol=1e-2)


def test_decoder_block_kv_cache_matches_full_pass(rng):
    """Prefill 3 tokens, then 1 token per step: equals the causal full-sequence block."""
    cfg = ModelConfig(**TINY, position="rope", num_kv_heads=2, dropout_rate=0.0,
                      attention_dropout_rate=0.0)
    params = init_params(KEY(0), block_spec(cfg))
    x = rng.normal(size=(B, L, cfg.d_model)).astype(np.float32)
    pos = np.broadcast_to(np.arange(L, dtype=np.int32), (B, L))
    full, _ = jax.jit(functools.partial(decoder_block, cfg=cfg))(params, x, positions=pos)
    cache = {"key": jnp.zeros((B, 2, L, cfg.head_dim)), "value": jnp.zeros((B, 2, L, cfg.head_dim)),
             "valid": jnp.zeros((B, L), bool)}
    step = jax.jit(lambda c, xs, ps, i: decoder_block(params, xs, cfg=cfg, positions=ps, cache=c,
                                                      cache_index=i))
    y, new = step(cache, x[:, :3], pos[:, :3], 0)
    outs = [y]
    cache = new["self"]
    for t in range(3, L):
        y, new = step(cache, x[:, t:t + 1], pos[:, t:t + 1], t)
        outs.append(y)
        cache = new["self"]
    np.testing.assert_allclose(jnp.concatenate(outs, axis=1), full, atol=1e-5)


def test_block_errors():
    cfg = ModelConfig(**TINY, position="rope")
    spec = block_spec(cfg, cross_attention=True)
    params = jax.tree.map(lambda s: jnp.zeros(s.shape), spec,
                          is_leaf=lambda s: isinstance(s, ParamSpec))
    x = jnp.zeros((1, 4, cfg.d_model))
    with pytest.raises(ValueError, match="RoPE attention needs positions"):
        transformer_block(params, x, cfg=cfg)
    with pytest.raises(ValueError, match="encoder_out"):
        transformer_block(params, x, cfg=cfg, positions=jnp.zeros((1, 4), jnp.int32))
