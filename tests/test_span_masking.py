"""SpanBERT span masking (`jaxformer.objectives.span_masking`, ``objective.masking="span"``):
span lengths against the clipped geometric pmf (Joshi et al. 2020 §3.1), the masking budget, the
80/10/10 decision per span, and spans that never touch specials, pads or another segment."""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import pytest

from jaxformer.data.tokenizer import Tokenizer, train_sentencepiece
from jaxformer.objectives.mlm import MLMOptions, mlm_spans, prepare_mlm
from jaxformer.objectives.span_masking import clipped_geometric_pmf
from jaxformer.vocab import SpecialTokens

CHI2_9DOF_999 = 27.877  # the 0.999 quantile of chi-square with 9 degrees of freedom (10 lengths)
SPAN = MLMOptions(masking="span", mask_rate=0.15)


def test_the_pmf_is_spanbert_s_geometric_clipped_at_10():
    pmf = clipped_geometric_pmf(0.2, 10)
    brute = np.array([0.2 * 0.8 ** (k - 1) for k in range(1, 11)])
    np.testing.assert_allclose(pmf, brute / brute.sum(), rtol=1e-12)
    assert abs(float(np.arange(1, 11) @ pmf) - 3.8) < 0.01  # SpanBERT §3.1: "mean ≈ 3.8"


def _packed_rows(rows: int, length: int, seed: int = 0) -> tuple[dict, SpecialTokens]:
    """Packed ``[CLS] x [SEP]`` segments of random non-special tokens, then padding."""
    special = SpecialTokens(vocab_size=1000)
    rng = np.random.default_rng(seed)
    tokens, seg = np.zeros((rows, length), np.int32), np.zeros((rows, length), np.int32)
    for b in range(rows):
        t, s = 0, 1
        while True:
            n = int(rng.integers(20, 120))
            if t + n + 2 > length - 8:
                break
            tokens[b, t:t + n + 2] = [special.cls_id, *rng.integers(200, 1000, n), special.sep_id]
            seg[b, t:t + n + 2] = s
            t, s = t + n + 2, s + 1
    return {"inputs": tokens, "inputs_segment_ids": seg}, special


def _spans_of(span_id_row: np.ndarray) -> dict[int, np.ndarray]:
    return {int(k): np.flatnonzero(span_id_row == k) for k in np.unique(span_id_row[span_id_row >= 0])}


def _chi_square(lengths: np.ndarray, pmf: np.ndarray) -> float:
    observed = np.bincount(lengths, minlength=len(pmf) + 1)[1:]
    expected = pmf * len(lengths)
    return float(((observed - expected) ** 2 / expected).sum())


@functools.cache
def _token_spans(keys: int = 16):
    batch, special = _packed_rows(32, 256)
    f = jax.jit(lambda k: mlm_spans(batch, k, special, SPAN))
    return batch, special, [jax.device_get(f(jax.random.key(i))) for i in range(keys)]


def test_token_span_lengths_follow_the_clipped_geometric_and_respect_segments():
    batch, special, draws = _token_spans()
    tokens, seg = batch["inputs"], batch["inputs_segment_ids"]
    candidates = (seg != 0) & ~np.isin(tokens, special.all_special)
    pmf = clipped_geometric_pmf(0.2, 10)
    realised, drawn, masked, maskable = [], [], 0, 0
    for spans in draws:
        for b in range(tokens.shape[0]):
            n = int(candidates[b].sum())
            budget = max(round(0.15 * n), 1)
            chosen = spans.chosen[b]
            assert chosen.sum() == budget  # token units: the budget exactly
            assert not (chosen & ~candidates[b]).any()  # never a special token or a pad
            by_id = _spans_of(spans.span_id[b])
            np.testing.assert_array_equal(np.sort(np.concatenate(list(by_id.values()))),
                                          np.flatnonzero(chosen))
            last = max(by_id)
            for k, where in by_id.items():
                assert np.all(np.diff(where) == 1), "a span is not contiguous"
                assert len(set(seg[b, where])) == 1, "a span crosses a packed segment"
                d = int(spans.drawn[b, where[0]])
                assert (spans.drawn[b, where] == d).all()
                # only the row's last span may be cut short, by the budget
                assert len(where) == d if k != last else 1 <= len(where) <= d
                realised.append(len(where))
                drawn.append(d)
            masked, maskable = masked + chosen.sum(), maskable + n
    drawn, realised = np.array(drawn), np.array(realised)
    assert _chi_square(drawn, pmf) < CHI2_9DOF_999
    freq = np.bincount(realised, minlength=11)[1:] / len(realised)
    sigma = np.sqrt(pmf * (1 - pmf) / len(realised))
    # realised = drawn but for one budget-cut span per row (~1 in 6 here): within 0.015 of the pmf
    assert np.all(np.abs(freq - pmf) < 4 * sigma + 0.015), (freq, pmf)
    mean, var = float(np.arange(1, 11) @ pmf), float(np.arange(1, 11) ** 2 @ pmf) - 3.797 ** 2
    assert abs(drawn.mean() - mean) < 4 * np.sqrt(var / len(drawn))
    rate = masked / maskable
    assert abs(rate - 0.15) < 4 * np.sqrt(0.15 * 0.85 / maskable) + 0.002


