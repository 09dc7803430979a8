"""Normalisation layers as pure functions. Statistics are computed in float32 (float64
for float64 inputs); output keeps x.dtype.

Both norms carry their closed-form derivative (a `jax.custom_jvp` rule, so forward- and
reverse-mode both work): with ``y`` the normalised input and ``r = 1/sqrt(var + eps)``,

    LayerNorm:  dy = r · (dx − mean(dx) − y · mean(y · dx))
    RMSNorm:    dy = r · (dx − y · mean(y · dx))

(exact, eps included). Its transpose reads ``y`` and ``r`` only; the derivative JAX traces through
the two-pass statistics recomputes ``x − mean`` and leaves a longer elementwise chain that XLA:CPU
fused into every consumer of the residual stream's gradient (1.7× slower GPT train step; see
`bench/step_cost.py`). The forward computation is unchanged.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

Array = jnp.ndarray


def layer_norm(x: Array, scale: Array | None = None, bias: Array | None = None, *,
               eps: float = 1e-6) -> Array:
    """LayerNorm (Ba et al. 2016): (x − mean) / sqrt(var + eps) · scale + bias over the last axis.

    Args:
      x: `[..., d]`; scale, bias: `[d]` or None.
    """
    y = _standardize(x.astype(jnp.promote_types(x.dtype, jnp.float32)), eps, True)
    if scale is not None:
        y = y * scale.astype(y.dtype)
    if bias is not None:
        y = y + bias.astype(y.dtype)
    return y.astype(x.dtype)


def rms_norm(x: Array, scale: Array | None = None, *, eps: float = 1e-6) -> Array:
    """RMSNorm (Zhang & Sennrich 2019), as in T5: x / sqrt(mean(x²) + eps) · scale; no mean, no bias."""
    y = _standardize(x.astype(jnp.promote_types(x.dtype, jnp.float32)), eps, False)
    if scale is not None:
        y = y * scale.astype(y.dtype)
    return y.astype(x.dtype)


def jax_rsqrt(x: Array) -> Array:
    return 1.0 / jnp.sqrt(x)


def _statistics(x: Array, eps: float, center: bool) -> tuple[Array, Array]:
    """(``y`` `[..., d]`, ``r = 1/sqrt(var + eps)`` `[..., 1]`): the normalised ``x`` (centred when
    ``center``: LayerNorm; else RMSNorm's root mean square)."""
    if center:
        x = x - jnp.mean(x, axis=-1, keepdims=True)
    r = jax_rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps)
    return x * r, r


@partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def _standardize(x: Array, eps: float, center: bool) -> Array:
    """``x`` `[..., d]` normalised over its last axis (see `_statistics`), with the closed-form
    derivative of the module docstring."""
    return _statistics(x, eps, center)[0]


@_standardize.defjvp
def _standardize_jvp(eps: float, center: bool, primals, tangents):
    (x,), (dx,) = primals, tangents
    y, r = _statistics(x, eps, center)
    dy = dx - y * jnp.mean(y * dx, axis=-1, keepdims=True)
    if center:
        dy = dy - jnp.mean(dx, axis=-1, keepdims=True)
    return y, r * dy


def normalize(kind: str, x: Array, params: dict, *, eps: float) -> Array:
    """Dispatch on ``kind`` ("layer" | "rms") with ``params`` holding ``scale`` and optionally ``bias``."""
    if kind == "layer":
        return layer_norm(x, params.get("scale"), params.get("bias"), eps=eps)
    if kind == "rms":
        return rms_norm(x, params.get("scale"), eps=eps)
    raise ValueError(f"norm kind must be 'layer' or 'rms', got {kind!r}")
