"""Inverted dropout (Srivastava et al. 2014) as a pure function, and the key its masks are drawn
with (`dropout_key`: which `jax.random` implementation generates the bits)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

# `jax.random`'s implementations: threefry2x32 (counter-based, the same bits on every backend and
# sharding; jax's default), rbg (XLA's RngBitGenerator for the bits, threefry for split/fold_in) and
# unsafe_rbg (RngBitGenerator for the bits and, of lower quality, for split/fold_in too).
PRNG_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")


def dropout_key(key: jax.Array, impl: str) -> jax.Array:
    """``key`` (a typed threefry key) as a key of `jax.random` implementation ``impl``: the key
    itself for "threefry2x32", else a key of ``impl`` whose data are bits drawn from ``key`` — a
    pure function of ``key``, so masks still depend only on (seed, step) and a resumed run draws
    the same ones. rbg's bits are XLA's RngBitGenerator: the same program gives the same bits, but
    jax documents they may change across backends, versions and shardings."""
    if impl not in PRNG_IMPLS:
        raise ValueError(f"dropout PRNG implementation {impl!r} is not one of {PRNG_IMPLS}")
    if impl == "threefry2x32":
        return key
    shape = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0, impl=impl))).shape
    return jax.random.wrap_key_data(jax.random.bits(key, shape, jnp.uint32), impl=impl)


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
