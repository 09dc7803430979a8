"""Transformer blocks as pure functions of a parameter pytree.

One implementation serves every family: `transformer_block` = self-attention (+ optional
cross-attention) + FFN, each wrapped in a residual connection with either

    post-LN:  x ← Norm(x + Dropout(Sublayer(x)))          (Vaswani et al. 2017 §5.4; BERT)
    pre-LN:   x ← x + Dropout(Sublayer(Norm(x)))          (GPT-2, T5; Xiong et al. 2020)

`encoder_block` and `decoder_block` are the two common call patterns. The parameter table
`jaxformer.models.spec` declares these parameters and `jaxformer.models.forward` calls these functions.

Shapes use the letters of `jaxformer.ops` (``L`` the queries' length, ``S`` the keys' — the encoder
output in cross-attention, the cache's slots when decoding; ``H`` heads, ``K`` kv heads, ``Dh``
head_dim); inside `attention_sublayer` arrays carry them in their names (``q_BxLxHxDh``).

Parameter tree of one block::

    self_attn:  query {kernel [D, H, Dh], bias? [H, Dh]}, key/value {kernel [D, K, Dh], bias? [K, Dh]},
                out {kernel [H, Dh, D], bias? [D]}
    self_attn_norm: {scale [D], bias? [D]}
    cross_attn, cross_attn_norm: as above (decoder blocks of encoder-decoder models)
    ffn: wi {kernel [D, F], bias? [F]}, wi_gate? {kernel [D, F]}, wo {kernel [F, D], bias? [D]}
         (an MoE FFN: router {kernel [D, E]} and experts' kernels with a leading [E] axis,
         `jaxformer.ops.moe`)
    ffn_norm: {scale [D], bias? [D]}

Decoding cache (self-attention): ``{"key": [B, K, S, Dh], "value": [B, K, S, Dh], "valid": [B, S]}``
with ``S`` the maximum length; new keys are written at ``cache_index`` and each query sees the valid
slots up to its own. Cross-attention keys/values are computed once from the encoder output and
passed back in as ``cross_kv`` (`[B, K, S_src, Dh]` each). Cached keys and values are heads-major,
the layout attention's matmuls read (`jaxformer.ops.attention`, ``kv_layout="bksd"``): stored
`[B, S, K, Dh]`, the whole cache was transposed at every step, which made a batch-32 decoding step
of a d512 GPT spend more time copying the cache than in all its matmuls (`docs/generation.md`).

Sharding hook: ``constrain(x, names)``, when given, is called on intermediate activations with their
logical axis names — ``("batch", "act_length", "heads", "head_dim")`` for queries/keys/values and the
attention output (``"kv_heads"`` for grouped keys/values), ``("batch", "act_length", "mlp")`` for the
FFN hidden layer — so a caller can pin the Megatron tensor-parallel layout (Shoeybi et al. 2019:
column-split Q/K/V and W_i, row-split output projections). The Flax layers pass
`flax.linen.with_logical_constraint`; the functions here stay framework-free.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from jaxformer.ops.attention import dot_product_attention
from jaxformer.ops.dense import dense
from jaxformer.ops.dropout import dropout
from jaxformer.ops.ffn import ffn
from jaxformer.ops.masks import causal_mask, combine_masks, key_padding_mask
from jaxformer.ops.model_fields import ModelFields
from jaxformer.ops.moe import RouterStats, moe_ffn
from jaxformer.ops.norms import normalize
from jaxformer.ops.positions import apply_rope
from jaxformer.ops.ring_attention import active as context_parallel_active

Array = jnp.ndarray
Constrain = Callable[[Array, tuple[str, ...]], Array]


# The residual stream `[batch, length, d_model]` between blocks (and the embeddings' output).
ACTIVATION_AXES = ("batch", "act_length", "act_embed")
HEADS_AXES = ("batch", "act_length", "heads", "head_dim")
KV_HEADS_AXES = ("batch", "act_length", "kv_heads", "head_dim")
MLP_AXES = ("batch", "act_length", "mlp")


def project_kv(params: dict, x: Array) -> tuple[Array, Array]:
    """Keys and values `[B, S, K, Dh]` of `[B, S, D]` inputs."""
    return dense(params["key"], x), dense(params["value"], x)


def heads_major(x_BxSxKxDh: Array) -> Array:
    """`[B, S, K, Dh]` → `[B, K, S, Dh]`, the decoding cache's layout."""
    return jnp.swapaxes(x_BxSxKxDh, 1, 2)


