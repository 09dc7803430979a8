"""Helpers shared by the device-side objectives: batch checks and defaults, per-segment shifts.

All array functions are pure `jax.numpy` and jit-able. Shapes: `[batch, length]`.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax.numpy as jnp

Array = jnp.ndarray


def require(batch: Mapping[str, Array], objective: str, *keys: str) -> None:
    """Raise a ValueError naming the objective when ``batch`` lacks one of ``keys``."""
    missing = [k for k in keys if k not in batch]
    if missing:
        raise ValueError(f"objective {objective!r} needs batch keys {list(keys)}; missing "
                         f"{missing} (batch has {sorted(batch)})")


def segments_and_positions(batch: Mapping[str, Array], prefix: str, pad_id: int
                           ) -> tuple[Array, Array, Array]:
    """``(tokens, segment_ids, positions)`` of feature ``prefix``, each `[B, L]` int32.

    Missing ``{prefix}_segment_ids`` default to 1 on non-pad tokens and 0 on ``pad_id`` (one
    segment per row); missing ``{prefix}_positions`` default to ``0..L-1``.
    """
    tokens = jnp.asarray(batch[prefix], jnp.int32)
    seg = batch.get(f"{prefix}_segment_ids")
    seg = (tokens != pad_id).astype(jnp.int32) if seg is None else jnp.asarray(seg, jnp.int32)
    pos = batch.get(f"{prefix}_positions")
    if pos is None:
        pos = jnp.broadcast_to(jnp.arange(tokens.shape[-1], dtype=jnp.int32), tokens.shape)
    return tokens, seg, jnp.asarray(pos, jnp.int32)


def shift_left_within_segments(x: Array, segment_ids: Array, fill: int = 0) -> tuple[Array, Array]:
    """Next-element view of packed rows: ``(x[t+1], valid)`` per position, both `[B, L]`.

    ``valid[b, t]`` is True when position ``t+1`` exists, is not padding and belongs to the same
    segment as ``t`` (so no prediction crosses a packed-segment boundary); elsewhere the shifted
    value is ``fill``.
    """
    nxt = jnp.pad(x[:, 1:], ((0, 0), (0, 1)), constant_values=fill)
    nxt_seg = jnp.pad(segment_ids[:, 1:], ((0, 0), (0, 1)))
    valid = (segment_ids != 0) & (nxt_seg == segment_ids)
    return jnp.where(valid, nxt, fill), valid


def shift_right_within_segments(x: Array, segment_ids: Array, start: int, pad: int = 0) -> Array:
    """Teacher-forcing decoder input of packed rows `[B, L]`: ``x[t-1]``, or ``start`` at the first
    position of each segment; ``pad`` on padding (segment id 0)."""
    prev = jnp.pad(x[:, :-1], ((0, 0), (1, 0)), constant_values=start)
    prev_seg = jnp.pad(segment_ids[:, :-1], ((0, 0), (1, 0)))
    out = jnp.where(prev_seg == segment_ids, prev, start)
    return jnp.where(segment_ids != 0, out, pad)
