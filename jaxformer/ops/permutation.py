"""Permutation language modelling (XLNet; Yang et al. 2019) as pure functions of a factorisation order.

A factorisation order is a permutation ``z`` of each packed segment's positions; the model predicts
``x_{z_t}`` from ``x_{z_<t}``. It is held as ``rank`` `[B, L]` int32: ``rank[b, i] = t`` where
``z_t = i``, counted within position ``i``'s segment (padding: 0, never used).

* Two-stream attention (§2.3): the content stream ``h`` at ``i`` attends ``j`` iff
  ``rank[j] <= rank[i]`` (itself and its predecessors in the order); the query stream ``g`` at ``i``
  iff ``rank[j] < rank[i]`` (only its predecessors: never its own token). Both only within ``i``'s
  segment; padding neither attends nor is attended. `content_stream_mask`, `query_stream_mask`.
* Partial prediction (§2.4): only the last ``1/K`` of each order is a target
  (`partial_prediction_targets`).
* The query stream's input: XLNet starts it from a learned vector ``w``. Here it starts from the
  content input of the previous element of the order, ``z_{t-1}`` (`predecessor_index`), plus a
  learned "jump" embedding of the offset ``z_t − z_{t-1}`` whose row for offset +1 is zero
  (`jump_embedding`): the jump tells the query where its target is, and under the identity order
  (every jump +1) the query stream is the causal LM's content stream shifted by one, so the loss is
  the causal LM's. The first element of each order has no predecessor and is never a target.

Shapes: ``B`` batch, ``L`` length; masks are `[B, 1, L, L]` bool (`jaxformer.ops.masks`' convention:
True = may attend) so they broadcast over heads.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jnp.ndarray


def _same_segment(segment_ids: Array) -> Array:
    """`[B, L, L]` bool: ``i`` and ``j`` share a (non-padding) segment."""
    seg = segment_ids
    return (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] != 0)


def identity_order(segment_ids: Array) -> Array:
    """Left-to-right order: each position's index within its segment, `[B, L]` int32 (padding 0).

    Packed segments are contiguous runs of equal ids (`jaxformer.data.packing`)."""
    same = _same_segment(segment_ids)
    before = jnp.tril(jnp.ones(same.shape[1:], bool), k=-1)  # j < i
    return jnp.sum(same & before[None], axis=-1).astype(jnp.int32)


def sample_order(rng: jax.Array, segment_ids: Array) -> Array:
    """A uniformly random factorisation order per segment (XLNet §2.2, eq. 3), as ranks `[B, L]`.

    ``rank[i]`` = the number of positions of ``i``'s segment whose uniform key is smaller (ties
    broken by index), so every segment gets an independent uniform permutation of ``0..n-1``.
    """
    u = jax.random.uniform(rng, segment_ids.shape)
    idx = jnp.arange(segment_ids.shape[1])
    earlier = (u[:, None, :] < u[:, :, None]) | (
        (u[:, None, :] == u[:, :, None]) & (idx[None, None, :] < idx[None, :, None]))
    return jnp.sum(_same_segment(segment_ids) & earlier, axis=-1).astype(jnp.int32)


def content_stream_mask(rank: Array, segment_ids: Array) -> Array:
    """XLNet §2.3 content stream: ``i`` attends ``j`` iff same segment and ``rank[j] <= rank[i]``.

    Args: rank, segment_ids `[B, L]` (0 = padding). Returns `[B, 1, L, L]` bool."""
    return (_same_segment(segment_ids) & (rank[:, None, :] <= rank[:, :, None]))[:, None]


def query_stream_mask(rank: Array, segment_ids: Array) -> Array:
    """XLNet §2.3 query stream: ``i`` attends ``j`` iff same segment and ``rank[j] < rank[i]`` (not
    itself: the query knows its position, not its token). The first of each order attends nothing.

    Args: rank, segment_ids `[B, L]`. Returns `[B, 1, L, L]` bool."""
    return (_same_segment(segment_ids) & (rank[:, None, :] < rank[:, :, None]))[:, None]


def predecessor_index(rank: Array, segment_ids: Array) -> Array:
    """Index of the previous element of the order, ``z_{t-1}`` for ``i = z_t``, `[B, L]` int32; the
    first element of each order (and padding) points at itself."""
    prev = _same_segment(segment_ids) & (rank[:, None, :] == rank[:, :, None] - 1)
    own = jnp.arange(rank.shape[1], dtype=jnp.int32)[None]
    return jnp.where(jnp.any(prev, axis=-1), jnp.argmax(prev, axis=-1).astype(jnp.int32), own)


def segment_lengths(segment_ids: Array) -> Array:
    """Length of each position's segment, `[B, L]` int32 (0 on padding)."""
    return jnp.sum(_same_segment(segment_ids), axis=-1).astype(jnp.int32)


