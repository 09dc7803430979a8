"""The decoding cache as a pytree: allocation, batch-axis discovery, beam expansion and reordering.

The model's ``cache`` collection (see `jaxformer.ops.blocks` and `jaxformer.models.transformer`)
holds, for a batch ``B`` and maximum target length ``S``:

* per layer, self-attention ``key``/``value`` `[B, S, K, Dh]` and ``valid`` `[B, S]`, and for
  encoder-decoder models the cross-attention keys/values `[B, S_src, K, Dh]`; with
  ``scan_layers=True`` each of these gets a leading ``layers`` axis (`[layers, B, ...]`);
* model-level ``index`` (a scalar: the next slot) and ``positions`` `[B, S]`.

Repeating or reordering rows acts on every leaf's *batch* axis, which is axis 0 or 1 depending on
the stack, and must leave scalars alone; growing the cache (`grow_slots`: the decoding loops
allocate the slots they reach, so that attention does not read empty ones) acts on every leaf's
*slot* axis. Rather than hard-coding that structure, `cache_batch_axes` compares the abstract caches
of batch 1 and batch 2 (`jax.eval_shape`, no computation), `cache_slot_axes` those of 1 and 2 slots:
the one axis whose size changes is the batch (slot) axis, leaves that do not change have none
(marked ``-1``). This stays correct if the cache layout changes, and when ``batch == num_layers``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jnp.ndarray
PyTree = Any
NO_BATCH_AXIS = -1


def _abstract_cache(model: nn.Module, batch_size: int, max_length: int,
                    source_length: int | None) -> PyTree:
    """Shapes/dtypes (`jax.ShapeDtypeStruct`) of the cache for these sizes, without computing it."""
    family = model.cfg.family
    # The cache is sized by an init pass over max_length tokens; the attention implementation does
    # not change it, so the (cheaper to trace) plain XLA path is used.
    model = model.clone(cfg=dataclasses.replace(model.cfg, attention_impl="xla"))
    tokens = jax.ShapeDtypeStruct((batch_size, max_length), jnp.int32)
    rng = jax.random.key(0)
    if family == "decoder":
        shapes = jax.eval_shape(lambda t: model.init(rng, t, decode=True), tokens)
    elif family == "encoder_decoder":
        if source_length is None:
            raise ValueError("an encoder-decoder cache needs source_length (the padded source "
                             "length, which sizes the cached cross-attention keys/values)")
        src = jax.ShapeDtypeStruct((batch_size, source_length), jnp.int32)
        shapes = jax.eval_shape(lambda s, t: model.init(rng, s, t, decode=True), src, tokens)
    else:
        raise ValueError(f"model.family={family!r} cannot generate: use a 'decoder' or "
                         "'encoder_decoder' model")
    return shapes["cache"]


def init_cache(model: nn.Module, batch_size: int, max_length: int,
               source_length: int | None = None) -> PyTree:
    """A zero cache for ``batch_size`` rows of up to ``max_length`` target tokens.

    Equivalent to ``model.init(rng, tokens_of_max_length, decode=True)["cache"]`` without running
    the model (shapes come from `jax.eval_shape`). ``source_length`` is required for
    encoder-decoder models.
    """
    shapes = _abstract_cache(model, batch_size, max_length, source_length)
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def _changing_axes(one: PyTree, two: PyTree, what: str) -> PyTree:
    """Per leaf, the one axis whose size differs between abstract caches ``one`` and ``two``."""
    def axis(a, b):
        diff = [i for i, (x, y) in enumerate(zip(a.shape, b.shape)) if x != y]
        if len(diff) > 1:
            raise ValueError(f"cache leaf {a.shape} vs {b.shape} changes on several axes with "
                             f"the {what}; cannot tell its {what} axis")
        return diff[0] if diff else NO_BATCH_AXIS

    return jax.tree.map(axis, one, two)


def cache_batch_axes(model: nn.Module, max_length: int, source_length: int | None = None) -> PyTree:
    """Pytree like the cache with, per leaf, the index of its batch axis (``-1``: no batch axis)."""
    return _changing_axes(_abstract_cache(model, 1, max_length, source_length),
                          _abstract_cache(model, 2, max_length, source_length), "batch")


def cache_slot_axes(model: nn.Module, batch_size: int, source_length: int | None = None) -> PyTree:
    """Pytree like the cache with, per leaf, the index of its slot axis (the one sized by the
    maximum target length; ``-1``: none, e.g. the cross-attention keys and the index)."""
    return _changing_axes(_abstract_cache(model, batch_size, 1, source_length),
                          _abstract_cache(model, batch_size, 2, source_length), "slot")


def grow_slots(tree: PyTree, axes: PyTree, slots: int) -> PyTree:
    """Pad each leaf's slot axis (``axes``, see `cache_slot_axes`) to ``slots`` with zeros: empty
    slots, which attention never sees (their validity is False)."""
    def pad(x, ax):
        if ax == NO_BATCH_AXIS or x.shape[ax] >= slots:
            return x
        widths = [(0, 0)] * x.ndim
        widths[ax] = (0, slots - x.shape[ax])
        return jnp.pad(x, widths)

    return jax.tree.map(pad, tree, axes)


def expand_beams(tree: PyTree, axes: PyTree, beam_size: int) -> PyTree:
    """Repeat each row ``beam_size`` times along its batch axis: row ``b`` → rows ``b·k … b·k+k−1``.

    `[.., B, ..]` → `[.., B·k, ..]`; leaves with axis ``-1`` are returned unchanged.
    """
    return jax.tree.map(
        lambda x, ax: x if ax == NO_BATCH_AXIS else jnp.repeat(x, beam_size, axis=ax), tree, axes)


def gather_rows(tree: PyTree, axes: PyTree, indices: Array) -> PyTree:
    """Select rows ``indices`` `[N]` along each leaf's batch axis (beam reordering)."""
    return jax.tree.map(
        lambda x, ax: x if ax == NO_BATCH_AXIS else jnp.take(x, indices, axis=ax), tree, axes)
