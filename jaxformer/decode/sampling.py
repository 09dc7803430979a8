"""Pure functions on next-token logits `[..., vocab]`: temperature, top-k, top-p, sampling.

Filters return logits with excluded tokens set to −∞, so they compose in any order and feed
`jax.random.categorical` directly. `sample` applies them in the usual order: temperature, then
top-k, then top-p (as in Hugging Face `generate`).

* temperature: softmax(z / T) (Ackley et al. 1985; T → 0 is argmax, T = 1 the model).
* top-k: keep the k largest logits (Fan et al. 2018, "Hierarchical Neural Story Generation").
* top-p / nucleus: keep the smallest set of most likely tokens whose probability mass is ≥ p
  (Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration", eq. 2).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

Array = jnp.ndarray
NUCLEUS_CANDIDATES = 256  # top_p_filter looks for the nucleus among these first


def argmax(logits: Array) -> Array:
    """``jnp.argmax(logits, axis=-1)`` of `[..., V]` → `[...]` int32, the same ids (the first of ties;
    the first NaN if a row has one) from two plain reductions, a max and a min over the ids that
    reach it: XLA:CPU's (value, index) reduce behind ``jnp.argmax`` took 0.29 / 1.1 ms per greedy
    step at batch 8 / 32 over 8,192 logits, these 0.07 / 0.2 ms (`docs/generation.md`)."""
    top = jnp.max(logits, axis=-1, keepdims=True)  # NaN if the row has one
    hit = jnp.logical_or(logits == top, jnp.isnan(logits))
    ids = jnp.arange(logits.shape[-1], dtype=jnp.int32)
    return jnp.min(jnp.where(hit, ids, logits.shape[-1]), axis=-1)


def apply_temperature(logits: Array, temperature: float) -> Array:
    """`[..., V]` logits / ``temperature`` (> 0). `sample(temperature=0)` gives the argmax."""
    if isinstance(temperature, (int, float)) and temperature <= 0:
        raise ValueError(f"temperature={temperature} is invalid: must be > 0 here (temperature 0 "
                         "means greedy decoding: call sample(..., temperature=0) or use argmax)")
    return logits / jnp.asarray(temperature, logits.dtype)


def top_k_filter(logits: Array, k: int) -> Array:
    """Keep exactly the ``k`` largest of `[..., V]` logits (ties: lower id first), −∞ elsewhere."""
    vocab = logits.shape[-1]
    if not isinstance(k, int) or isinstance(k, bool) or not 0 < k:
        raise ValueError(f"top_k={k!r} is invalid: must be a positive integer (None disables it)")
    if k >= vocab:
        return logits
    values, idx = lax.top_k(logits, k)
    out = jnp.full_like(logits, -jnp.inf)
    return jnp.put_along_axis(out, idx, values, axis=-1, inplace=False)


def top_p_filter(logits: Array, p: float) -> Array:
    """Nucleus filter of `[..., V]` logits: keep the smallest top set with probability mass ≥ ``p``.

    A token is kept when the mass of the tokens ranked strictly above it is < ``p``; the most
    likely token is always kept. ``p`` in (0, 1]; 1 keeps every token. When the
    ``NUCLEUS_CANDIDATES`` most likely tokens (`lax.top_k`) hold mass ≥ ``p`` in every row, the
    nucleus is among them and the vocabulary is not sorted (XLA:CPU's sort of 8,192 logits took
    31 ms per step at batch 8, 3× a d512 GPT step; `docs/generation.md`).
    """
    if isinstance(p, (int, float)) and not 0.0 < p <= 1.0:
        raise ValueError(f"top_p={p!r} is invalid: must be in (0, 1] (None disables it)")
    vocab = logits.shape[-1]

    def in_sorted_order(order):  # keep the nucleus of the tokens `order` lists, best first
        keep_sorted = _nucleus(jnp.take_along_axis(logits, order, axis=-1), p, normaliser)
        return jnp.put_along_axis(jnp.full_like(logits, -jnp.inf), order,
                                  jnp.where(keep_sorted, jnp.take_along_axis(logits, order, -1),
                                            -jnp.inf), axis=-1, inplace=False)

    normaliser = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1, keepdims=True)
    if vocab <= NUCLEUS_CANDIDATES:
        return in_sorted_order(jnp.argsort(-logits, axis=-1, stable=True))
    _, top = lax.top_k(logits, NUCLEUS_CANDIDATES)  # argsort's order: ties lower id first
    top_mass = jnp.sum(jnp.exp(jnp.take_along_axis(logits, top, -1).astype(jnp.float32)
                               - normaliser), axis=-1)
    return lax.cond(jnp.all(top_mass >= p), lambda: in_sorted_order(top),
                    lambda: in_sorted_order(jnp.argsort(-logits, axis=-1, stable=True)))


def _nucleus(sorted_logits: Array, p: float, normaliser: Array | None = None) -> Array:
    """Which of `[..., m]` logits sorted in decreasing order are in the nucleus: the mass ranked
    strictly above < ``p``. ``normaliser``: log Σ exp over all tokens `[..., 1]` (None: these m
    hold every token with a nonzero probability)."""
    z = sorted_logits.astype(jnp.float32)
    if normaliser is None:
        normaliser = jax.nn.logsumexp(z, axis=-1, keepdims=True)
    probs = jnp.exp(z - normaliser)
    keep = jnp.cumsum(probs, axis=-1) - probs < p
    return keep.at[..., 0].set(True)


def top_k_top_p_filter(logits: Array, k: int, p: float) -> Array:
    """``top_p_filter(top_k_filter(logits, k), p)`` from one `lax.top_k`: the nucleus is found
    among the ``k`` kept tokens, without sorting the whole vocabulary (which cost 5× the model
    step of a batch-8 d512 GPT, `docs/generation.md`). Equal up to float rounding of the mass at
    the nucleus' edge (its softmax sums ``k`` terms, not ``V``)."""
    if not isinstance(k, int) or isinstance(k, bool) or not 0 < k:
        raise ValueError(f"top_k={k!r} is invalid: must be a positive integer (None disables it)")
    if k >= logits.shape[-1]:
        return top_p_filter(logits, p)
    values, idx = lax.top_k(logits, k)  # decreasing, ties: lower id first (argsort's order)
    kept = jnp.where(_nucleus(values, p), values, -jnp.inf)
    return jnp.put_along_axis(jnp.full_like(logits, -jnp.inf), idx, kept, axis=-1, inplace=False)


