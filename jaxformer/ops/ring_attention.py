"""Ring attention: exact attention over a sequence split into blocks across devices (context
parallelism; Liu, Zaharia & Abbeel 2023, "Ring Attention with Blockwise Transformers").

Each of the ``N`` devices of a mesh axis holds a block of ``L / N`` queries and of ``S / N``
keys/values. The key/value blocks travel around the ring (`jax.lax.ppermute`, each device sends
to the next) while every device folds each block it receives into the online softmax of its own
queries (`jaxformer.ops.attention.online_softmax_update`, the chunked path's step): after ``N - 1``
hops each query has seen every key, and no device ever holds more than two key/value blocks. The
backward pass (a `jax.custom_vjp`) is FlashAttention's (Dao et al. 2022, Alg. 2) over the same
ring: the key/value blocks travel again, carrying their gradients ``dK``/``dV`` with them, and one
last hop hands each block's gradient back to its owner; ``dQ`` stays local. Memory per device is
``O(L / N)``: the forward saves its output and the row log-sum-exp, not the `[L, S]` weights.

Load balance of causal attention: zig-zag order (Brandon et al. 2023, "Striped Attention"
discusses both; zig-zag is the layout of Zhu's ring-flash-attention and of MaxText's
``context_parallel_load_balance``). The sequence is cut into ``2N`` chunks of ``c = L / 2N`` and
device ``d`` holds chunks ``d`` and ``2N - 1 - d``. At ring step ``s > 0`` device ``d`` holds the
keys of device ``e = d - s (mod N)``; if ``e < d`` every query of ``d`` sees exactly the first half
of those keys (chunk ``e``), else exactly the second half of ``d``'s queries (chunk ``2N-1-d``)
sees all of them: either way one half-block, unmasked, so every device computes the same
``1 + (N - 1) / 2`` blocks (`causal_block_work` counts them). Striped order (token ``t`` on
device ``t mod N``) balances as well, but each of its blocks is a half-full triangle: XLA computes
the whole block, so only a kernel that skips sub-blocks gains from it; zig-zag's halves are
dense matmuls that XLA skips whole. With ``layout="contiguous"`` (device ``d`` holds positions
``d·L/N …``) the fully masked blocks are skipped, so device ``N - 1`` does ``N`` blocks and device 0
one: the step takes as long as the busiest.

`to_zigzag` / `from_zigzag` reorder a `[batch, length, ...]` array between natural and zig-zag
order; the model reorders its inputs once (`jaxformer.models.forward`), so positions (RoPE,
learned, sinusoidal, T5's relative buckets), packing segment ids and the residual stream travel in
zig-zag order, and ``causal`` here means "by original index". Call `ring_attention` inside
`jax.shard_map` over the axis (`jaxformer.parallel.context` does for the model).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from collections.abc import Callable, Iterator
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxformer.ops.attention import _acc_dtype, _block_mask, _to_5d, online_softmax_update
from jaxformer.ops.varying import grad_like, vary, vary_like

Array = jnp.ndarray
LAYOUTS = ("zigzag", "contiguous")


# --------------------------------------------------------------------------------------------------
# Sequence orders.


def _check_divides(length: int, parts: int, what: str) -> None:
    if length % parts:
        raise ValueError(f"{what} {length} is not divisible by {parts}: ring attention's zig-zag "
                         f"order cuts it into 2 × mesh.context chunks; pad it to a multiple of "
                         f"{parts}")


def zigzag_order(length: int, shards: int) -> np.ndarray:
    """`[length]`: the natural index held at each position of the zig-zag order (chunks
    ``0, 2N-1, 1, 2N-2, …, N-1, N`` of ``length / 2N`` each)."""
    _check_divides(length, 2 * shards, "length")
    c = length // (2 * shards)
    chunks = np.arange(2 * shards).reshape(2, shards)
    order = np.stack([chunks[0], chunks[1][::-1]], axis=1).reshape(-1)
    return (order[:, None] * c + np.arange(c)).reshape(-1)


def to_zigzag(x: Array, shards: int, axis: int = 1) -> Array:
    """``x`` with its ``axis`` (length ``2N·c``) reordered from natural to zig-zag order: a
    reshape, a flip and a transpose (no gather), which a sharded compiler turns into one
    all-to-all."""
    axis = axis % x.ndim
    n, c = shards, x.shape[axis] // (2 * shards)
    _check_divides(x.shape[axis], 2 * shards, "length")
    pre, post = x.shape[:axis], x.shape[axis + 1:]
    halves = x.reshape(*pre, 2, n, c, *post)
    first = lax.index_in_dim(halves, 0, axis, keepdims=False)
    second = jnp.flip(lax.index_in_dim(halves, 1, axis, keepdims=False), axis)
    return jnp.stack([first, second], axis=axis + 1).reshape(x.shape)


def from_zigzag(x: Array, shards: int, axis: int = 1) -> Array:
    """Inverse of `to_zigzag`."""
    axis = axis % x.ndim
    n, c = shards, x.shape[axis] // (2 * shards)
    pre, post = x.shape[:axis], x.shape[axis + 1:]
    pairs = x.reshape(*pre, n, 2, c, *post)
    first = lax.index_in_dim(pairs, 0, axis + 1, keepdims=False)
    second = jnp.flip(lax.index_in_dim(pairs, 1, axis + 1, keepdims=False), axis)
    return jnp.stack([first, second], axis=axis).reshape(x.shape)


def local_indices(device: Array | int, length: int, shards: int, layout: str) -> Array:
    """`[length]` natural indices of the ``length`` positions ``device`` holds."""
    if layout == "contiguous":
        return device * length + jnp.arange(length)
    c = length // 2
    return jnp.concatenate([device * c + jnp.arange(c), (2 * shards - 1 - device) * c + jnp.arange(c)])


def causal_block_work(shards: int, layout: str = "zigzag", chunk: int = 32
                      ) -> list[dict[str, float]]:
    """Per device, the work of one causal ring pass in units of a full `[L/N, L/N]` block:
    ``computed`` (what `ring_attention` runs: skipped parts excluded) and ``visible`` (the
    (query, key) pairs of it the causal mask keeps), counted element by element from the ring's
    own plan (`_plan`) for ``L = 2N · chunk``."""
    lc = 2 * chunk
    idx = [np.asarray(local_indices(d, lc, shards, layout)) for d in range(shards)]
    out = []
    for d in range(shards):
        computed = visible = 0.0
        for s in range(shards):
            e = (d - s) % shards
            part = _plan(s, causal=True, layout=layout, lk=lc)[0 if e < d else 1]
            if part is None:
                continue
            rows, (start, size) = part
            q, k = idx[d][rows], idx[e][start:start + size]
            computed += len(q) * len(k) / lc**2
            visible += float(np.sum(k[None, :] <= q[:, None])) / lc**2
        out.append({"device": d, "computed": computed, "visible": visible})
    return out


def _plan(step: int, *, causal: bool, layout: str, lk: int):
    """What a device computes at ring ``step`` of the block it holds (``lk`` keys): a pair
    (when the block's owner comes before this device, otherwise), each (query row slice, key
    columns (start, size)) or None (skipped). Used by the ring (`_visit`) and to count its work
    (`causal_block_work`)."""
    everything = (slice(None), (0, lk))
    if not causal or step == 0:  # step 0: this device's own (diagonal) block, causal mask inside
        return everything, everything
    if layout == "contiguous":
        return everything, None
    half = lk // 2  # zig-zag: one unmasked half-block either way
    return (slice(None), (0, half)), (slice(half, None), (0, lk))


# --------------------------------------------------------------------------------------------------
# The ring.


class _Static(NamedTuple):
    axis_name: str
    causal: bool
    layout: str
    scale: float
    precision: lax.PrecisionLike
    kv_chunk: int  # keys per step of the online softmax inside a block


def ring_attention(q: Array, k: Array, v: Array, *, axis_name: str, causal: bool = False,
                   layout: str = "zigzag", q_segment_ids: Array | None = None,
                   kv_segment_ids: Array | None = None, bias: Array | None = None,
                   scale: float | None = None, precision: lax.PrecisionLike = None,
                   kv_chunk_size: int = 512) -> Array:
    """softmax(q kᵀ · scale + bias + M) v for the local blocks of a sequence split over mesh axis
    ``axis_name``; call inside `jax.shard_map` (one ``ppermute`` ring over the axis).

    Args:
      q: `[batch, L/N, heads, head_dim]`, this device's queries.
      k, v: `[batch, S/N, kv_heads, head_dim]` (``heads % kv_heads == 0``: GQA), its keys/values.
      causal: key index <= query index, indices by natural order under ``layout`` (needs
        ``L == S``).
      layout: ``"zigzag"`` or ``"contiguous"``: which positions each device holds (module doc).
      q_segment_ids, kv_segment_ids: `[batch, L/N]` / `[batch, S/N]` packing ids (0 = padding,
        never attended); default one segment.
      bias: additive logits bias broadcastable to `[batch, heads, L/N, S]`: this device's query
        rows against all keys, columns in the ring's order (device ``e``'s keys at
        ``e·S/N …``), e.g. T5's relative bias. Its gradient is computed.
      scale: logits multiplier, default ``1/sqrt(head_dim)``.
      kv_chunk_size: within a block, keys are folded in this many at a time (Rabe & Staats 2021),
        so that no `[L/N, S/N]` logits are materialised: the largest divisor of the block's key
        count not above it.

    Returns:
      `[batch, L/N, heads, head_dim_v]` in ``v.dtype``; a query that sees no key gives zeros.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    b, lq, h, d = q.shape
    _, lk, kv_heads, _ = k.shape
    if h % kv_heads:
        raise ValueError(f"query heads ({h}) must be a multiple of kv heads ({kv_heads})")
    if causal and lq != lk:
        raise ValueError(f"causal ring attention needs equal query and key blocks, got {lq} and "
                         f"{lk}")
    if causal and layout == "zigzag" and lq % 2:
        raise ValueError(f"zig-zag order needs an even block length per device, got {lq}")
    if q_segment_ids is None:
        q_segment_ids, kv_segment_ids = jnp.ones((b, lq), jnp.int32), jnp.ones((b, lk), jnp.int32)
    elif kv_segment_ids is None:
        kv_segment_ids = q_segment_ids
    static = _Static(axis_name, causal, layout, 1.0 / math.sqrt(d) if scale is None else scale,
                     precision, kv_chunk_size)
    q_BxLxKxGxDh = q.reshape(b, lq, kv_heads, h // kv_heads, d)
    out_BxLxKxGxDv = _ring(static, q_BxLxKxGxDh, k, v, q_segment_ids, kv_segment_ids, bias)
    return out_BxLxKxGxDv.reshape(b, lq, h, v.shape[-1]).astype(v.dtype)


def _logits(st: _Static, me, src, step, rows, cols, q_BxLxKxGxDh, k_BxSxKxDh, q_seg, kv_seg,
            bias):
    """Logits `[B, K, G, L', S']` (−∞ where masked) of ``q[rows]`` (a static slice) against the
    keys ``cols`` = (start, size) held from device ``src``; the causal mask is needed on the
    diagonal block (step 0) only."""
    acc = _acc_dtype(q_BxLxKxGxDh)
    q_rows, k_cols = q_BxLxKxGxDh[:, rows], _take(k_BxSxKxDh, cols)
    s_BxKxGxLxS = jnp.einsum("blkgd,bskd->bkgls", q_rows, k_cols, precision=st.precision,
                             preferred_element_type=acc) * st.scale
    if bias is not None:
        s_BxKxGxLxS = s_BxKxGxLxS + _bias_block(bias, src, rows, cols, k_BxSxKxDh.shape[1]).astype(acc)
    n, lk = lax.axis_size(st.axis_name), k_BxSxKxDh.shape[1]
    idx = local_indices(me, lk, n, st.layout) if st.causal and step == 0 else None
    msk = _block_mask(None if idx is None else idx[rows], None if idx is None else _take(idx, cols, 0),
                      causal=idx is not None, mask5=None, q_seg=q_seg[:, rows],
                      kv_seg=_take(kv_seg, cols))
    return jnp.where(msk, s_BxKxGxLxS, -jnp.inf)


def _bias_block(bias5, src, rows, cols, lk: int):
    """The bias columns of device ``src``'s keys ``cols``, rows ``rows``."""
    block = _rows(bias5, rows)
    if block.shape[-1] == 1:
        return block
    return lax.dynamic_slice_in_dim(block, src * lk + cols[0], cols[1], axis=block.ndim - 1)


def _take(x: Array, cols, axis: int = 1) -> Array:
    """``x``'s entries ``cols`` = (start, size) along ``axis`` (``start`` may be traced)."""
    return lax.dynamic_slice_in_dim(x, cols[0], cols[1], axis=axis)


def _add_at(x: Array, cols, update: Array, axis: int = 1) -> Array:
    """``x`` with ``update`` added at ``cols`` = (start, size) along ``axis``."""
    return lax.dynamic_update_slice_in_dim(x, _take(x, cols, axis) + update, cols[0], axis=axis)


def _visit(st: _Static, step: int, me, src, lk: int, fn: Callable, carry):
    """Run ``fn(carry, rows, cols)`` on the part of the block from ``src`` that the layout's plan
    computes at ``step`` (module docstring), ``kv_chunk`` keys at a time (``cols`` =
    (start, size)); skipped parts leave ``carry`` as it is."""
    def run(plan):
        def go(c):
            if plan is None:
                return c
            rows, (start, size) = plan
            chunk = max(d for d in range(1, min(st.kv_chunk, size) + 1) if size % d == 0)
            return lax.fori_loop(0, size // chunk,
                                 lambda j, c: fn(c, rows, (start + j * chunk, chunk)), c)
        return go

    earlier, later = _plan(step, causal=st.causal, layout=st.layout, lk=lk)
    if earlier == later:
        return run(earlier)(carry)
    return lax.cond(src < me, run(earlier), run(later), carry)


def _ring_pass(st: _Static, carry, held, visit: Callable):
    """Step 0 on this device's own block, then ``N - 1`` hops: ``held`` (the travelling blocks)
    moves to the next device and ``(carry, held) = visit(carry, held, step, src)`` runs on what
    arrived (``step`` is 1 for every hop: the plan is the same for all of them). Returns
    (carry, held) after the last visit."""
    n, me = lax.axis_size(st.axis_name), lax.axis_index(st.axis_name)
    # what travels differs between devices from the first hop on (e.g. default segment ids)
    held = jax.tree.map(lambda x: vary(x, st.axis_name), held)
    carry, held = visit(carry, held, 0, me)

    def hop(step, state):
        held = lax.ppermute(state[1], st.axis_name, _next(n))
        return visit(state[0], held, 1, (me - step) % n)

    return lax.fori_loop(1, n, hop, (carry, held))


def _next(n: int) -> list[tuple[int, int]]:
    return [(i, (i + 1) % n) for i in range(n)]


def _rows(x, rows):
    """``x[..., rows, :]`` unless its row axis broadcasts (size 1)."""
    return x if x.shape[-2] == 1 else x[..., rows, :]


def _forward(st, q_BxLxKxGxDh, k, v, q_seg, kv_seg, bias):
    b, lq, kvh, g, _ = q_BxLxKxGxDh.shape
    acc = _acc_dtype(q_BxLxKxGxDh)
    bias5 = _to_5d(bias, kvh, g)
    me = lax.axis_index(st.axis_name)

    def visit(carry, held, step, src):
        k_held, v_held, seg_held = held

        def block(c, rows, cols):
            s_BxKxGxLxS = _logits(st, me, src, step, rows, cols, q_BxLxKxGxDh, k_held, q_seg,
                                  seg_held, bias5)
            part = tuple(x[..., rows, :] if x.ndim == 5 else x[..., rows] for x in c)
            new = online_softmax_update(part, s_BxKxGxLxS, _take(v_held, cols), st.precision)
            return tuple(x.at[..., rows, :].set(y) if x.ndim == 5 else x.at[..., rows].set(y)
                         for x, y in zip(c, new))

        return _visit(st, step, me, src, k.shape[1], block, carry), held

    init = (jnp.zeros((b, kvh, g, lq, v.shape[-1]), acc), jnp.full((b, kvh, g, lq), -jnp.inf, acc),
            jnp.zeros((b, kvh, g, lq), acc))
    init = vary_like(init, q_BxLxKxGxDh, k, v, q_seg, kv_seg, bias)
    (o, mx, norm), _ = _ring_pass(st, init, (k, v, kv_seg), visit)
    seen = norm > 0
    out_BxKxGxLxDv = o / jnp.where(seen, norm, 1.0)[..., None]
    # log-sum-exp of each row; +inf for a row that sees no key, so that exp(s - lse) is 0 there
    lse_BxKxGxL = jnp.where(seen, mx + jnp.log(jnp.where(seen, norm, 1.0)), jnp.inf)
    return jnp.transpose(out_BxKxGxLxDv, (0, 3, 1, 2, 4)), lse_BxKxGxL


def _fwd_rule(st, q, k, v, q_seg, kv_seg, bias):
    out, lse = _forward(st, q, k, v, q_seg, kv_seg, bias)
    return out.astype(v.dtype), (q, k, v, q_seg, kv_seg, bias, out.astype(v.dtype), lse)


def _bwd_rule(st, res, dout_BxLxKxGxDv):
    """FlashAttention's backward over the ring: P = exp(s − lse), dV += Pᵀ dO,
    dS = P ∘ (dO Vᵀ − rowsum(dO ∘ O)), dQ += dS K · scale, dK += dSᵀ Q · scale, dBias += dS."""
    q_BxLxKxGxDh, k, v, q_seg, kv_seg, bias, out, lse_BxKxGxL = res
    b, lq, kvh, g, _ = q_BxLxKxGxDh.shape
    acc = _acc_dtype(q_BxLxKxGxDh)
    bias5 = _to_5d(bias, kvh, g)
    me = lax.axis_index(st.axis_name)
    do_BxKxGxLxDv = jnp.transpose(dout_BxLxKxGxDv, (0, 2, 3, 1, 4)).astype(acc)
    o_BxKxGxLxDv = jnp.transpose(out, (0, 2, 3, 1, 4)).astype(acc)
    delta_BxKxGxL = jnp.sum(do_BxKxGxLxDv * o_BxKxGxLxDv, axis=-1)

    def visit(carry, held, step, src):
        k_held, v_held, seg_held, dk_held, dv_held = held

        def block(c, rows, cols):
            dq, dbias, dk, dv = c
            s_BxKxGxLxS = _logits(st, me, src, step, rows, cols, q_BxLxKxGxDh, k_held, q_seg,
                                  seg_held, bias5)
            p_BxKxGxLxS = jnp.exp(s_BxKxGxLxS - lse_BxKxGxL[..., rows, None])
            do_rows = do_BxKxGxLxDv[..., rows, :]
            dv = _add_at(dv, cols, jnp.einsum("bkgls,bkgld->bskd", p_BxKxGxLxS, do_rows,
                                              precision=st.precision))
            dp_BxKxGxLxS = jnp.einsum("bkgld,bskd->bkgls", do_rows,
                                      _take(v_held, cols).astype(acc), precision=st.precision)
            ds_BxKxGxLxS = p_BxKxGxLxS * (dp_BxKxGxLxS - delta_BxKxGxL[..., rows, None])
            dq = dq.at[:, rows].add(st.scale * jnp.einsum(
                "bkgls,bskd->blkgd", ds_BxKxGxLxS, _take(k_held, cols).astype(acc),
                precision=st.precision))
            dk = _add_at(dk, cols, st.scale * jnp.einsum(
                "bkgls,blkgd->bskd", ds_BxKxGxLxS, q_BxLxKxGxDh[:, rows].astype(acc),
                precision=st.precision))
            if dbias is not None:
                dbias = _add_bias_grad(dbias, ds_BxKxGxLxS, src, rows, cols, k_held.shape[1])
            return dq, dbias, dk, dv

        dq, dbias = carry
        dq, dbias, dk_held, dv_held = _visit(st, step, me, src, k.shape[1], block,
                                             (dq, dbias, dk_held, dv_held))
        return (dq, dbias), (k_held, v_held, seg_held, dk_held, dv_held)

    dbias0 = None if bias5 is None else jnp.zeros(bias5.shape, acc)
    refs = (q_BxLxKxGxDh, k, v, q_seg, kv_seg, bias, dout_BxLxKxGxDv)
    held = vary_like((k, v, kv_seg, jnp.zeros(k.shape, acc), jnp.zeros(v.shape, acc)), *refs)
    carry = vary_like((jnp.zeros(q_BxLxKxGxDh.shape, acc), dbias0), *refs)
    (dq, dbias), held = _ring_pass(st, carry, held, visit)
    # after N - 1 hops each device holds the next one's block: one more hop takes it home
    dk, dv = lax.ppermute((held[3], held[4]), st.axis_name, _next(lax.axis_size(st.axis_name)))
    dbias_out = None if bias is None else grad_like(dbias.reshape(bias.shape), bias)
    return (grad_like(dq, q_BxLxKxGxDh), grad_like(dk, k), grad_like(dv, v), None, None, dbias_out)



def _add_bias_grad(dbias5, ds_BxKxGxLxS, src, rows, cols, lk: int):
    """``dbias5`` (the bias's broadcast shape) + ``ds`` summed over the axes the bias broadcasts,
    written at this block's rows and columns."""
    axes = tuple(i for i in range(5) if dbias5.shape[i] == 1 and ds_BxKxGxLxS.shape[i] != 1)
    ds = jnp.sum(ds_BxKxGxLxS, axis=axes, keepdims=True)
    at = (Ellipsis, slice(None) if dbias5.shape[-2] == 1 else rows, slice(None))
    if dbias5.shape[-1] == 1:
        return dbias5.at[at].add(ds)
    start = src * lk + cols[0]
    part = dbias5[at]
    block = lax.dynamic_slice_in_dim(part, start, ds.shape[-1], axis=4)
    return dbias5.at[at].set(lax.dynamic_update_slice_in_dim(part, block + ds, start, axis=4))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _ring(st, q, k, v, q_seg, kv_seg, bias):
    return _forward(st, q, k, v, q_seg, kv_seg, bias)[0].astype(v.dtype)


_ring.defvjp(_fwd_rule, _bwd_rule)


# --------------------------------------------------------------------------------------------------
# The active context-parallel mesh (set by `jaxformer.parallel.context`).


class ContextParallel(NamedTuple):
    """What the model needs of an active context-parallel mesh axis: its size ``shards`` and
    ``attention(q, k, v, **kw)``, `ring_attention` of global (zig-zag ordered) arrays run per
    device (`jaxformer.parallel.context.ring_attention_sharded`)."""

    shards: int
    attention: Callable[..., Array]


_ACTIVE: contextvars.ContextVar[ContextParallel | None] = contextvars.ContextVar(
    "jaxformer_context_parallel", default=None)


@contextlib.contextmanager
def context_parallel(cp: ContextParallel | None) -> Iterator[None]:
    """Within this context the model runs its sequence in zig-zag order and self/cross
    attention as ring attention through ``cp`` (None: off)."""
    token = _ACTIVE.set(cp)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active() -> ContextParallel | None:
    """The context-parallel axis in effect (`context_parallel`), or None."""
    return _ACTIVE.get()


__all__ = ["LAYOUTS", "ContextParallel", "active", "causal_block_work", "context_parallel",
           "from_zigzag", "local_indices", "ring_attention", "to_zigzag", "zigzag_order"]
