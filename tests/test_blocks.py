"""The Flax `Block` is exactly the pure `transformer_block` on its own parameters; invariants."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.config import ModelConfig
from jaxformer.layers import Block, block_spec, init_params
from jaxformer.layers.params import ParamSpec
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


@pytest.mark.parametrize("norm_position,cross,extra", [
    ("pre", False, dict(position="rope", num_kv_heads=2, norm="rms", gated_ffn=True,
                        activation="silu", use_bias=False)),
    ("post", False, dict(attention_scale=0.5)),
    ("pre", True, dict(position="relative", norm="rms", use_bias=False)),
    ("post", True, dict(attention_impl="chunked", attention_chunk_size=2)),
])
def test_flax_block_equals_pure_block(rng, norm_position, cross, extra):
    cfg = ModelConfig(**TINY, norm_position=norm_position, dropout_rate=0.1,
                      attention_dropout_rate=0.1, ffn_dropout_rate=0.1, **extra)
    x, enc, seg, pos, enc_seg = _inputs(rng, cfg)
    bias = rng.normal(size=(1, cfg.num_heads, L, L)).astype(np.float32)
    block = Block(cfg, causal=True, cross_attention=cross)
    args = (x, pos, seg, bias) + ((enc, enc_seg) if cross else ())
    variables = jax.jit(block.init)(KEY(0), *args)
    params = nn.meta.unbox(variables["params"])
    # the declared tree is exactly block_spec, shapes included
    spec = block_spec(cfg, cross_attention=cross)
    shapes = jax.tree.map(lambda s: s.shape, spec, is_leaf=lambda s: isinstance(s, ParamSpec))
    assert jax.tree.map(jnp.shape, params) == shapes
    assert jax.tree.structure(init_params(KEY(1), spec)) == jax.tree.structure(params)

    pure_kw = dict(cfg=cfg, causal=True, positions=pos, segment_ids=seg, bias=bias,
                   encoder_out=enc if cross else None,
                   encoder_segment_ids=enc_seg if cross else None)
    pure = lambda p, rng=None: transformer_block(p, x, dropout_rng=rng, **pure_kw)[0]
    out, want = jax.jit(lambda v, p: (block.apply(v, *args)[0], pure(p)))(variables, params)
    np.testing.assert_allclose(out, want, atol=1e-6)
    if not cross:  # dropout is checked on the blocks with all six dropout sites
        return

    # dropout on: the same rng path gives the same output as the pure function with that key
    drop = Block(cfg, causal=True, cross_attention=cross, deterministic=False)
    block_rng = lambda k: drop.apply(variables, rngs={"dropout": k},
                                     method=lambda m: m.make_rng("dropout"))
    both = jax.jit(lambda k: (drop.apply(variables, *args, rngs={"dropout": k})[0],
                              pure(params, block_rng(k))))
    y1, p1 = both(KEY(3))
    y1_again, _ = both(KEY(3))
    y2, _ = both(KEY(4))
    np.testing.assert_array_equal(y1, y1_again)
    assert not np.allclose(y1, y2) and not np.allclose(y1, out)
    np.testing.assert_allclose(y1, p1, atol=1e-6)


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
