"""Beam search with the GNMT length penalty, EOS handling and early stopping, as one while_loop.

Score of a finished hypothesis ``Y`` (Wu et al. 2016, "Google's Neural Machine Translation System",
eq. 14, without the coverage term)::

    s(Y) = log p(Y | X) / lp(Y),      lp(Y) = ((5 + |Y|) / 6) ** alpha

with ``|Y|`` the number of generated tokens including EOS. Each step expands every alive beam by
every token (`[B, k·V]` candidates), keeps the best ``2k`` (so ``k`` non-EOS ones survive even if
``k`` end in EOS), moves those ending in EOS (and, at the last step, all of them) into a pool of the
``k`` best finished hypotheses, and continues the best ``k`` others.

The ``k`` beams of an example share one cache row and are never copied or reordered: the prompt
(or the encoder-decoder start token, and the cross-attention keys/values) is stored once, and step
``i`` appends the ``k`` beams' tokens as ``k`` queries at slots ``P + i·k … P + i·k + k − 1``
(``P`` the prompt's slots). Each beam's history is a path through those slots, kept as its
ancestry ``[B, k, N]`` (the column its token took at each step); reordering the beams reorders that
small table, and a beam's query sees the prompt and the slots of its own path (the ``decode_mask``
of the model's decode call). Gathering the ``B·k`` rows of the whole cache at every step instead
(a ``jnp.take`` of every cache leaf along its batch axis) cost two copies of the cache per step and made a
batch-8 beam-4 step of a d512 GPT 3× slower (`docs/generation.md`). The loop stops early
once, for every example, ``k`` hypotheses are finished and none of the alive beams can still beat
the worst of them: log-probs only decrease, so an alive beam's best reachable score is
``logp / max(lp(i + 1), lp(N))`` (the flax WMT example uses the same bound).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxformer.decode.ngram import block_repeated_ngrams
from jaxformer.decode.search import DecodeResult, GrowFn, StepFn, segmented_loop

Array = jnp.ndarray
NEG_INF = -jnp.inf


class BeamResult(NamedTuple):
    """Beam search output: the best hypothesis per example, and all ``k`` finished ones.

    Attributes:
      tokens, log_probs, lengths, scores: as `DecodeResult` for the best hypothesis
        (`[B, N]`, `[B, N]`, `[B]`, `[B]`); ``scores`` is length-penalised.
      beam_tokens, beam_log_probs: `[B, k, N]` the ``k`` finished hypotheses, best first.
      beam_lengths, beam_scores: `[B, k]`.
    """

    tokens: Array
    log_probs: Array
    lengths: Array
    scores: Array
    beam_tokens: Array
    beam_log_probs: Array
    beam_lengths: Array
    beam_scores: Array

    def sequences(self, strip_eos_id: int | None = None) -> list[list[int]]:
        """Host-side lists of the best hypotheses (see `DecodeResult.sequences`)."""
        return DecodeResult(self.tokens, self.log_probs, self.lengths, self.scores).sequences(
            strip_eos_id)


def length_penalty(length: Array, alpha: float) -> Array:
    """GNMT lp = ((5 + length) / 6) ** alpha (Wu et al. 2016, eq. 14); alpha 0 gives 1."""
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def _take(x: Array, idx: Array) -> Array:
    """x `[B, M, ...]`, idx `[B, J]` → `[B, J, ...]`."""
    return jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 2)), axis=1)


def path_mask(ancestry: Array, i: Array, prefix_slots: int) -> Array:
    """Cache slots each beam sees at step ``i``: ancestry `[B, k, N]` → `[B, k, P + N·k]` bool.

    Slot ``P + t·k + c`` holds the token that column ``c`` appended at step ``t``; beam ``j`` sees
    it when ``t ≤ i`` and ``ancestry[b, j, t] == c``. The ``P = prefix_slots`` prompt slots are
    seen by every beam (their padding is masked by the cache's validity)."""
    b, k, n = ancestry.shape
    on_path_BxKxNxK = ancestry[..., None] == jnp.arange(k, dtype=ancestry.dtype)
    on_path_BxKxNxK &= (jnp.arange(n) <= i)[None, None, :, None]
    prefix = jnp.ones((b, k, prefix_slots), bool)
    return jnp.concatenate([prefix, on_path_BxKxNxK.reshape(b, k, n * k)], axis=-1)


def beam_search(
    step_fn: StepFn,
    logits: Array,
    state: Any,
    positions: Array,
    *,
    prefix_slots: int,
    beam_size: int,
    max_new_tokens: int,
    alpha: float = 0.6,
    eos_id: int | None = 1,
    pad_id: int = 0,
    no_repeat_ngram_size: int = 0,
    ends: Sequence[int] | None = None,
    grow: GrowFn | None = None,
) -> BeamResult:
    """Beam search from the first-token logits `[B, V]` and the decode state of ``B`` rows.

    Args:
      step_fn: ``(state, tokens [B, k], positions [B, k], mask [B, k, S]) → (logits [B, k, V],
        state)``: one cached step appending ``k`` tokens per row, each seeing the cache slots its
        ``mask`` allows (`jaxformer.decode.steps.step`).
      state: decode state whose cache holds the prompt in its first ``P`` slots and has
        ``P + beam_size · max_new_tokens`` (= S) slots (`steps.start` with ``tokens_per_step=k``).
      positions: `[B]` position of the first generated token.
      prefix_slots: ``P``, the cache slots before the first generated token's.
      alpha: length-penalty exponent (0 = plain log-probability).
      eos_id: id that finishes a hypothesis (None: all hypotheses run to ``max_new_tokens``).
      no_repeat_ngram_size: no expansion repeats an n-gram of its own beam's generated tokens
        (`jaxformer.decode.ngram`; 0 = off). Log-probs stay the model's.
      ends, grow: the cache's growth, as in `jaxformer.decode.search.decode_loop` (the state's
        cache then fits the steps before ``ends[0]``).
    """
    b, vocab = logits.shape
    k, n = beam_size, max_new_tokens
    logits = jnp.repeat(logits, k, axis=0)  # [B·k, V]
    positions = jnp.repeat(positions[:, None], k, axis=1)  # [B, k]
    # Only beam 0 is alive at first, so the k copies do not yield k identical hypotheses.
    alive_score = jnp.where(jnp.arange(k) == 0, 0.0, NEG_INF)[None].repeat(b, axis=0)
    lp_max = length_penalty(n, alpha)
    carry = dict(
        i=jnp.zeros((), jnp.int32), logits=logits, state=state, positions=positions,
        ancestry=jnp.zeros((b, k, n), jnp.int32),
        alive_tokens=jnp.full((b, k, n), pad_id, jnp.int32),
        alive_log_probs=jnp.zeros((b, k, n), jnp.float32), alive_score=alive_score,
        fin_tokens=jnp.full((b, k, n), pad_id, jnp.int32),
        fin_log_probs=jnp.zeros((b, k, n), jnp.float32),
        fin_lengths=jnp.zeros((b, k), jnp.int32), fin_score=jnp.full((b, k), NEG_INF))

    def cond(c):
        bound = c["alive_score"][:, 0] / jnp.maximum(length_penalty(c["i"] + 1, alpha), lp_max)
        settled = c["fin_score"][:, -1] >= bound  # -inf (fewer than k finished) never settles
        settled = jnp.logical_and(settled, jnp.isfinite(c["fin_score"][:, -1]))
        return jnp.logical_and(c["i"] < n, ~jnp.all(settled))

    def body_for(end):  # steps before ``end``: the cache has P + k·end slots
        return lambda c: body(c, end)

    def body(c, end):
        i = c["i"]
        logp = jax.nn.log_softmax(c["logits"], axis=-1)  # [B·k, V]
        allowed = block_repeated_ngrams(logp, c["alive_tokens"].reshape(b * k, n), i,
                                        no_repeat_ngram_size)
        cand = (c["alive_score"][:, :, None] + allowed.reshape(b, k, vocab)).reshape(b, k * vocab)
        logp = logp.reshape(b, k * vocab)
        top_score, top_idx = lax.top_k(cand, 2 * k)  # [B, 2k]
        parent, tok = top_idx // vocab, (top_idx % vocab).astype(jnp.int32)
        tok_lp = jnp.take_along_axis(logp, top_idx, axis=1)
        seqs = lax.dynamic_update_slice_in_dim(
            _take(c["alive_tokens"], parent), tok[:, :, None], i, axis=2)
        seq_lps = lax.dynamic_update_slice_in_dim(
            _take(c["alive_log_probs"], parent), tok_lp[:, :, None], i, axis=2)
        is_eos = jnp.zeros_like(tok, bool) if eos_id is None else tok == eos_id
        finishing = jnp.logical_or(is_eos, i == n - 1)
        # Finished pool: merge the k kept with the 2k new candidates, keep the best k.
        new_fin = jnp.where(finishing, top_score / length_penalty(i + 1, alpha), NEG_INF)
        all_score = jnp.concatenate([c["fin_score"], new_fin], axis=1)
        fin_score, fin_idx = lax.top_k(all_score, k)
        cat = lambda old, new: _take(jnp.concatenate([old, new], axis=1), fin_idx)
        fin_tokens = cat(c["fin_tokens"], seqs)
        fin_log_probs = cat(c["fin_log_probs"], seq_lps)
        fin_lengths = cat(c["fin_lengths"], jnp.full((b, 2 * k), i + 1, jnp.int32))
        # Alive beams: the best k candidates that did not end in EOS.
        alive_score, alive_idx = lax.top_k(jnp.where(is_eos, NEG_INF, top_score), k)
        alive_tokens, alive_log_probs = _take(seqs, alive_idx), _take(seq_lps, alive_idx)
        # each surviving beam inherits its parent's path and appends its token in its column
        ancestry = lax.dynamic_update_slice_in_dim(
            _take(c["ancestry"], _take(parent, alive_idx)),
            jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (b, k))[:, :, None], i, axis=2)
        mask = path_mask(ancestry[:, :, :end], i, prefix_slots)
        logits, state = step_fn(c["state"], alive_tokens[:, :, i], c["positions"], mask)
        return dict(i=i + 1, logits=logits.reshape(b * k, vocab), state=state,
                    positions=c["positions"] + 1, ancestry=ancestry, alive_tokens=alive_tokens,
                    alive_log_probs=alive_log_probs, alive_score=alive_score,
                    fin_tokens=fin_tokens, fin_log_probs=fin_log_probs, fin_lengths=fin_lengths,
                    fin_score=fin_score)

    out = segmented_loop(cond, body_for, carry, ends or (n,), grow)
    return BeamResult(out["fin_tokens"][:, 0], out["fin_log_probs"][:, 0], out["fin_lengths"][:, 0],
                      out["fin_score"][:, 0], out["fin_tokens"], out["fin_log_probs"],
                      out["fin_lengths"], out["fin_score"])
