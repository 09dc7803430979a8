"""Masked language modelling (BERT; Devlin et al. 2019, §3.1 "Task #1" and Appendix A.1).

Per row, ``round(mask_rate · n)`` of the ``n`` candidate positions (non-padding, not a special
token), at least one when ``n > 0``, are chosen uniformly without replacement, as BERT's
``create_pretraining_data.py`` does. Of the chosen positions 80% become ``[MASK]``, 10% a random
non-special token and 10% stay unchanged; the model predicts the original id at every chosen
position and nowhere else.

Whole-word masking (``whole_word_mask``; Google's BERT release of 2019-05-31, Cui et al. 2019):
the unit chosen is the word, not the piece — ``round(mask_rate · w)`` of a row's ``w`` words, each
with all its pieces (a word starts at a piece the tokenizer marks as word-initial, sentencepiece's
"▁", or after a special token / segment boundary); the 80/10/10 split stays per piece.

Span masking (``masking="span"``; SpanBERT, Joshi et al. 2020): contiguous spans of geometric
length, whole words where the tokenizer marks word-initial pieces, 80/10/10 decided per span
(`jaxformer.objectives.span_masking`).

The head reads only the chosen positions (BERT's ``max_predictions_per_seq``, Appendix A and
``run_pretraining.py``'s ``gather_indexes``): the trainer's MLM objective (`prepare_mlm_gathered`)
gathers each row's chosen positions into ``P`` static slots, ``model_inputs["predict_positions"]``
`[B, P]`, with ``targets`` and ``weights`` `[B, P]` (weight 0 on the slots a row leaves empty), so
the MLM logits are `[B, P, V]`, not `[B, L, V]`. ``P`` = ``max_predictions_per_seq``; its default
(−1) is ⌈mask_rate · L⌉ rounded up to a multiple of 4 — BERT's 20 at L = 128 and 80 at 512 — which
no row can exceed under token masking (a row chooses round(mask_rate · n) ≤ ⌈mask_rate · L⌉ of its
n ≤ L candidates), so no target is ever left out. Whole-word and span masking choose whole words
or spans, whose pieces ``mask_rate`` does not bound: with them the default reads every position
(no gather), and an explicit cap is refused rather than dropping targets.

Next-sentence prediction (§3.1 "Task #2") is emitted when the batch carries ``nsp_label`` `[B]`
with BERT's convention: 0 = sentence B follows A ("IsNext"), 1 = B is random ("NotNext"). It
needs one sentence pair per row (no packing); building such pairs is the pipeline's job and
optional there (``sentence_pairs="nsp"``, or ALBERT's sentence-order prediction ``"sop"``:
`jaxformer.data.sentence_pairs`). Pair rows carry ``inputs_token_types`` `[B, L]` (0 for A, 1 for B).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.objectives._common import require, segments_and_positions
from jaxformer.objectives.span_masking import MASKINGS, Spans, sample_spans
from jaxformer.settings import fraction, setting
from jaxformer.vocab import SpecialTokens

Array = jnp.ndarray


# The ``objective.*`` options of MLM with their defaults: BERT's 15% of positions, 80/10/10.
@dataclasses.dataclass(frozen=True)
class MLMOptions:
    """The ``objective.*`` options of objective ``mlm`` (BERT; SpanBERT's span masking)."""

    mask_rate: float = setting(0.15, "mlm: fraction of tokens chosen for prediction", check=fraction)
    mask_token_fraction: float = setting(
        0.8, "mlm: of the chosen, the fraction replaced by [MASK]", check=fraction)
    random_token_fraction: float = setting(
        0.1, "mlm: of the chosen, the fraction replaced by a random token (the rest are kept)",
        check=fraction)
    whole_word_mask: bool = setting(False, "mlm: choose whole words (all pieces of a word together)")
    masking: str = setting(
        "token", "mlm: 'token' (BERT) or 'span' (SpanBERT: geometric spans of whole words, 80/10/10 "
        "per span)")
    max_predictions_per_seq: int = setting(
        -1, "mlm: the MLM head reads at most this many chosen positions per row (BERT's "
        "max_predictions_per_seq; logits [B, P, V]): -1 = ceil(mask_rate·L) rounded up to a multiple "
        "of 4 (20 at L=128, 80 at 512; every position with whole-word or span masking), 0 = every "
        "position", check=lambda v: None if v >= -1 else "must be -1 (auto), 0 (all) or a count")
    span_geometric_p: float = setting(0.2, "mlm, masking='span': p of the geometric span length")
    max_span_length: int = setting(
        10, "mlm, masking='span': longest span, in words (tokens without word boundaries)")
    sentence_pairs: str = setting(
        "none", "mlm: rows [CLS] A [SEP] B [SEP] with a pair label: 'none', 'nsp' (B follows A or is "
        "from another document) or 'sop' (A and B consecutive, swapped or not); needs model.nsp_head")


SENTENCE_PAIRS = ("none", "nsp", "sop")


def uses_word_initial(options: MLMOptions) -> bool:
    """Whether MLM with ``options`` reads the tokenizer's ``word_initial`` table (whole-word
    masking, or span lengths counted in words)."""
    return options.whole_word_mask or options.masking == "span"


def mlm_word_initial(options: MLMOptions, tokenizer: Any) -> dict[str, Any]:
    """``{"word_initial": tokenizer.word_initial()}`` when ``options`` need the table
    (`uses_word_initial`), else {}: the extra `prepare_mlm_gathered` argument `Objective.bind`
    resolves with the run's tokenizer. ValueError when the table is needed and ``tokenizer`` is
    None."""
    if not uses_word_initial(options):
        return {}
    if tokenizer is None:
        raise ValueError("objective.whole_word_mask / masking='span' need the tokenizer's "
                         "word_initial table: bind_objective(..., tokenizer=tokenizer)")
    return {"word_initial": tokenizer.word_initial()}


def mlm_data_task(options: MLMOptions) -> str:
    """The data task of MLM with ``options``: "sentence_pairs" when ``sentence_pairs`` is "nsp"
    or "sop" (`jaxformer.data.sentence_pairs`), else "lm"."""
    pairs = options.sentence_pairs
    if pairs not in SENTENCE_PAIRS:
        raise ValueError(f"objective.sentence_pairs={pairs!r} must be one of {SENTENCE_PAIRS}")
    return "lm" if pairs == "none" else "sentence_pairs"


def max_predictions(options: MLMOptions, length: int) -> int:
    """The ``P`` slots per row of `prepare_mlm_gathered` for rows of ``length`` (0: no gather, the
    head reads every position); ValueError for a cap that could leave a chosen target out."""
    p, rate = options.max_predictions_per_seq, float(options.mask_rate)
    bounded = not uses_word_initial(options)  # token masking: at most ⌈rate · L⌉ per row
    need = max(1, math.ceil(rate * length))
    if p == -1:
        return min(length, -(-need // 4) * 4) if bounded else 0
    if p and not bounded:
        raise ValueError(f"objective.max_predictions_per_seq={p} with whole-word or span masking: "
                         "their chosen pieces per row are not bounded by mask_rate, so a row could "
                         "hold more targets than slots; set it to -1 or 0 (every position)")
    if p and p < min(need, length):
        raise ValueError(f"objective.max_predictions_per_seq={p} is less than ceil(mask_rate·L) = "
                         f"{need} (mask_rate={rate}, L={length}): rows could hold more targets than "
                         f"slots; set it to at least {need}, or -1")
    return min(p, length)


def gather_predictions(prepared: dict, slots: int) -> dict:
    """``prepared`` (`prepare_mlm`'s output) with the head reading only each row's chosen positions:
    ``model_inputs["predict_positions"]`` `[B, slots]` (the chosen positions in order, then
    unchosen ones of weight 0), ``targets`` and ``weights`` `[B, slots]` gathered there. Every
    weighted position must fit (`max_predictions` guarantees it); ``slots`` = 0 returns ``prepared``."""
    if not slots:
        return prepared
    chosen = prepared["weights"] != 0
    order = jnp.argsort(jnp.where(chosen, 0, 1), axis=1, stable=True)[:, :slots].astype(jnp.int32)
    return {**prepared, "model_inputs": {**prepared["model_inputs"], "predict_positions": order},
            "targets": jnp.take_along_axis(prepared["targets"], order, axis=1),
            "weights": jnp.take_along_axis(prepared["weights"], order, axis=1)}


def prepare_mlm_gathered(batch: Mapping[str, Array], rng: jax.Array, special: SpecialTokens,
                         options: MLMOptions | None = None, word_initial: np.ndarray | None = None
                         ) -> dict:
    """`prepare_mlm`, then `gather_predictions` into `max_predictions` slots: the MLM objective
    the trainer runs (module docstring). Same masks, loss and gradients as `prepare_mlm`'s
    all-position output; the MLM logits are `[B, P, V]`."""
    options = options or MLMOptions()
    out = prepare_mlm(batch, rng, special, options, word_initial)
    return gather_predictions(out, max_predictions(options, out["targets"].shape[1]))


def _non_special_ids(special: SpecialTokens) -> np.ndarray:
    ids = np.setdiff1d(np.arange(special.vocab_size), np.asarray(special.all_special))
    if ids.size == 0:
        raise ValueError(f"vocab_size={special.vocab_size} leaves no non-special token to sample "
                         f"for MLM random replacement; use a vocabulary larger than "
                         f"{special.num_special}")
    return ids.astype(np.int32)


def mask_budget(candidates: Array, rate: float) -> Array:
    """``round(rate · n)`` (≥ 1 if n > 0) of each row's ``n`` True ``candidates`` `[B, L]`: int32
    `[B]`."""
    n = jnp.sum(candidates, axis=-1)
    return jnp.where(n > 0, jnp.maximum(jnp.round(rate * n), 1), 0).astype(jnp.int32)


def choose_positions(rng: jax.Array, candidates: Array, rate: float) -> Array:
    """Pick ``round(rate · n)`` (≥ 1 if n > 0) of each row's ``n`` True ``candidates`` `[B, L]`,
    uniformly without replacement. Returns a bool `[B, L]` subset of ``candidates``."""
    k = mask_budget(candidates, rate)
    score = jnp.where(candidates, jax.random.uniform(rng, candidates.shape), 2.0)
    ranks = jnp.argsort(jnp.argsort(score, axis=-1), axis=-1)
    return candidates & (ranks < k[:, None])


def whole_words(candidates: Array, word_initial: Array, segment_ids: Array) -> tuple[Array, Array]:
    """Word structure of `[B, L]` rows: ``(starts, head)`` where ``starts`` marks the candidate
    pieces that begin a word (``word_initial``, or the previous piece is not a candidate of the
    same segment) and ``head[b, t]`` is the index of the start of the word holding piece ``t``."""
    prev_cand = jnp.pad(candidates[:, :-1], ((0, 0), (1, 0)))
    prev_seg = jnp.pad(segment_ids[:, :-1], ((0, 0), (1, 0)))
    starts = candidates & (word_initial | ~prev_cand | (prev_seg != segment_ids))
    idx = jnp.broadcast_to(jnp.arange(candidates.shape[1]), candidates.shape)
    head = jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)
    return starts, head


def _units(tokens: Array, candidates: Array, seg: Array, word_initial: np.ndarray | None
           ) -> tuple[Array, Array]:
    """``(starts, head)`` `[B, L]` of the masking units: whole words (`whole_words`) with a
    ``word_initial`` table, else single tokens (every candidate starts its own unit)."""
    if word_initial is None:
        idx = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
        return candidates, idx
    initial = jnp.asarray(word_initial, bool)[jnp.clip(tokens, 0, len(word_initial) - 1)]
    return whole_words(candidates, initial, seg)


def _candidates(batch: Mapping[str, Array], special: SpecialTokens) -> tuple[Array, ...]:
    """``(tokens, segment_ids, positions, candidates)`` `[B, L]`: candidates are the non-padding,
    non-special tokens."""
    tokens, seg, pos = segments_and_positions(batch, "inputs", special.pad_id)
    is_special = jnp.isin(tokens, jnp.asarray(special.all_special, jnp.int32))
    return tokens, seg, pos, (seg != 0) & ~is_special


def mlm_spans(batch: Mapping[str, Array], rng: jax.Array, special: SpecialTokens,
              options: MLMOptions | None = None, word_initial: np.ndarray | None = None) -> Spans:
    """The SpanBERT spans `prepare_mlm` masks with ``masking="span"`` for the same ``rng``
    (`jaxformer.objectives.span_masking.Spans`, each `[B, L]`). Lengths count whole words when
    ``word_initial`` marks word-initial pieces, else tokens."""
    options = options or MLMOptions()
    tokens, seg, _, candidates = _candidates(batch, special)
    has_words = word_initial is not None and bool(np.any(word_initial))
    starts, head = _units(tokens, candidates, seg, word_initial if has_words else None)
    return sample_spans(jax.random.split(rng, 3)[0], candidates, starts, head, seg,
                        mask_budget(candidates, float(options.mask_rate)),
                        float(options.span_geometric_p), options.max_span_length)


def prepare_mlm(batch: Mapping[str, Array], rng: jax.Array, special: SpecialTokens,
                options: MLMOptions | None = None, word_initial: np.ndarray | None = None) -> dict:
    """BERT masking of ``inputs`` `[B, L]`.

    Options (``options``, `MLMOptions`; None: the defaults): ``mask_rate`` (0.15),
    ``mask_token_fraction`` (0.8) and ``random_token_fraction`` (0.1) of the chosen positions; the
    rest stay unchanged.
    ``whole_word_mask`` (False) chooses whole words; it needs ``word_initial``, a bool `[vocab]`
    table of the pieces that begin a word (`Tokenizer.word_initial`; the Trainer passes it).
    ``masking`` ("token"; "span": SpanBERT, `mlm_spans`, with ``span_geometric_p`` 0.2 and
    ``max_span_length`` 10) and the [MASK]/random/keep draw made once per span.

    Returns ``model_inputs`` {tokens (corrupted), positions, segment_ids[, token_types]} for
    `EncoderOnly`, ``targets`` `[B, L]` (the original ids) and ``weights`` `[B, L]` float32 (1 on
    chosen positions); with ``nsp_label`` also ``nsp_targets`` `[B]` and ``nsp_weights`` `[B]`
    (``nsp_weight`` of the batch, else 1).
    """
    require(batch, "mlm", "inputs")
    options = options or MLMOptions()
    rate, masking = float(options.mask_rate), options.masking
    p_mask, p_random = float(options.mask_token_fraction), float(options.random_token_fraction)
    if not 0.0 < rate < 1.0:
        raise ValueError(f"objective.mask_rate={rate} must be in (0, 1) (BERT uses 0.15)")
    if p_mask < 0 or p_random < 0 or p_mask + p_random > 1.0:
        raise ValueError(f"objective.mask_token_fraction={p_mask} and random_token_fraction="
                         f"{p_random} must be ≥ 0 with a sum ≤ 1 (BERT uses 0.8 and 0.1)")
    if masking not in MASKINGS:
        raise ValueError(f"objective.masking={masking!r} must be one of {MASKINGS}")
    tokens, seg, pos, candidates = _candidates(batch, special)
    k_choose, k_how, k_tok = jax.random.split(rng, 3)
    whole_word = options.whole_word_mask
    if whole_word and word_initial is None:
        raise ValueError("objective.whole_word_mask needs the tokenizer's word_initial table "
                         "(bind_objective(..., tokenizer=tokenizer))")
    how = jax.random.uniform(k_how, tokens.shape)
    if masking == "span":
        spans = mlm_spans(batch, rng, special, options, word_initial)
        chosen, how = spans.chosen, spans.how
    elif whole_word:
        starts, head = _units(tokens, candidates, seg, word_initial)
        chosen_starts = choose_positions(k_choose, starts, rate)
        chosen = candidates & jnp.take_along_axis(chosen_starts, head, axis=1)
    else:
        chosen = choose_positions(k_choose, candidates, rate)

    pool = jnp.asarray(_non_special_ids(special))
    random_ids = pool[jax.random.randint(k_tok, tokens.shape, 0, pool.shape[0])]
    corrupted = jnp.where(how < p_mask, special.mask_id,
                          jnp.where(how < p_mask + p_random, random_ids, tokens))
    model_inputs = {"tokens": jnp.where(chosen, corrupted, tokens), "positions": pos,
                    "segment_ids": seg}
    if "inputs_token_types" in batch:
        model_inputs["token_types"] = jnp.asarray(batch["inputs_token_types"], jnp.int32)
    out = {"model_inputs": model_inputs, "targets": tokens, "weights": chosen.astype(jnp.float32)}
    if "nsp_label" in batch:
        nsp = jnp.asarray(batch["nsp_label"], jnp.int32)
        out["nsp_targets"] = nsp
        # the pipeline's ``nsp_weight`` [B] is 0 on the rows padding a finite pass's last batch
        out["nsp_weights"] = jnp.asarray(batch.get("nsp_weight", jnp.ones(nsp.shape)), jnp.float32)
    return out
