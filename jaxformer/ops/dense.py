"""Linear projections over named parameter dicts (``kernel`` and optional ``bias``)."""

from __future__ import annotations

import jax.numpy as jnp

from jaxformer.ops.ring_attention import active as sequence_split

Array = jnp.ndarray


def dense(params: dict, x: Array, *, in_axes: int = 1) -> Array:
    """y = x · kernel + bias, contracting the last ``in_axes`` axes of x with the first of kernel.

    Kernels may have several output axes (e.g. `[d_model, heads, head_dim]` for attention
    projections, or `[heads, head_dim, d_model]` with ``in_axes=2`` for the output projection).
    The kernel is cast to ``x.dtype`` (the compute dtype); parameters may be stored in float32.

    The leading (batch) axes of x are flattened into one, `[B, L, ...]` → `[B·L, ...]`, for the
    contraction: the kernel's gradient is then one contraction over that axis whose result comes
    out in the kernel's own axis order. Contracting over `[B, L]` instead makes autodiff transpose
    the gradient afterwards, which XLA:CPU folds into a dot with both operands transposed, about
    1.5–2× slower there (`bench/op_profile.py`). The values are the same. Not while the sequence
    is split over a context-parallel mesh axis (`jaxformer.ops.ring_attention.active`): a merged
    `[B·L]` axis cannot keep a split of its minor part ``L``, so the partitioner would all-gather
    the activations along the length (seen with per-device batches > 1).
    """
    kernel = params["kernel"].astype(x.dtype)
    batch_shape, features = x.shape[: x.ndim - in_axes], x.shape[x.ndim - in_axes:]
    contract = tuple(range(in_axes))
    if sequence_split() is not None:
        y = jnp.tensordot(x, kernel, axes=(tuple(range(x.ndim - in_axes, x.ndim)), contract))
    else:
        x_flat = x.reshape((-1, *features))
        y = jnp.tensordot(x_flat, kernel, axes=(tuple(range(1, in_axes + 1)), contract))
        y = y.reshape(batch_shape + kernel.shape[in_axes:])
    if params.get("bias") is not None:
        y = y + params["bias"].astype(x.dtype)
    return y
