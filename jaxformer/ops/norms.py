"""Normalisation layers as pure functions. Statistics are computed in float32 (float64
for float64 inputs); output keeps x.dtype."""

from __future__ import annotations

import jax.numpy as jnp

Array = jnp.ndarray


def layer_norm(x: Array, scale: Array | None = None, bias: Array | None = None, *,
               eps: float = 1e-6) -> Array:
    """LayerNorm (Ba et al. 2016): (x − mean) / sqrt(var + eps) · scale + bias over the last axis.

    Args:
      x: `[..., d]`; scale, bias: `[d]` or None.
    """
    xf = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
    y = (xf - mean) * jax_rsqrt(var + eps)
    if scale is not None:
        y = y * scale.astype(xf.dtype)
    if bias is not None:
        y = y + bias.astype(xf.dtype)
    return y.astype(x.dtype)


def rms_norm(x: Array, scale: Array | None = None, *, eps: float = 1e-6) -> Array:
    """RMSNorm (Zhang & Sennrich 2019), as in T5: x / sqrt(mean(x²) + eps) · scale; no mean, no bias."""
    xf = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    y = xf * jax_rsqrt(jnp.mean(jnp.square(xf), axis=-1, keepdims=True) + eps)
    if scale is not None:
        y = y * scale.astype(xf.dtype)
    return y.astype(x.dtype)


def jax_rsqrt(x: Array) -> Array:
    return 1.0 / jnp.sqrt(x)


def normalize(kind: str, x: Array, params: dict, *, eps: float) -> Array:
    """Dispatch on ``kind`` ("layer" | "rms") with ``params`` holding ``scale`` and optionally ``bias``."""
    if kind == "layer":
        return layer_norm(x, params.get("scale"), params.get("bias"), eps=eps)
    if kind == "rms":
        return rms_norm(x, params.get("scale"), eps=eps)
    raise ValueError(f"norm kind must be 'layer' or 'rms', got {kind!r}")