def update_cache(cache: dict, k: Array, v: Array, valid: Array, index: Array) -> dict:
    """Write `[B, L, K, Dh]` keys/values and `[B, L]` validity at slot ``index`` of the cache
    (keys/values `[B, K, S, Dh]`, validity `[B, S]`)."""
    def upd(buf, new, axis):
        return lax.dynamic_update_slice_in_dim(buf, new.astype(buf.dtype), index, axis=axis)

    return {"key": upd(cache["key"], heads_major(k), 2),
            "value": upd(cache["value"], heads_major(v), 2),
            "valid": upd(cache["valid"], valid, 1)}


def where(flag: bool | Array, on: Callable[[], Array], off: Callable[[], Array]) -> Array:
    """``on()`` where ``flag`` else ``off()``: a Python bool computes one of them, a traced scalar
    (a scanned stack's per-layer flag) both, selected elementwise."""
    if isinstance(flag, bool):
        return on() if flag else off()
    return jnp.where(flag, on(), off())


def layer_kind(cfg: ModelFields, layer_index: int | Array | None) -> tuple[bool | Array, bool | Array]:
    """(local, bare) of layer ``layer_index`` (a Python int, or a traced scalar in a scanned
    stack; None: a global layer with its norms). ``local``: ModernBERT's local attention, every
    layer but each ``cfg.global_attn_every_n_layers``-th (Warner et al. 2024 §2.1.3); ``bare``:
    layer 0 without its attention norm (``cfg.first_attn_norm`` False)."""
    if layer_index is None:
        return False, False
    local = cfg.local_attention is not None and layer_index % cfg.global_attn_every_n_layers != 0
    bare = not cfg.first_attn_norm and layer_index == 0
    return (local if isinstance(local, bool) else jnp.asarray(local),
            bare if isinstance(bare, bool) else jnp.asarray(bare))


def rope(cfg: ModelFields, x_BxLxHxDh: Array, positions: Array, local: bool | Array = False) -> Array:
    """RoPE at ``positions`` `[B, L]` with the global θ (``cfg.rope_theta``) or, where ``local``,
    the local layers' (``cfg.local_rope_theta``, ModernBERT)."""
    glob = lambda: apply_rope(x_BxLxHxDh, positions, theta=cfg.rope_theta, scaling=cfg.rope)
    if local is False or cfg.local_rope_theta is None:
        return glob()
    return where(local, lambda: apply_rope(x_BxLxHxDh, positions, theta=cfg.local_rope_theta,
                                           scaling=cfg.rope), glob)