def sample(
    rng: jax.Array,
    logits: Array,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> Array:
    """Draw one token id per row of `[..., V]` logits → `[...]` int32.

    ``temperature == 0`` (a Python number) returns the argmax (greedy; ``top_k``/``top_p`` are then
    irrelevant). ``top_k`` None/0 and ``top_p`` None/1.0 disable those filters. ``temperature``
    and ``top_p`` may be traced scalars (then > 0 and in (0, 1] is the caller's promise). The same
    ``rng`` gives the same tokens.
    """
    if isinstance(temperature, (int, float)):
        if temperature < 0:
            raise ValueError(f"temperature={temperature!r} is invalid: must be >= 0 (0 = greedy)")
        if temperature == 0:
            return argmax(logits)
    logits = apply_temperature(logits.astype(jnp.float32), temperature)
    if isinstance(top_p, (int, float)):
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p={top_p!r} is invalid: must be in (0, 1] (None disables it)")
        top_p = None if top_p == 1.0 else top_p
    if top_k and top_p is not None:
        logits = top_k_top_p_filter(logits, top_k, top_p)
    elif top_k:
        logits = top_k_filter(logits, top_k)
    elif top_p is not None:
        logits = top_p_filter(logits, top_p)
    return jax.random.categorical(rng, logits, axis=-1).astype(jnp.int32)
