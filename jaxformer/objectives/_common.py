"""Helpers shared by the device-side objectives: option look-up, batch defaults, per-segment shifts.

All array functions are pure `jax.numpy` and jit-able. Shapes: `[batch, length]`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

Array = jnp.ndarray


# Objective options with their defaults, and the objectives that read each (every other objective
# refuses a non-default value: `jaxformer.objectives.check_objective`).
OPTION_DEFAULTS: dict[str, Any] = {
    "mask_rate": 0.15, "mask_token_fraction": 0.8, "random_token_fraction": 0.1,  # BERT 80/10/10
    "whole_word_mask": False,
    "noise_density": 0.15, "mean_span_length": 3.0,                               # T5 §3.1.4
    "infill_rate": 0.3, "poisson_lambda": 3.0, "delete_rate": 0.0, "token_mask_rate": 0.0,  # BART
}
OBJECTIVE_OPTIONS: dict[str, tuple[str, ...]] = {
    "mlm": ("mask_rate", "mask_token_fraction", "random_token_fraction", "whole_word_mask"),
    "span_corruption": ("noise_density", "mean_span_length"),
    "denoise": ("infill_rate", "poisson_lambda", "delete_rate", "token_mask_rate"),
}
_DEFAULT = object()


def option(cfg: Any, key: str, default: Any = _DEFAULT) -> Any:
    """``cfg.key`` for a ConfigDict, dict, dataclass or None; ``default`` (for the options above
    `OPTION_DEFAULTS[key]`) when absent or None."""
    if default is _DEFAULT:
        default = OPTION_DEFAULTS[key]
    if cfg is None:
        return default
    if isinstance(cfg, Mapping) or hasattr(cfg, "get"):
        value = cfg.get(key, default)
    else:
        value = getattr(cfg, key, default)
    return default if value is None else value


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