def attention_sublayer(
    params: dict,
    x: Array,
    *,
    cfg: ModelFields,
    kv_input: Array | None = None,
    kv: tuple[Array, Array] | None = None,
    positions: Array | None = None,
    kv_positions: Array | None = None,
    mask: Array | None = None,
    bias: Array | None = None,
    causal: bool = False,
    segment_ids: Array | None = None,
    kv_segment_ids: Array | None = None,
    cache: dict | None = None,
    cache_index: Array | None = None,
    dropout_rng: jax.Array | None = None,
    constrain: Constrain | None = None,
    kv_layout: str = "bskd",
    local: bool | Array = False,
) -> tuple[Array, dict | None]:
    """Multi-head attention of `[B, L, D]` queries over ``kv_input`` `[B, S, D]` (self-attention when
    None).

    ``kv`` passes precomputed keys/values (cached cross-attention), `[B, S, K, Dh]` or heads-major
    `[B, K, S, Dh]` by ``kv_layout``. With ``cache`` (self-attention decoding) the new keys are
    written at ``cache_index`` and attention runs over all cached slots.
    RoPE (``cfg.position == "rope"``) rotates queries and keys of self-attention by ``positions``;
    with ``kv_input`` and ``kv_positions`` `[B, S]` (XLNet's query stream over the content stream)
    queries by ``positions`` and keys by ``kv_positions``; ``local``: by the local layers' θ (`rope`).

    Returns:
      (`[B, L, D]`, updated cache or None).
    """
    pin = constrain or (lambda a, _: a)
    q_BxLxHxDh = pin(dense(params["query"], x), HEADS_AXES)
    if kv is not None:
        k_BxSxKxDh, v_BxSxKxDh = kv
    else:
        k_BxSxKxDh, v_BxSxKxDh = project_kv(params, x if kv_input is None else kv_input)
        k_BxSxKxDh, v_BxSxKxDh = pin(k_BxSxKxDh, KV_HEADS_AXES), pin(v_BxSxKxDh, KV_HEADS_AXES)
    if cfg.position == "rope" and kv is None and (kv_input is None or kv_positions is not None):
        if positions is None:
            raise ValueError("RoPE attention needs positions")
        q_BxLxHxDh = rope(cfg, q_BxLxHxDh, positions, local)
        k_BxSxKxDh = rope(cfg, k_BxSxKxDh, positions if kv_input is None else kv_positions, local)
    new_cache = None
    if cache is not None:
        valid_new = (jnp.ones(x.shape[:2], bool) if segment_ids is None else segment_ids != 0)
        new_cache = update_cache(cache, k_BxSxKxDh, v_BxSxKxDh, valid_new, cache_index)
        # One buffer for the attention below and the returned cache: at batch 1 XLA:CPU otherwise
        # fuses the update twice (once per consumer) and copies the cache 4× per layer per step,
        # a fifth of a batch-1 T5 d512 step (`docs/generation.md`).
        new_cache = lax.optimization_barrier(new_cache)
        # heads-major, S: all the cache's slots
        k_BxSxKxDh, v_BxSxKxDh, kv_layout = new_cache["key"], new_cache["value"], "bksd"
        visible_Bx1xLxS = combine_masks(
            causal_mask(x.shape[1], new_cache["valid"].shape[1], offset=cache_index),  # by slot
            key_padding_mask(new_cache["valid"]))
        mask = combine_masks(mask, visible_Bx1xLxS)
        causal, segment_ids, kv_segment_ids = False, None, None
    common = dict(bias=bias, mask=mask, causal=causal, q_segment_ids=segment_ids,
                  kv_segment_ids=kv_segment_ids, scale=cfg.attention_scale,
                  dropout_rate=cfg.attention_dropout_rate, dropout_rng=dropout_rng)
    ring = context_parallel_active()  # the sequence split over devices: ring attention
    if ring is not None and cache is None and kv_layout == "bskd":  # not when decoding
        out_BxLxHxDh = ring.attention(q_BxLxHxDh, k_BxSxKxDh, v_BxSxKxDh,
                                      kv_chunk_size=cfg.attention_chunk_size, **common)
    else:
        out_BxLxHxDh = dot_product_attention(
            q_BxLxHxDh, k_BxSxKxDh, v_BxSxKxDh, kv_layout=kv_layout,
            implementation=cfg.attention_kernel if cache is None else "xla",
            q_chunk_size=cfg.attention_chunk_size, kv_chunk_size=cfg.attention_chunk_size,
            **common)
    return dense(params["out"], pin(out_BxLxHxDh, HEADS_AXES), in_axes=2), new_cache


@jax.custom_jvp
def gradient_barrier(x: Array) -> Array:
    """The identity, whose derivative goes through `jax.lax.optimization_barrier`: in the backward
    pass the gradient of ``x`` is computed once and stored. On the residual stream this stops
    XLA:CPU from fusing the gradient's sum over all later layers into each of its consumers (the
    transposed copies feeding the weight gradients), which recomputed it there, O(layers²) work."""
    return x


@gradient_barrier.defjvp
def _gradient_barrier_jvp(primals, tangents):
    return primals[0], lax.optimization_barrier(tangents[0])


def _residual(cfg: ModelFields, norm_params: dict, x: Array, sublayer, rng,
              bare: bool | Array = False) -> Array:
    """Pre- or post-LN residual wrapper around ``sublayer`` (a function of the normalised input;
    pre-LN and ``bare``: of the input as is, ModernBERT's layer 0); the gradient of ``x`` is
    materialised (`gradient_barrier`)."""
    norm = lambda h: normalize(cfg.norm, h, norm_params, eps=cfg.norm_eps)
    x = gradient_barrier(x)
    if cfg.norm_position == "pre":
        return x + dropout(sublayer(where(bare, lambda: x, lambda: norm(x))), cfg.dropout_rate, rng)
    return norm(x + dropout(sublayer(x), cfg.dropout_rate, rng))