def test_80_10_10_is_decided_per_span():
    batch, special, _ = _token_spans(keys=1)
    tokens = batch["inputs"]
    f = jax.jit(lambda k: (mlm_spans(batch, k, special, SPAN), prepare_mlm(batch, k, special, SPAN)))
    kinds = {"mask": 0, "random": 0, "keep": 0}
    for i in range(16):
        spans, out = jax.device_get(f(jax.random.key(100 + i)))
        np.testing.assert_array_equal(out["weights"].astype(bool), spans.chosen)
        np.testing.assert_array_equal(out["targets"], tokens)
        seen = out["model_inputs"]["tokens"]
        np.testing.assert_array_equal(seen[~spans.chosen], tokens[~spans.chosen])
        for b in range(tokens.shape[0]):
            for where in _spans_of(spans.span_id[b]).values():
                is_mask = seen[b, where] == special.mask_id
                same = seen[b, where] == tokens[b, where]
                if is_mask.all():
                    kinds["mask"] += 1
                elif same.all():
                    kinds["keep"] += 1
                else:  # random ids for every token of the span (one may equal the original)
                    assert not is_mask.any(), "a span mixes [MASK] with other treatments"
                    assert same.mean() < 0.5
                    kinds["random"] += 1
    n = sum(kinds.values())
    for kind, p in (("mask", 0.8), ("random", 0.1), ("keep", 0.1)):
        assert abs(kinds[kind] / n - p) < 4 * np.sqrt(p * (1 - p) / n), kinds


@functools.cache
def _word_rows(rows: int = 16, length: int = 512):
    """Rows ``[CLS] text [SEP]`` from a real sentencepiece model, with every word's piece span."""
    rng = np.random.default_rng(1)
    syllables = "the un watch able ex tra or di nar ly per form ance heart felt dull a is".split()
    vocab = ["".join(rng.choice(syllables, int(rng.integers(1, 4)))) for _ in range(300)]
    texts = [" ".join(rng.choice(vocab, int(rng.integers(200, 280)))) for _ in range(rows)]
    tok = Tokenizer(train_sentencepiece(texts * 4, vocab_size=400, num_sentinels=0))
    tokens = np.zeros((rows, length), np.int32)
    words = []
    for b, text in enumerate(texts):
        pieces = [tok.encode(w) for w in text.split()]
        ids = [tok.special.cls_id, *sum(pieces, []), tok.special.sep_id][:length - 1]
        tokens[b, :len(ids)] = ids
        starts = np.cumsum([1] + [len(p) for p in pieces])
        words.append([(s, e) for s, e in zip(starts[:-1], starts[1:]) if e <= len(ids) - 1])
    return tok, {"inputs": tokens}, words


def test_word_span_lengths_count_whole_words():
    tok, batch, words = _word_rows()
    assert any(e - s > 1 for row in words for s, e in row), "no multi-piece word to test"
    f = jax.jit(lambda k: mlm_spans(batch, k, tok.special, SPAN, tok.word_initial()))
    pmf = clipped_geometric_pmf(0.2, 10)
    drawn, realised_words, realised_tokens = [], [], []
    for i in range(16):
        spans = jax.device_get(f(jax.random.key(i)))
        for b, row in enumerate(words):
            word_of = np.full(batch["inputs"].shape[1], -1)
            for w, (s, e) in enumerate(row):
                word_of[s:e] = w
            n = sum(e - s for s, e in row)
            assert spans.chosen[b].sum() >= max(round(0.15 * n), 1)
            by_id = _spans_of(spans.span_id[b])
            last = max(by_id)
            for k, where in by_id.items():
                span_words = np.unique(word_of[where])
                assert (span_words >= 0).all() and np.all(np.diff(span_words) == 1)
                for w in span_words:  # whole words only
                    s, e = row[w]
                    assert set(range(s, e)) <= set(where.tolist()), "a word was split"
                d = int(spans.drawn[b, where[0]])
                assert len(span_words) == d if k != last else len(span_words) <= d
                drawn.append(d)
                realised_words.append(len(span_words))
                realised_tokens.append(len(where))
    assert _chi_square(np.array(drawn), pmf) < CHI2_9DOF_999
    freq = np.bincount(realised_words, minlength=11)[1:] / len(realised_words)
    assert np.all(np.abs(freq - pmf) < 4 * np.sqrt(pmf * (1 - pmf) / len(realised_words)) + 0.015)
    # pieces per word > 1 makes spans longer in tokens than in words
    assert np.mean(realised_tokens) > np.mean(realised_words) + 0.5


def test_invalid_span_options_are_refused():
    batch, special = _packed_rows(2, 64)
    with pytest.raises(ValueError, match="objective.masking='spans'"):
        prepare_mlm(batch, jax.random.key(0), special, MLMOptions(masking="spans"))
    with pytest.raises(ValueError, match="objective.span_geometric_p=0.0"):
        prepare_mlm(batch, jax.random.key(0), special, dataclasses.replace(SPAN, span_geometric_p=0.0))
    with pytest.raises(ValueError, match="objective.max_span_length=0"):
        prepare_mlm(batch, jax.random.key(0), special, dataclasses.replace(SPAN, max_span_length=0))
