"""The decoding cache as a pytree: allocation, batch-axis discovery, beam expansion and reordering.

The model's KV cache (`jaxformer.models.model.init_cache`'s pure dict, laid out by
`jaxformer.ops.stack.stack_cache`) holds, for a batch ``B`` and maximum target length ``S``:

* per layer, self-attention ``key``/``value`` `[B, K, S, Dh]` and ``valid`` `[B, S]`, and for
  encoder-decoder models the cross-attention keys/values `[B, K, S_src, Dh]`; with
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

from typing import Any

import jax
import jax.numpy as jnp

from jaxformer.models.model import init_cache as model_cache

Array = jnp.ndarray
PyTree = Any
NO_BATCH_AXIS = -1


def _abstract_cache(model: Any, batch_size: int, max_length: int,
                    source_length: int | None) -> PyTree:
    """Shapes/dtypes (`jax.ShapeDtypeStruct`) of the cache for these sizes, without computing it.
    ``model``: anything with the model's ``cfg`` (a `jaxformer.models.Model`, an NNX model)."""
    return jax.eval_shape(lambda: model_cache(model.cfg, batch_size, max_length, source_length))


def init_cache(model: Any, batch_size: int, max_length: int,
               source_length: int | None = None) -> PyTree:
    """A zero cache for ``batch_size`` rows of up to ``max_length`` target tokens: the model's one
    `jaxformer.models.model.init_cache`. ``source_length`` is required for encoder-decoder models."""
    return model_cache(model.cfg, batch_size, max_length, source_length)


def _changing_axes(one: PyTree, two: PyTree, what: str) -> PyTree:
    """Per leaf, the one axis whose size differs between abstract caches ``one`` and ``two``."""
    def axis(a, b):
        diff = [i for i, (x, y) in enumerate(zip(a.shape, b.shape)) if x != y]
        if len(diff) > 1:
            raise ValueError(f"cache leaf {a.shape} vs {b.shape} changes on several axes with "
                             f"the {what}; cannot tell its {what} axis")
        return diff[0] if diff else NO_BATCH_AXIS

    return jax.tree.map(axis, one, two)


def cache_batch_axes(model: Any, max_length: int, source_length: int | None = None) -> PyTree:
    """Pytree like the cache with, per leaf, the index of its batch axis (``-1``: no batch axis)."""
    return _changing_axes(_abstract_cache(model, 1, max_length, source_length),
                          _abstract_cache(model, 2, max_length, source_length), "batch")


def cache_slot_axes(model: Any, batch_size: int, source_length: int | None = None) -> PyTree:
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