def partial_prediction_targets(rank: Array, segment_ids: Array, k: float) -> Array:
    """XLNet §2.4 partial prediction: the targets are the last ``min(ceil(n / K), n - 1)`` elements of
    each segment's order (``n`` its length), `[B, L]` bool.

    The first element (rank 0) is never a target (it has no predecessor, like a causal LM's first
    token), so ``K = 1`` trains every element but the first: the causal LM's ``n - 1`` targets.
    """
    if not k >= 1.0:
        raise ValueError(f"partial prediction needs K >= 1 (the last 1/K of each order is trained), "
                         f"got {k!r}")
    n = segment_lengths(segment_ids)
    num_targets = jnp.minimum(jnp.ceil(n / k).astype(jnp.int32), n - 1)
    return (segment_ids != 0) & (rank >= n - num_targets)


def jump_offsets(positions: Array, predecessor: Array) -> Array:
    """``positions[z_t] − positions[z_{t-1}]`` per position, `[B, L]` int32 (0 for the first)."""
    return positions - jnp.take_along_axis(positions, predecessor, axis=1)


def jump_embedding(table: Array, offsets: Array) -> Array:
    """Rows of the `[2·max_len − 1, D]` jump table at offsets `[B, L]` in ``[−(max_len−1),
    max_len−1]`` (row ``offset + max_len − 1``) → `[B, L, D]`; offset +1 (the next position, every
    jump of the identity order) is the zero vector, whatever the table holds."""
    max_len = (table.shape[0] + 1) // 2
    rows = jnp.take(table, jnp.clip(offsets + max_len - 1, 0, table.shape[0] - 1), axis=0)
    return jnp.where((offsets == 1)[..., None], jnp.zeros((), rows.dtype), rows)


def query_stream_input(content_input: Array, positions: Array, predecessor: Array,
                       jump_table: Array) -> tuple[Array, Array]:
    """The query stream's input ``g⁰`` `[B, L, D]` and its positions `[B, L]`.

    ``g⁰[i] = content_input[z_{t-1}] + jump(positions[i] − positions[z_{t-1}])`` for ``i = z_t``; the
    query stream attends from the predecessor's position (its RoPE rotation), so under the identity
    order ``g⁰[i] = content_input[i − 1]`` exactly. The first element of an order has no predecessor:
    its ``g⁰`` is ``jump(0)`` alone (it is never a target, and no query sees its own token).

    Args:
      content_input: `[B, L, D]` the content stream's input embeddings.
      positions: `[B, L]` int32. predecessor: `[B, L]` (`predecessor_index`).
      jump_table: `[2·max_len − 1, D]` (see `jump_embedding`).
    """
    own = predecessor == jnp.arange(predecessor.shape[1])[None]  # first of an order: no content
    prev = jnp.take_along_axis(content_input, predecessor[..., None], axis=1)
    prev = jnp.where(own[..., None], jnp.zeros((), prev.dtype), prev)
    jump = jump_embedding(jump_table, jump_offsets(positions, predecessor)).astype(prev.dtype)
    return prev + jump, jnp.take_along_axis(positions, predecessor, axis=1)
