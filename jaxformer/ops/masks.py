"""Boolean attention masks: the one place where causal, padding and segment masks are built.

Convention (that of `jax.nn.dot_product_attention`): a mask is a boolean array broadcastable to
`[batch, heads, q_len, kv_len]`; ``True`` means "this query may attend to this key". Masks are combined
with logical AND (`combine_masks`). Every helper returns `[batch, 1, q_len, kv_len]` (or
`[1, 1, q_len, kv_len]` where no batch dimension exists) so results broadcast over heads.

The library builds its own masks here too: `jaxformer.ops.attention.dot_product_attention`'s
``causal`` and segment-id options (per chunk in the chunked path) and the decoding cache's
visibility in `jaxformer.ops.blocks.attention_sublayer` (causal by slot AND valid slots).
"""

from __future__ import annotations

import jax.numpy as jnp

Array = jnp.ndarray


def causal_mask(q_len: int, kv_len: int | None = None, *, offset: int | Array = 0) -> Array:
    """Lower-triangular mask: query ``i`` sees keys ``j <= i + offset``.

    Args:
      q_len: number of queries.
      kv_len: number of keys (defaults to ``q_len``).
      offset: position of query 0 among the keys (e.g. the cache index while decoding). May be a
        traced scalar.

    Returns:
      `[1, 1, q_len, kv_len]` bool.
    """
    kv_len = q_len if kv_len is None else kv_len
    q_idx = jnp.arange(q_len)[:, None] + offset
    kv_idx = jnp.arange(kv_len)[None, :]
    return (kv_idx <= q_idx)[None, None]


def causal_mask_from_positions(q_positions: Array, kv_positions: Array) -> Array:
    """Causal mask from explicit positions: `[batch, q_len]`, `[batch, kv_len]` → `[batch, 1, q, kv]`."""
    return (kv_positions[:, None, None, :] <= q_positions[:, None, :, None])


def prefix_lm_mask(q_positions: Array, kv_positions: Array, kv_in_prefix: Array) -> Array:
    """"Causal with prefix" (Raffel et al. 2020, §3.2.1 and Fig. 3, right; the prefix LM of
    Fig. 4): a query sees the keys at or before its position, as `causal_mask_from_positions`, and
    every key of the prefix, so the prefix is read bidirectionally and the rest causally.
    ``kv_in_prefix[b, j]``: key ``j`` lies in its segment's prefix. For packed rows combine with
    `segment_mask` (a prefix key is visible to its own segment only).

    Args:
      q_positions: `[batch, q_len]` ints.
      kv_positions: `[batch, kv_len]` ints.
      kv_in_prefix: `[batch, kv_len]` bool.

    Returns:
      `[batch, 1, q_len, kv_len]` bool.
    """
    return causal_mask_from_positions(q_positions, kv_positions) | kv_in_prefix[:, None, None, :]


def sliding_window_mask(q_positions: Array, kv_positions: Array, window: int) -> Array:
    """Local attention (Beltagy et al. 2020 §3.1; Mistral): query at position ``p`` sees keys at
    positions ``> p - window`` — itself and the ``window - 1`` before it (with a causal mask).
    `[batch, q_len]`, `[batch, kv_len]` → `[batch, 1, q_len, kv_len]` bool."""
    return q_positions[:, None, :, None] - kv_positions[:, None, None, :] < window


def local_window_mask(q_positions: Array, kv_positions: Array, window: int) -> Array:
    """ModernBERT's local attention (Warner et al. 2024 §2.1.3; HF's bidirectional sliding window):
    a query at position ``p`` sees the keys at positions within ``window // 2`` of it, either side
    (``|p - q| <= window // 2``: ``window + 1`` keys for an even window). Positions, not indices, so
    packed rows (positions restarting per segment) see the same windows as the rows unpacked.
    `[batch, q_len]`, `[batch, kv_len]` → `[batch, 1, q_len, kv_len]` bool."""
    distance = q_positions[:, None, :, None] - kv_positions[:, None, None, :]
    return jnp.abs(distance) <= window // 2


def padding_mask(q_valid: Array, kv_valid: Array | None = None) -> Array:
    """Mask from per-token validity: `[batch, q_len]`, `[batch, kv_len]` bool → `[batch, 1, q, kv]`.

    ``mask[b, 0, i, j] = q_valid[b, i] and kv_valid[b, j]``: a padding query attends nowhere (its
    row is all False: zero output) and a padding key is never attended. To mask only keys, use
    `key_padding_mask`.
    """
    kv_valid = q_valid if kv_valid is None else kv_valid
    return jnp.logical_and(q_valid[:, None, :, None], kv_valid[:, None, None, :])


def key_padding_mask(kv_valid: Array) -> Array:
    """Mask out padding keys only: `[batch, kv_len]` bool → `[batch, 1, 1, kv_len]`."""
    return kv_valid[:, None, None, :]


def segment_mask(q_segment_ids: Array, kv_segment_ids: Array | None = None) -> Array:
    """Packed-sequence mask: tokens attend only within their own segment.

    Segment id 0 marks padding and attends nowhere (a fully masked row yields zero output).

    Args:
      q_segment_ids: `[batch, q_len]` int.
      kv_segment_ids: `[batch, kv_len]` int (defaults to ``q_segment_ids``).

    Returns:
      `[batch, 1, q_len, kv_len]` bool.
    """
    kv_segment_ids = q_segment_ids if kv_segment_ids is None else kv_segment_ids
    same = q_segment_ids[:, None, :, None] == kv_segment_ids[:, None, None, :]
    return jnp.logical_and(same, kv_segment_ids[:, None, None, :] != 0)


def combine_masks(*masks: Array | None) -> Array | None:
    """Logical AND of the masks that are not None (broadcasting); None if all are None."""
    present = [m for m in masks if m is not None]
    if not present:
        return None
    out = present[0].astype(bool)
    for m in present[1:]:
        out = jnp.logical_and(out, m)
    return out


def make_attention_mask(
    q_segment_ids: Array | None = None,
    kv_segment_ids: Array | None = None,
    *,
    causal: bool = False,
    q_positions: Array | None = None,
    kv_positions: Array | None = None,
) -> Array | None:
    """The usual combination: segment (which also masks padding) and optional causality.

    Causality uses positions when both are given (correct for packed rows whose positions restart),
    otherwise array indices.
    """
    masks = []
    if q_segment_ids is not None:
        masks.append(segment_mask(q_segment_ids, kv_segment_ids))
    if causal:
        if q_positions is not None and kv_positions is not None:
            masks.append(causal_mask_from_positions(q_positions, kv_positions))
        else:
            q_len = q_segment_ids.shape[-1] if q_segment_ids is not None else None
            if q_len is None:
                raise ValueError("make_attention_mask(causal=True) needs segment ids or positions")
            kv_len = kv_segment_ids.shape[-1] if kv_segment_ids is not None else q_len
            masks.append(causal_mask(q_len, kv_len))
    return combine_masks(*masks)
