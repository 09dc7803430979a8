"""Inverted dropout (Srivastava et al. 2014) as a pure function."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def dropout(x: jnp.ndarray, rate: float, rng: jax.Array | None) -> jnp.ndarray:
    """Zero each element with probability ``rate`` and scale survivors by 1/(1−rate).

    Identity when ``rate == 0`` or ``rng is None`` (deterministic / evaluation mode).
    """
    if rate <= 0.0 or rng is None:
        return x
    if rate >= 1.0:
        return jnp.zeros_like(x)
    keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x)).astype(x.dtype)


def token_dropout(x: jnp.ndarray, rate: float, rng: jax.Array | None) -> jnp.ndarray:
    """Word dropout: zero whole token vectors of ``x`` `[..., length, d]` with probability ``rate``
    (no rescaling: a dropped token reads as "unknown word"; Gal & Ghahramani 2016, §4).

    Identity when ``rate == 0`` or ``rng is None``.
    """
    if rate <= 0.0 or rng is None:
        return x
    keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape[:-1])
    return jnp.where(keep[..., None], x, jnp.zeros_like(x))
