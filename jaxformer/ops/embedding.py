"""Token embedding lookup and the tied unembedding (logits = h · Eᵀ)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

Array = jnp.ndarray


def embed(table: Array, ids: Array, *, dtype=None) -> Array:
    """Rows of ``table`` `[vocab, d]` at ``ids`` of any shape `[...]` → `[..., d]`.

    JAX clamps out-of-range gathers silently; here an id outside ``[0, vocab)`` yields NaN so the bad
    batch is visible in the loss (the trainer also checks ids on the host before they reach the model,
    see `check_token_ids`).
    """
    out = take_rows(table, ids)
    return out if dtype is None else out.astype(dtype)


def take_rows(table: Array, ids: Array) -> Array:
    """``table[ids]`` along axis 0 with NaN rows for ids outside ``[0, len(table))``.

    `jnp.take` wraps negative ids (NumPy style) even in ``mode="fill"``, so they are sent past the end
    first: -1 must not silently read the last row.
    """
    ids = jnp.asarray(ids)
    ids = jnp.where(ids < 0, table.shape[0], ids)
    return jnp.take(table, ids, axis=0, mode="fill", fill_value=jnp.nan)


def attend(table: Array, x: Array) -> Array:
    """Tied output projection: `[..., d]` · `[vocab, d]`ᵀ → `[..., vocab]` (Press & Wolf 2017)."""
    return jnp.einsum("...d,vd->...v", x, table.astype(x.dtype))


def check_token_ids(ids, vocab_size: int, name: str = "tokens") -> None:
    """Raise ValueError if concrete ``ids`` fall outside ``[0, vocab_size)`` (no-op on tracers)."""
    check_ids(ids, vocab_size, name, f"the vocabulary [0, {vocab_size})",
              "check the tokenizer's vocab size against model.vocab_size")


def check_ids(ids, size: int, name: str, table: str, fix: str) -> None:
    """Raise ValueError if concrete ``ids`` fall outside ``[0, size)``, naming ``table`` and the
    ``fix`` (no-op on tracers: under jit an out-of-range lookup gives NaN, see `take_rows`)."""
    if isinstance(ids, jax.core.Tracer):
        return
    a = np.asarray(ids)
    if a.size and (a.min() < 0 or a.max() >= size):
        bad = a[(a < 0) | (a >= size)]
        raise ValueError(f"{name} contain ids outside {table}: e.g. {bad[:5].tolist()} "
                         f"(min {a.min()}, max {a.max()}); {fix}")
