"""SpanBERT span masking (Joshi et al. 2020, §3.1): contiguous spans instead of single tokens.

Per row, spans are added one after another until the masking budget (``round(mask_rate · n)`` of
the row's ``n`` candidate tokens, at least one; BERT's 15%) is reached:

1. a length ``ℓ`` in units (a unit is a whole word where the tokenizer marks word-initial pieces,
   else a token) is drawn from the geometric distribution Geo(p) restricted to
   ``1 … max_span_length`` (SpanBERT: p = 0.2, ℓ_max = 10, mean ≈ 3.8 words; `clipped_geometric_pmf`);
2. its start is drawn uniformly among the units where ``ℓ`` free units follow within one *run* (a
   maximal stretch of candidate tokens of one packed segment), so a span never covers
   [CLS]/[SEP]/pads, never crosses a segment and never overlaps an earlier span (each token belongs
   to one span); when no start fits, the draw is skipped and the next iteration draws again (so
   rows whose runs are all shorter than ``max_span_length`` units get the distribution restricted
   to the lengths that fit);
3. the span covers units ``u … u+ℓ-1``, except that the row's last span stops when the budget is
   reached (whole units: a word is never cut, so a row may exceed its budget by part of a word).
   Every other span has exactly its drawn length, so span lengths follow the distribution;
4. the 80/10/10 decision ([MASK] / random token / unchanged) is drawn once per span and applied to
   all its tokens (SpanBERT §3.1); random replacements are drawn per token.

Device side, pure ``jnp`` with fixed shapes (`jax.lax.while_loop` over candidate spans, one per row
per iteration, stopping when every row has its budget; at most ``2L + 16``), inside the
jitted step like the rest of `jaxformer.objectives.mlm`: masks are redrawn from the step key each
time a row is seen (RoBERTa's dynamic masking), packed rows need no host-side work, and resume
determinism comes with the step key. The reference implementation draws its start token uniformly
(moved to its word's start, which favours long words) and lets spans run into earlier ones, which
makes the realised lengths shorter than drawn; here the start *word* is uniform among those where
the drawn span fits.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

Array = jnp.ndarray
MASKINGS = ("token", "span")


def clipped_geometric_pmf(p: float, max_length: int) -> np.ndarray:
    """P(ℓ) for ℓ = 1 … ``max_length`` (float64 `[max_length]`): Geo(p), ``p (1-p)^(ℓ-1)``,
    restricted to ℓ ≤ max_length and renormalised (SpanBERT §3.1; its mean is 3.8 at p = 0.2, 10)."""
    lengths = np.arange(1, max_length + 1)
    pmf = p * (1.0 - p) ** (lengths - 1)
    return pmf / pmf.sum()


def check_span_options(p: float, max_length: int) -> None:
    """ValueError naming ``objective.span_geometric_p`` / ``max_span_length`` when out of range."""
    if not 0.0 < p <= 1.0:
        raise ValueError(f"objective.span_geometric_p={p} must be in (0, 1] (SpanBERT uses 0.2)")
    if not isinstance(max_length, int | np.integer) or max_length < 1:
        raise ValueError(f"objective.max_span_length={max_length!r} must be an integer >= 1 "
                         "(SpanBERT uses 10)")


class Spans(NamedTuple):
    """The spans of a batch, each `[B, L]`: ``chosen`` bool; ``span_id`` int32 (the iteration
    that added the token's span, -1 outside spans); ``drawn`` int32 (that span's sampled length in
    units, 0 outside); ``how`` float32 (the span's uniform draw deciding [MASK]/random/keep)."""

    chosen: Array
    span_id: Array
    drawn: Array
    how: Array


def run_starts(candidates: Array, segment_ids: Array) -> Array:
    """Bool `[B, L]`: candidates that begin a run (the previous token is not a candidate of the
    same segment)."""
    prev_cand = jnp.pad(candidates[:, :-1], ((0, 0), (1, 0)))
    prev_seg = jnp.pad(segment_ids[:, :-1], ((0, 0), (1, 0)))
    return candidates & (~prev_cand | (prev_seg != segment_ids))


def sample_spans(rng: jax.Array, candidates: Array, unit_starts: Array, head: Array,
                 segment_ids: Array, budget: Array, p: float, max_length: int) -> Spans:
    """SpanBERT spans (module docstring) over rows `[B, L]`.

    Args:
      candidates: bool `[B, L]`, the maskable tokens (not special, not padding).
      unit_starts: bool `[B, L]`, the candidates that begin a unit (a word, or every candidate).
      head: int `[B, L]`, the index of the start of the unit holding each token.
      segment_ids: int `[B, L]`, packed segments (0 = padding).
      budget: int `[B]`, tokens to mask per row.
      p, max_length: the length distribution, `clipped_geometric_pmf`.
    """
    check_span_options(p, max_length)
    batch, length = candidates.shape
    unit_idx = jnp.cumsum(unit_starts, axis=1, dtype=jnp.int32) - 1
    n_units = jnp.sum(unit_starts, axis=1, dtype=jnp.int32)
    starts_run = run_starts(candidates, segment_ids)
    pmf = jnp.asarray(clipped_geometric_pmf(p, max_length), jnp.float32)
    budget = jnp.asarray(budget, jnp.int32)
    big = jnp.int32(length + max_length + 1)
    max_iterations = 2 * length + 16  # each draw of length 1 (p ≥ 0.2 at p = 0.2) fits a free unit

    def body(state):
        i, chosen, span_id, drawn, how, count = state
        k_start, k_len, k_how = jax.random.split(jax.random.fold_in(rng, i), 3)
        span_len = jax.random.choice(k_len, max_length, (batch,), p=pmf).astype(jnp.int32) + 1
        # units free for span_len units: no earlier span and no run start among the next ones
        barrier = jnp.where(unit_starts & (chosen | starts_run), unit_idx, big)
        after = jnp.pad(barrier[:, 1:], ((0, 0), (0, 1)), constant_values=big)
        next_barrier = jnp.flip(jax.lax.cummin(jnp.flip(after, 1), axis=1), 1)
        room = jnp.minimum(next_barrier, n_units[:, None]) - unit_idx
        fits = unit_starts & ~chosen & (room >= span_len[:, None])
        start = jnp.argmax(jnp.where(fits, jax.random.uniform(k_start, fits.shape), -1.0), axis=1)
        u = jnp.take_along_axis(unit_idx, start[:, None], axis=1)
        in_span = candidates & (unit_idx >= u) & (unit_idx < u + span_len[:, None])
        # span tokens before each token's unit: whole units are added while under the budget
        before = jnp.cumsum(in_span, axis=1, dtype=jnp.int32) - in_span
        before = jnp.take_along_axis(before, head, axis=1)
        active = (count < budget) & jnp.any(fits, axis=1)
        new = in_span & active[:, None] & (count[:, None] + before < budget[:, None])
        h = jax.random.uniform(k_how, (batch,))
        return (i + 1, chosen | new, jnp.where(new, i, span_id),
                jnp.where(new, span_len[:, None], drawn), jnp.where(new, h[:, None], how),
                count + jnp.sum(new, axis=1, dtype=jnp.int32))

    def more(state):
        i, count = state[0], state[-1]
        return (i < max_iterations) & jnp.any(count < budget)

    zeros = jnp.zeros((batch, length), jnp.int32)
    init = (jnp.int32(0), jnp.zeros((batch, length), bool), zeros - 1, zeros,
            jnp.zeros((batch, length), jnp.float32), jnp.zeros((batch,), jnp.int32))
    _, chosen, span_id, drawn, how, _ = jax.lax.while_loop(more, body, init)
    return Spans(chosen, span_id, drawn, how)
