"""Scaled dot-product attention, plain and memory-efficient (chunked, online softmax).

    Attention(Q, K, V) = softmax(Q Kᵀ · scale + B + M) V          (Vaswani et al. 2017, eq. 1)

with ``scale = 1/sqrt(head_dim)`` by default (T5 uses 1.0), ``B`` an additive bias (e.g. T5 relative
positions) and ``M`` the mask (−∞ where the boolean mask is False).

Layout follows `jax.nn.dot_product_attention`: ``q`` is `[batch, q_len, heads, head_dim]`, ``k``/``v``
are `[batch, kv_len, kv_heads, head_dim]`. ``heads`` must be a multiple of ``kv_heads``: grouped-query
attention (Ainslie et al. 2023) shares each key/value head among ``heads // kv_heads`` query heads
(``kv_heads == 1`` is multi-query attention). Masks are boolean, broadcastable to
`[batch, heads, q_len, kv_len]`, True = may attend.

Inside, arrays carry their shapes in their names (``q_BxLxKxGxDh``): ``B`` batch, ``L`` query length,
``S`` key/value length, ``H`` heads, ``K`` kv heads, ``G = H // K`` query heads per kv head, ``Dh``
head_dim, ``Dv`` value head_dim.

A query row with no visible key returns zeros (not the mean of the values), in both paths.

The chunked path (``implementation="chunked"``) never materialises the `[q_len, kv_len]` logits: it
streams over key/value chunks keeping a running max and normaliser (Milakov & Gimelshein 2018;
Rabe & Staats 2021, "Self-attention does not need O(n²) memory") and rematerialises each chunk in the
backward pass. It equals the plain path to float rounding (dropout patterns differ; they agree in
distribution).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from jaxformer.ops.attention_kernels import fused_attention
from jaxformer.ops.dropout import dropout, is_active
from jaxformer.ops.kernel_choice import KERNELS
from jaxformer.ops.masks import causal_mask_from_positions, combine_masks, segment_mask

Array = jnp.ndarray
IMPLEMENTATIONS = ("xla", "chunked", *KERNELS)  # `jaxformer.ops.kernel_choice`
KV_LAYOUTS = ("bskd", "bksd")  # keys/values [B, S, K, Dh] or heads-major [B, K, S, Dh]


def _to_5d(x: Array | None, kv_heads: int, groups: int) -> Array | None:
    """Broadcastable `[..., H?, L, S]` → `[B?, K?, G?, L, S]` (``?``: 1 where ``x`` broadcasts)."""
    if x is None:
        return None
    while x.ndim < 4:
        x = x[None]
    if x.shape[1] == 1:
        return x[:, :, None]
    if x.shape[1] != kv_heads * groups:
        raise ValueError(f"mask/bias head dimension {x.shape[1]} is neither 1 nor heads={kv_heads * groups}")
    return x.reshape(x.shape[0], kv_heads, groups, *x.shape[2:])


def _check_shapes(q: Array, k: Array, v: Array, heads_major: bool = False) -> tuple[int, int]:
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(
            f"q, k, v must be [batch, length, heads, head_dim]; got {q.shape}, {k.shape}, {v.shape}"
        )
    heads_axis, length_axis = (1, 2) if heads_major else (2, 1)
    heads, kv_heads = q.shape[2], k.shape[heads_axis]
    if v.shape[heads_axis] != kv_heads or k.shape[length_axis] != v.shape[length_axis]:
        raise ValueError(f"k {k.shape} and v {v.shape} must agree on length and heads")
    if not q.shape[0] == k.shape[0] == v.shape[0]:
        raise ValueError(f"q {q.shape}, k {k.shape} and v {v.shape} must have the same batch size")
    if heads % kv_heads:
        raise ValueError(f"query heads ({heads}) must be a multiple of kv heads ({kv_heads})")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q head_dim {q.shape[-1]} != k head_dim {k.shape[-1]}")
    return kv_heads, heads // kv_heads


def _check_operand(name: str, x: Array | None, full: tuple[int, int, int, int]) -> None:
    """``mask`` / ``bias`` must broadcast to `[batch, heads, q_len, kv_len]` (= ``full``)."""
    if x is None:
        return
    if name == "mask" and x.dtype != jnp.bool_:
        raise ValueError(f"mask must be boolean (True = may attend), got {x.dtype}; pass an "
                         "additive float mask as bias= instead")
    shape = (1,) * (4 - x.ndim) + tuple(x.shape)
    if x.ndim > 4 or any(n not in (1, m) for n, m in zip(shape, full)):
        raise ValueError(f"{name} of shape {tuple(x.shape)} does not broadcast to [batch, heads, "
                         f"q_len, kv_len] = {list(full)} (give all four axes, 1 to broadcast: a "
                         "key-padding mask [batch, kv_len] is mask[:, None, None, :])")


def _check_segments(q_seg: Array | None, kv_seg: Array | None, lq: int, lk: int, b: int) -> None:
    for name, seg, length in (("q_segment_ids", q_seg, lq), ("kv_segment_ids", kv_seg, lk)):
        if seg is not None and tuple(seg.shape) != (b, length):
            raise ValueError(f"{name} must be [batch, length] = {[b, length]}, got "
                             f"{list(seg.shape)}")


def _block_mask(
    q_idx: Array,
    kv_idx: Array,
    *,
    causal: bool,
    mask5: Array | None,
    q_seg: Array | None,
    kv_seg: Array | None,
) -> Array | None:
    """Combined boolean mask `[B?, K?, G?, L, S]` for queries ``q_idx`` and keys ``kv_idx``
    (indices into the full lengths): ``mask5`` AND the `jaxformer.ops.masks` causal and segment
    masks, given a group axis."""
    built = []
    if causal:
        built.append(causal_mask_from_positions(q_idx[None], kv_idx[None]))
    if q_seg is not None:
        built.append(segment_mask(q_seg, kv_seg))
    return combine_masks(mask5, *(m[:, :, None] for m in built))


def _acc_dtype(x: Array):
    """Softmax/accumulation dtype: float32, or wider when the inputs are (float64)."""
    return jnp.promote_types(x.dtype, jnp.float32)


def _plain(q_BxLxKxGxDh, k_BxKxSxDh, v_BxKxSxDv, bias, mask, scale, dropout_rate, dropout_rng,
           precision):
    """Materialised logits; ``bias`` and ``mask`` broadcast to `[B, K, G, L, S]`; keys and values
    come heads-major (`[B, K, S, Dh]`). Heads are moved in front of the lengths so that both
    products are plain batched matmuls (XLA:CPU runs `[B, L, H, Dh]`-strided operands 2-3x slower;
    a decoding cache is stored heads-major, so that its keys and values are not copied at every
    step: `bench/decode_profile.py`), the max is a constant for the gradient (softmax
    does not depend on it) and the normaliser divides the `[.., L, Dv]` output rather than the
    `[.., L, S]` weights (dropout is linear, so the same). Masked logits get half the dtype's lowest
    finite value added, not −∞: the row max then needs no `isfinite` guard (which kept XLA:CPU from
    fusing the softmax with its neighbours: forward GPT step 2630 → 2225 MB accessed), and rows
    with no visible key are zeroed from the mask afterwards. The mask is added (visible logits + 0
    are unchanged; exp(masked − max) is 0 as with a select) because XLA:CPU fuses an add, not a
    select, into the QKᵀ matmul with the softmax (`bench/op_profile.py`)."""
    acc = _acc_dtype(q_BxLxKxGxDh)
    q_BxKxGxLxDh = jnp.transpose(q_BxLxKxGxDh, (0, 2, 3, 1, 4))
    # Without grouping (G = 1: plain multi-head attention) the unit group axis is dropped: XLA:CPU
    # otherwise adds layout copies around the batched matmuls (14% more bytes in fwd + bwd)
    g = "g" if q_BxKxGxLxDh.shape[2] > 1 else ""
    if not g:
        q_BxKxGxLxDh = q_BxKxGxLxDh[:, :, 0]
        bias, mask = (None if x is None else x[:, :, 0] for x in (bias, mask))
    logits_BxKxGxLxS = jnp.einsum(
        f"bk{g}ld,bksd->bk{g}ls", q_BxKxGxLxDh, k_BxKxSxDh, precision=precision,
        preferred_element_type=acc)
    logits_BxKxGxLxS = logits_BxKxGxLxS * scale
    if bias is not None:
        logits_BxKxGxLxS = logits_BxKxGxLxS + bias.astype(acc)
    if mask is not None:  # finite: exp(masked - max) is 0 all the same, with no inf to guard
        logits_BxKxGxLxS = logits_BxKxGxLxS + jnp.where(mask, 0.0, jnp.finfo(acc).min / 2).astype(acc)
    max_BxKxGxLx1 = jnp.max(logits_BxKxGxLxS, axis=-1, keepdims=True)
    if bias is not None:  # an additive −inf bias may still hide a whole row: its output is 0
        max_BxKxGxLx1 = jnp.where(jnp.isfinite(max_BxKxGxLx1), max_BxKxGxLx1, 0.0)
    p_BxKxGxLxS = jnp.exp(logits_BxKxGxLxS - lax.stop_gradient(max_BxKxGxLx1))
    denom_BxKxGxLx1 = jnp.sum(p_BxKxGxLxS, axis=-1, keepdims=True)
    if bias is not None:
        denom_BxKxGxLx1 = jnp.where(denom_BxKxGxLx1 == 0, 1.0, denom_BxKxGxLx1)
    p_BxKxGxLxS = dropout(p_BxKxGxLxS, dropout_rate, dropout_rng)
    out_BxKxGxLxDv = jnp.einsum(f"bk{g}ls,bksd->bk{g}ld", p_BxKxGxLxS.astype(v_BxKxSxDv.dtype),
                                v_BxKxSxDv, precision=precision, preferred_element_type=acc)
    out_BxKxGxLxDv = out_BxKxGxLxDv / denom_BxKxGxLx1
    if mask is not None:  # a row with no visible key (all logits lowest: uniform weights) is 0
        out_BxKxGxLxDv = jnp.where(jnp.any(mask, axis=-1, keepdims=True), out_BxKxGxLxDv, 0.0)
    if not g:
        out_BxKxGxLxDv = out_BxKxGxLxDv[:, :, None]
    return jnp.transpose(out_BxKxGxLxDv, (0, 3, 1, 2, 4)).astype(v_BxKxSxDv.dtype)  # [B, L, K, G, Dv]


def _slice_last(x: Array | None, start: Array, size: int) -> Array | None:
    if x is None or x.shape[-1] == 1:
        return x
    return lax.dynamic_slice_in_dim(x, start, size, axis=x.ndim - 1)


def _slice_axis(x: Array | None, start: Array, size: int, axis: int) -> Array | None:
    if x is None or x.shape[axis] == 1:
        return x
    return lax.dynamic_slice_in_dim(x, start, size, axis=axis)


def online_softmax_update(carry: tuple[Array, Array, Array], s_BxKxGxLxS: Array,
                          v_BxSxKxDv: Array, precision: lax.PrecisionLike = None,
                          drop=None) -> tuple[Array, Array, Array]:
    """One key/value block of the online softmax (Milakov & Gimelshein 2018, Alg. 3):
    ``carry`` = (unnormalised output `[B, K, G, L, Dv]`, running row max `[B, K, G, L]`, running
    normaliser `[B, K, G, L]`), ``s`` the block's logits (−∞ where masked), ``v`` its values;
    ``drop`` (optional) applies dropout to the block's weights. Rows that have seen no key yet
    keep max −∞ and contribute nothing. Shared by the chunked path and ring attention
    (`jaxformer.ops.ring_attention`)."""
    out_BxKxGxLxDv, max_BxKxGxL, norm_BxKxGxL = carry
    max_new = jnp.maximum(max_BxKxGxL, jnp.max(s_BxKxGxLxS, axis=-1))
    max_safe = jnp.where(jnp.isfinite(max_new), max_new, 0.0)
    p_BxKxGxLxS = jnp.exp(s_BxKxGxLxS - max_safe[..., None])
    corr = jnp.exp(jnp.where(jnp.isfinite(max_BxKxGxL), max_BxKxGxL, max_safe) - max_safe)
    norm_new = norm_BxKxGxL * corr + jnp.sum(p_BxKxGxLxS, axis=-1)
    if drop is not None:
        p_BxKxGxLxS = drop(p_BxKxGxLxS)
    pv_BxKxGxLxDv = jnp.einsum("bkgls,bskd->bkgld", p_BxKxGxLxS.astype(v_BxSxKxDv.dtype), v_BxSxKxDv,
                               precision=precision, preferred_element_type=out_BxKxGxLxDv.dtype)
    return out_BxKxGxLxDv * corr[..., None] + pv_BxKxGxLxDv, max_new, norm_new


def _chunked(q_BxLxKxGxDh, k_BxSxKxDh, v_BxSxKxDv, bias, mask, causal, q_seg, kv_seg, scale,
             dropout_rate, dropout_rng, precision, q_chunk, kv_chunk):
    """Online-softmax attention over kv chunks, mapped over query chunks (Rabe & Staats 2021).

    Inside a chunk, ``L`` and ``S`` in the names are the chunk lengths ``q_chunk`` / ``kv_chunk``;
    the carry holds the running output, max and normaliser of each query row."""
    b, lq, kvh, g, _ = q_BxLxKxGxDh.shape
    lk, dv = k_BxSxKxDh.shape[1], v_BxSxKxDv.shape[-1]
    q_chunk, kv_chunk = min(q_chunk, lq), min(kv_chunk, lk)
    # lengths that are no multiple of the chunk are padded: extra query rows are dropped at the
    # end, extra keys are masked (``kv_idx < lk`` below)
    pad_q, pad_k = -lq % q_chunk, -lk % kv_chunk
    q_all, q_seg = _pad_axis(q_BxLxKxGxDh, 1, pad_q), _pad_axis(q_seg, 1, pad_q)
    k_all, v_all = _pad_axis(k_BxSxKxDh, 1, pad_k), _pad_axis(v_BxSxKxDv, 1, pad_k)
    kv_seg = _pad_axis(kv_seg, 1, pad_k)
    bias, mask = _pad_axis(_pad_axis(bias, 3, pad_q), 4, pad_k), \
        _pad_axis(_pad_axis(mask, 3, pad_q), 4, pad_k)
    n_kv = (lk + pad_k) // kv_chunk
    acc_t = _acc_dtype(q_all)

    def one_q_chunk(qi):
        q_start = qi * q_chunk
        q_BxLxKxGxDh = lax.dynamic_slice_in_dim(q_all, q_start, q_chunk, axis=1)
        q_idx = q_start + jnp.arange(q_chunk)
        q_seg_chunk = _slice_axis(q_seg, q_start, q_chunk, axis=1)
        bias_q = _slice_axis(bias, q_start, q_chunk, axis=3)
        mask_q = _slice_axis(mask, q_start, q_chunk, axis=3)

        @jax.checkpoint
        def body(carry, ki):
            k_start = ki * kv_chunk
            k_BxSxKxDh = lax.dynamic_slice_in_dim(k_all, k_start, kv_chunk, axis=1)
            v_BxSxKxDv = lax.dynamic_slice_in_dim(v_all, k_start, kv_chunk, axis=1)
            s_BxKxGxLxS = jnp.einsum("blkgd,bskd->bkgls", q_BxLxKxGxDh, k_BxSxKxDh, precision=precision,
                                     preferred_element_type=acc_t) * scale
            if bias_q is not None:
                s_BxKxGxLxS = s_BxKxGxLxS + _slice_last(bias_q, k_start, kv_chunk).astype(acc_t)
            kv_idx = k_start + jnp.arange(kv_chunk)
            msk = _block_mask(q_idx, kv_idx, causal=causal, mask5=_slice_last(mask_q, k_start, kv_chunk),
                              q_seg=q_seg_chunk, kv_seg=_slice_axis(kv_seg, k_start, kv_chunk, axis=1))
            if pad_k:
                real = (kv_idx < lk)[None, None, None, None]
                msk = real if msk is None else jnp.logical_and(msk, real)
            if msk is not None:
                s_BxKxGxLxS = jnp.where(msk, s_BxKxGxLxS, -jnp.inf)
            drop = None
            if is_active(dropout_rate, dropout_rng):
                rng = jax.random.fold_in(jax.random.fold_in(dropout_rng, qi), ki)
                drop = lambda p: dropout(p, dropout_rate, rng)
            return online_softmax_update(carry, s_BxKxGxLxS, v_BxSxKxDv, precision, drop), None

        init = (
            jnp.zeros((b, kvh, g, q_chunk, dv), acc_t),
            jnp.full((b, kvh, g, q_chunk), -jnp.inf, acc_t),
            jnp.zeros((b, kvh, g, q_chunk), acc_t),
        )
        (out_BxKxGxLxDv, _, norm_BxKxGxL), _ = lax.scan(body, init, jnp.arange(n_kv))
        out_BxKxGxLxDv = out_BxKxGxLxDv / jnp.where(norm_BxKxGxL == 0, 1.0, norm_BxKxGxL)[..., None]
        return jnp.transpose(out_BxKxGxLxDv, (0, 3, 1, 2, 4))  # [B, q_chunk, K, G, Dv]

    n_q = (lq + pad_q) // q_chunk
    chunks = lax.map(one_q_chunk, jnp.arange(n_q))  # [n_q, B, q_chunk, K, G, Dv]
    out_BxLxKxGxDv = jnp.moveaxis(chunks, 0, 1).reshape(b, n_q * q_chunk, kvh, g, dv)[:, :lq]
    return out_BxLxKxGxDv.astype(v_all.dtype)


def _pad_axis(x: Array | None, axis: int, pad: int) -> Array | None:
    """``x`` with ``pad`` zeros / False appended on ``axis`` (unless it broadcasts there)."""
    if x is None or pad == 0 or x.shape[axis] == 1:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths)


def dot_product_attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    bias: Array | None = None,
    mask: Array | None = None,
    causal: bool = False,
    q_segment_ids: Array | None = None,
    kv_segment_ids: Array | None = None,
    scale: float | None = None,
    dropout_rate: float = 0.0,
    dropout_rng: Array | None = None,
    implementation: str = "xla",
    q_chunk_size: int = 512,
    kv_chunk_size: int = 512,
    precision: lax.PrecisionLike = None,
    kv_layout: str = "bskd",
) -> Array:
    """softmax(q kᵀ · scale + bias + mask) v.

    Args:
      q: `[batch, q_len, heads, head_dim]`.
      k: `[batch, kv_len, kv_heads, head_dim]` with ``heads % kv_heads == 0`` (GQA / MQA).
      v: `[batch, kv_len, kv_heads, v_head_dim]`.
      bias: additive logits bias broadcastable to `[batch, heads, q_len, kv_len]`.
      mask: boolean, broadcastable to `[batch, heads, q_len, kv_len]`; True = may attend.
      causal: also apply ``key index <= query index``, indices counted from 0 in both ``q``
        and ``k`` (top-left aligned, as in `jax.nn.dot_product_attention`): when queries are the
        last ``q_len`` of ``kv_len`` positions (decoding with a cache) pass
        ``mask=ops.causal_mask(q_len, kv_len, offset=...)`` instead.
      q_segment_ids, kv_segment_ids: `[batch, q_len]` / `[batch, kv_len]` ints for packed sequences;
        tokens attend only within equal ids and id 0 (padding) is never attended. In the chunked
        path this mask is built per chunk and never materialised.
      scale: logits multiplier; default ``1/sqrt(head_dim)``.
      dropout_rate, dropout_rng: dropout on the attention weights (training only).
      implementation: ``"xla"`` (plain), ``"chunked"`` (memory-efficient online softmax), or a
        fused kernel of `jaxformer.ops.attention_kernels`: ``"cudnn"`` (CUDA GPUs), ``"splash"``
        (TPUs), ``"splash_interpret"`` (splash interpreted, any backend), ``"flash"`` (TPUs:
        our kernel, the one that takes a ``bias``), ``"flash_interpret"``; kernels take no
        dropout, only ``flash`` a ``bias``, splash and flash no dense ``mask``.
      q_chunk_size, kv_chunk_size: chunk sizes of the chunked path (other lengths are padded to
        a multiple and the padding masked); ``kv_chunk_size`` is splash's and flash's block length.
      precision: matmul precision passed to `jnp.einsum`.
      kv_layout: ``"bskd"`` (``k``/``v`` as above) or ``"bksd"``: heads-major
        `[batch, kv_heads, kv_len, head_dim]`, the layout of the decoding cache, which the plain
        path reads without a copy (the others transpose it first).

    Returns:
      `[batch, q_len, heads, v_head_dim]` in ``v.dtype``.
    """
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {kv_layout!r}")
    if kv_layout == "bksd" and implementation != "xla":
        k, v, kv_layout = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), "bskd"
    heads_major = kv_layout == "bksd"
    kv_heads, groups = _check_shapes(q, k, v, heads_major)
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    b, lq, h, d = q.shape
    lk = k.shape[2 if heads_major else 1]
    if (q_segment_ids is None) != (kv_segment_ids is None):
        if kv_segment_ids is None and lq == lk:
            kv_segment_ids = q_segment_ids
        else:
            raise ValueError("pass both q_segment_ids and kv_segment_ids (or neither)")
    _check_operand("mask", mask, (b, h, lq, lk))
    _check_operand("bias", bias, (b, h, lq, lk))
    _check_segments(q_segment_ids, kv_segment_ids, lq, lk, b)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if implementation in KERNELS:
        return fused_attention(implementation, q, k, v, block=kv_chunk_size, bias=bias, mask=mask,
                               causal=causal, q_segment_ids=q_segment_ids,
                               kv_segment_ids=kv_segment_ids, scale=scale,
                               dropout_rate=dropout_rate, dropout_rng=dropout_rng)
    q_BxLxKxGxDh = q.reshape(b, lq, kv_heads, groups, d)
    bias_BxKxGxLxS = _to_5d(bias, kv_heads, groups)  # each axis may be 1 (broadcast)
    mask_BxKxGxLxS = _to_5d(mask, kv_heads, groups)
    if implementation == "chunked":
        out_BxLxKxGxDv = _chunked(q_BxLxKxGxDh, k, v, bias_BxKxGxLxS, mask_BxKxGxLxS, causal,
                                  q_segment_ids, kv_segment_ids, scale, dropout_rate, dropout_rng,
                                  precision, q_chunk_size, kv_chunk_size)
    else:
        mask_BxKxGxLxS = _block_mask(jnp.arange(lq), jnp.arange(lk), causal=causal,
                                     mask5=mask_BxKxGxLxS, q_seg=q_segment_ids, kv_seg=kv_segment_ids)
        k_BxKxSxDh, v_BxKxSxDv = (k, v) if heads_major else (jnp.swapaxes(k, 1, 2),
                                                              jnp.swapaxes(v, 1, 2))
        out_BxLxKxGxDv = _plain(q_BxLxKxGxDh, k_BxKxSxDh, v_BxKxSxDv, bias_BxKxGxLxS,
                                mask_BxKxGxLxS, scale, dropout_rate, dropout_rng, precision)
    return out_BxLxKxGxDv.reshape(b, lq, h, v.shape[-1])
