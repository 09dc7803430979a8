"""Inverted dropout (Srivastava et al. 2014) as a pure function."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _static_rate(rate) -> float | None:
    """``rate`` as a Python float, or None when it is traced (a `jit` argument)."""
    try:
        return float(rate)
    except (TypeError, jax.errors.ConcretizationTypeError):
        return None


def is_active(rate, rng: jax.Array | None) -> bool:
    """Whether dropout with ``rate`` and ``rng`` may drop anything (a traced rate may)."""
    r = _static_rate(rate)
    return rng is not None and (r is None or r > 0.0)


def dropout(x: jnp.ndarray, rate: float | jax.Array, rng: jax.Array | None) -> jnp.ndarray:
    """Zero each element with probability ``rate`` and scale survivors by 1/(1−rate).

    Identity when ``rate == 0`` or ``rng is None`` (deterministic / evaluation mode). ``rate`` may
    be a Python float (zero costs nothing) or a traced scalar, e.g. an argument of a jitted
    function (then the mask is drawn whatever its value; rate 1 gives zeros).
    """
    if not is_active(rate, rng):
        return x
    r = _static_rate(rate)
    if r is not None and r >= 1.0:
        return jnp.zeros_like(x)
    keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
    if r is not None:
        return jnp.where(keep, x / (1.0 - r), jnp.zeros_like(x)).astype(x.dtype)
    # traced: divide by 1 where rate is 1 (all dropped anyway), so gradients stay finite
    survivors = x / jnp.where(rate < 1.0, 1.0 - rate, 1.0)
    return jnp.where(keep, survivors, jnp.zeros_like(x)).astype(x.dtype)


def token_dropout(x: jnp.ndarray, rate: float | jax.Array, rng: jax.Array | None
                  ) -> jnp.ndarray:
    """Word dropout: zero whole token vectors of ``x`` `[..., length, d]` with probability ``rate``
    (no rescaling: a dropped token reads as "unknown word"; Gal & Ghahramani 2016, §4).

    Identity when ``rate == 0`` or ``rng is None``; ``rate`` may be traced, as in `dropout`.
    """
    if not is_active(rate, rng):
        return x
    keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape[:-1])
    return jnp.where(keep[..., None], x, jnp.zeros_like(x))