def _ffn_residual(params: dict, x: Array, *, cfg: ModelFields, rngs, constrain: Constrain | None,
                  token_mask: Array | None = None) -> tuple[Array, RouterStats | None]:
    """The FFN sublayer in its residual wrapper; ``rngs``: (FFN dropout, residual dropout) keys.
    An MoE FFN (``params["ffn"]`` has a ``router``, `jaxformer.ops.moe`) routes the tokens of
    ``token_mask`` `[B, L]` (all when None) and returns its `RouterStats`; a dense one None."""
    stats = None
    if "router" in params["ffn"]:
        def ff(h):
            nonlocal stats
            y, stats = moe_ffn(params["ffn"], h, experts_per_token=cfg.experts_per_token,
                               capacity_factor=cfg.capacity_factor, dropless=cfg.moe_dropless,
                               activation=cfg.activation, norm_topk_prob=cfg.norm_topk_prob,
                               jitter=cfg.router_jitter_noise, token_mask=token_mask,
                               dropout_rate=cfg.ffn_dropout_rate, rng=rngs[0], constrain=constrain)
            return y
    else:
        ff = lambda h: ffn(params["ffn"], h, activation=cfg.activation,  # noqa: E731
                           dropout_rate=cfg.ffn_dropout_rate, dropout_rng=rngs[0],
                           constrain=None if constrain is None else lambda h: constrain(h, MLP_AXES))
    return _residual(cfg, params["ffn_norm"], x, ff, rngs[1]), stats


def transformer_block(
    params: dict,
    x: Array,
    *,
    cfg: ModelFields,
    causal: bool = False,
    positions: Array | None = None,
    segment_ids: Array | None = None,
    mask: Array | None = None,
    bias: Array | None = None,
    encoder_out: Array | None = None,
    encoder_segment_ids: Array | None = None,
    cross_mask: Array | None = None,
    cross_bias: Array | None = None,
    cross_kv: tuple[Array, Array] | None = None,
    cache: dict | None = None,
    cache_index: Array | None = None,
    dropout_rng: jax.Array | None = None,
    constrain: Constrain | None = None,
    layer_index: int | Array | None = None,
    local_mask: Array | None = None,
) -> tuple[Array, dict | None]:
    """One block on `[B, L, D]` inputs. Cross-attention runs when ``params`` has ``cross_attn``.

    Args:
      causal: mask future positions in self-attention (decoders).
      positions: `[B, L]` token positions (RoPE).
      segment_ids: `[B, L]` packing ids (0 = padding) for self-attention.
      mask, bias: extra self-attention mask / additive bias (e.g. T5 relative bias `[B|1, H, L, L]`).
      encoder_out: `[B, S, D]` memory for cross-attention (or ``cross_kv`` precomputed: keys and
        values `[B, K, S, Dh]`, decoding only).
      encoder_segment_ids: `[B, S]` segment ids of the memory.
      cache, cache_index: self-attention decoding cache (see module docstring).
      dropout_rng: enables dropout when given.
      constrain: sharding hook ``constrain(x, logical_names)`` (see the module docstring).
      layer_index: the block's layer in its stack (an int, or a traced scalar when scanned), which
        decides ModernBERT's local / global attention and layer 0's missing norm (`layer_kind`);
        None: a global layer with its norms.
      local_mask: `[B, 1, L, L]` bool, the local layers' window (`jaxformer.ops.masks.
        local_window_mask`), ANDed into their self-attention mask.

    Returns:
      (`[B, L, D]`, ``{"self": cache, "cross": (k, v)}`` when decoding, else None, the MoE FFN's
      `jaxformer.ops.moe.RouterStats` or None for a dense FFN).
    """
    rngs = list(jax.random.split(dropout_rng, 6)) if dropout_rng is not None else [None] * 6
    new_cache = None
    local, bare = layer_kind(cfg, layer_index)
    if local is not False:
        if local_mask is None:
            raise ValueError("a local-attention layer needs local_mask (ops.masks.local_window_mask)")
        mask = combine_masks(mask, local_mask if local is True else local_mask | ~local)

    def self_attn(h):
        nonlocal new_cache
        out, new_cache = attention_sublayer(
            params["self_attn"], h, cfg=cfg, positions=positions, mask=mask, bias=bias,
            causal=causal, segment_ids=segment_ids, kv_segment_ids=segment_ids,
            cache=cache, cache_index=cache_index, dropout_rng=rngs[0], constrain=constrain,
            local=local)
        return out

    x = _residual(cfg, params["self_attn_norm"], x, self_attn, rngs[1], bare)
    cross_out_kv = None
    if "cross_attn" in params:
        if cross_kv is None:
            if encoder_out is None:
                raise ValueError("a block with cross-attention needs encoder_out or cross_kv")
            cross_kv = project_kv(params["cross_attn"], encoder_out)
            if cache is not None:  # kept for later steps in the cache's layout
                cross_kv = tuple(heads_major(t) for t in cross_kv)
        cross_out_kv = cross_kv
        q_seg = None
        if encoder_segment_ids is not None:
            q_seg = (jnp.ones(x.shape[:2], jnp.int32) if segment_ids is None
                     else segment_ids)
        cross = lambda h: attention_sublayer(
            params["cross_attn"], h, cfg=cfg, kv=cross_kv, mask=cross_mask, bias=cross_bias,
            segment_ids=q_seg, kv_segment_ids=encoder_segment_ids if q_seg is not None else None,
            dropout_rng=rngs[2], constrain=constrain,
            kv_layout="bksd" if cache is not None else "bskd")[0]
        x = _residual(cfg, params["cross_attn_norm"], x, cross, rngs[3])
    x, stats = _ffn_residual(params, x, cfg=cfg, rngs=rngs[4:], constrain=constrain,
                             token_mask=None if segment_ids is None else segment_ids != 0)
    if cache is not None:
        return x, {"self": new_cache, "cross": cross_out_kv}, stats
    return x, None, stats


