"""Linear projections over named parameter dicts (``kernel`` and optional ``bias``)."""

from __future__ import annotations

import jax.numpy as jnp

Array = jnp.ndarray


def dense(params: dict, x: Array, *, in_axes: int = 1) -> Array:
    """y = x · kernel + bias, contracting the last ``in_axes`` axes of x with the first of kernel.

    Kernels may have several output axes (e.g. `[d_model, heads, head_dim]` for attention
    projections, or `[heads, head_dim, d_model]` with ``in_axes=2`` for the output projection).
    The kernel is cast to ``x.dtype`` (the compute dtype); parameters may be stored in float32.
    """
    kernel = params["kernel"].astype(x.dtype)
    y = jnp.tensordot(x, kernel, axes=(tuple(range(x.ndim - in_axes, x.ndim)), tuple(range(in_axes))))
    if params.get("bias") is not None:
        y = y + params["bias"].astype(x.dtype)
    return y