def encoder_block(params: dict, x: Array, *, cfg: ModelFields, **kwargs) -> Array:
    """Bidirectional block (BERT / T5 encoder): `[B, L, D]` → `[B, L, D]`."""
    return transformer_block(params, x, cfg=cfg, causal=False, **kwargs)[0]


def decoder_block(params: dict, x: Array, *, cfg: ModelFields, **kwargs) -> tuple[Array, dict | None]:
    """Causal block (GPT; T5 decoder with cross-attention when ``params`` has ``cross_attn``):
    (`[B, L, D]`, the new cache or None)."""
    return transformer_block(params, x, cfg=cfg, causal=True, **kwargs)[:2]


def query_stream_block(params: dict, g: Array, h: Array, *, cfg: ModelFields, mask: Array,
                       positions: Array | None = None, kv_positions: Array | None = None,
                       dropout_rng: jax.Array | None = None, constrain: Constrain | None = None
                       ) -> Array:
    """XLNet's query stream (Yang et al. 2019 §2.3, eq. 4) through the same block's weights:
    ``g ← FFN(Attention(Q = g, KV = h; mask))`` with the block's residuals and norms, the keys and
    values from the content stream ``h`` of the layer below.

    Args:
      g: `[B, L, D]` query stream; h: `[B, S, D]` content stream (the block's input).
      mask: `[B, 1, L, S]` bool (`jaxformer.ops.permutation.query_stream_mask`).
      positions, kv_positions: `[B, L]`, `[B, S]` RoPE positions of the queries and of the keys.

    Returns: `[B, L, D]`.
    """
    rngs = list(jax.random.split(dropout_rng, 4)) if dropout_rng is not None else [None] * 4
    kv_in = h
    if cfg.norm_position == "pre":  # the same normalised keys/values as the content stream's
        kv_in = normalize(cfg.norm, h, params["self_attn_norm"], eps=cfg.norm_eps)
    attn = lambda q_in: attention_sublayer(
        params["self_attn"], q_in, cfg=cfg, kv_input=kv_in, positions=positions,
        kv_positions=kv_positions, mask=mask, dropout_rng=rngs[0], constrain=constrain)[0]
    g = _residual(cfg, params["self_attn_norm"], g, attn, rngs[1])
    return _ffn_residual(params, g, cfg=cfg, rngs=rngs[2:], constrain=constrain)[0]


def two_stream_block(params: dict, h: Array, g: Array, *, cfg: ModelFields, content_mask: Array,
                     query_mask: Array, query_positions: Array | None = None,
                     positions: Array | None = None, segment_ids: Array | None = None,
                     dropout_rng: jax.Array | None = None, constrain: Constrain | None = None
                     ) -> tuple[Array, Array]:
    """One layer of XLNet's two-stream attention (§2.3) with one block's parameters: the content
    stream ``h`` `[B, L, D]` runs the block under ``content_mask`` `[B, 1, L, L]`, the query stream
    ``g`` `[B, L, D]` runs `query_stream_block` over the same ``h`` under ``query_mask``.

    ``positions`` `[B, L]` are the content stream's (RoPE), ``query_positions`` the query stream's.
    Returns (h, g), both `[B, L, D]`.
    """
    rng_h, rng_g = jax.random.split(dropout_rng) if dropout_rng is not None else (None, None)
    new_h = transformer_block(params, h, cfg=cfg, positions=positions, segment_ids=segment_ids,
                              mask=content_mask, dropout_rng=rng_h, constrain=constrain)[0]
    new_g = query_stream_block(params, g, h, cfg=cfg, mask=query_mask, positions=query_positions,
                               kv_positions=positions, dropout_rng=rng_g, constrain=constrain)
    return new_h, new_g
