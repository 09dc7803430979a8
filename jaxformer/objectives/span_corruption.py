"""T5 span corruption (Raffel et al. 2020, §3.1.4, §3.3.4): host-side NumPy, one example at a time.

The data pipeline calls `span_corruption` per example before packing; the device then trains with
the ``seq2seq`` objective. Given tokens ``x`` (without EOS), a noise mask marks
``round(len · noise_density)`` tokens split into ``round(noise / mean_span_length)`` spans
(`random_spans_noise_mask`, the T5 algorithm). Every noise span is replaced in the inputs by one
sentinel, in order ``special.sentinel_ids[0], [1], …``; the targets are the sentinels each followed
by the span it replaced. Both end with EOS::

    x       = a b c d e f g h
    mask    = . . X X . . . X
    inputs  = a b <s0> e f g <s1> EOS
    targets = <s0> c d <s1> h EOS

`reconstruct_span_corruption` inverts this exactly.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxformer.settings import fraction, positive, setting
from jaxformer.vocab import SpecialTokens


# The ``objective.*`` options of span corruption with their defaults (T5, §3.1.4).
# ``random_roll`` is on by default (T5 itself has no roll): see `random_spans_noise_mask`.
@dataclasses.dataclass(frozen=True)
class SpanCorruptionOptions:
    """The ``objective.*`` options of objective ``span_corruption`` (T5, Raffel et al. 2020)."""

    noise_density: float = setting(0.15, "span_corruption: fraction of tokens corrupted",
                                   check=fraction)
    mean_span_length: float = setting(
        3.0, "span_corruption: mean length of a corrupted span", check=positive)
    random_roll: bool = setting(
        True, "span_corruption: roll each noise mask by a random offset (seqio's random_roll); "
        "without it a short example's only span always ends it (T5's mask always ends with noise)")



def _random_segmentation(num_items: int, num_segments: int, rng: np.random.Generator) -> np.ndarray:
    """Split ``num_items`` into ``num_segments`` non-empty parts uniformly at random (T5's
    ``_random_segmentation``): shuffle ``num_segments − 1`` boundaries among the
    ``num_items − 1`` gaps."""
    first_in_segment = np.zeros(num_items, np.int64)
    first_in_segment[1:] = rng.permutation(np.arange(num_items - 1) < num_segments - 1)
    segment_id = np.cumsum(first_in_segment)
    return np.bincount(segment_id, minlength=num_segments)


def random_spans_noise_mask(length: int, rng: np.random.Generator, noise_density: float = 0.15,
                            mean_span_length: float = 3.0, random_roll: bool = False
                            ) -> np.ndarray:
    """Bool `[length]` noise mask, exactly T5's ``random_spans_noise_mask``.

    num_noise = round(max(length, 2) · density) clipped to [1, max(length, 2) − 1];
    num_spans = max(round(num_noise / mean_span_length), 1); noise and non-noise tokens are each
    segmented at random into num_spans non-empty spans, interleaved starting with non-noise.
    (Lengths below 2 are computed at length 2 and truncated, as in T5: a 1-token input has no
    noise.)

    T5's mask always *ends* with a noise span, and an example of under ~33 tokens gets only one
    span: corrupted one short example at a time (a verse, a sentence), the task degenerates to
    "predict the last few tokens" — the decoder learns a language model of sentence endings that
    ignores the encoder. T5 corrupts 512-token concatenations, where this hardly matters.
    ``random_roll=True`` rolls the mask by an offset uniform in [0, length) (seqio's
    ``random_roll``), so every position is equally likely to be noise; a span rolled across the
    end wraps to the start (one more span).
    """
    if not 0.0 < noise_density < 1.0:
        raise ValueError(f"noise_density={noise_density} must be in (0, 1) (T5 uses 0.15)")
    if mean_span_length < 1.0:
        raise ValueError(f"mean_span_length={mean_span_length} must be ≥ 1 (T5 uses 3.0)")
    orig_length, length = length, max(length, 2)
    num_noise = min(max(int(np.round(length * noise_density)), 1), length - 1)
    num_spans = max(int(np.round(num_noise / mean_span_length)), 1)
    noise_lengths = _random_segmentation(num_noise, num_spans, rng)
    nonnoise_lengths = _random_segmentation(length - num_noise, num_spans, rng)
    interleaved = np.stack([nonnoise_lengths, noise_lengths], axis=1).reshape(-1)
    span_starts = np.zeros(length, np.int64)
    span_starts[np.cumsum(interleaved)[:-1]] = 1
    is_noise = np.cumsum(span_starts) % 2 == 1
    if random_roll:
        is_noise = np.roll(is_noise, int(rng.integers(length)))
    return is_noise[:orig_length]


def _replace_spans(tokens: np.ndarray, mask: np.ndarray, sentinels: np.ndarray) -> np.ndarray:
    """Each run of True in ``mask`` → one sentinel (in order); other tokens kept (T5's
    ``noise_span_to_unique_sentinel``)."""
    prev = np.concatenate([[False], mask[:-1]])
    first = mask & ~prev
    if first.sum() > len(sentinels):
        raise ValueError(f"{int(first.sum())} spans need as many sentinels but "
                         f"special.sentinel_ids has {len(sentinels)}; lower noise_density, raise "
                         "mean_span_length or shorten the sequences")
    out = np.where(first, sentinels[np.maximum(np.cumsum(first) - 1, 0)], tokens)
    return out[~(mask & prev)]


def _sentinel_then_span(tokens: np.ndarray, mask: np.ndarray, sentinels: np.ndarray
                        ) -> np.ndarray:
    """The targets: each run of True in ``mask`` preceded by its sentinel, numbered as
    `_replace_spans` numbers the inputs'. Equal to T5's ``nonnoise_span_to_unique_sentinel`` for
    T5's masks (non-noise first, noise last); unlike it, also aligned with the inputs when a
    rolled mask starts with noise or ends without."""
    first = mask & ~np.concatenate([[False], mask[:-1]])
    sentinel = np.where(first, sentinels[np.maximum(np.cumsum(first) - 1, 0)], -1)
    pieces = np.stack([sentinel, np.where(mask, tokens, -1)], axis=1).reshape(-1)
    return pieces[pieces >= 0]


def span_corruption(tokens: np.ndarray, rng: np.random.Generator, special: SpecialTokens,
                    noise_density: float = 0.15, mean_span_length: float = 3.0,
                    random_roll: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """T5 span corruption of one example.

    Args:
      tokens: `[n]` int token ids without EOS; must not contain sentinel ids.
      rng: seeded `np.random.Generator` (the pipeline derives one per example).
      special: the vocabulary's special ids (sentinels, EOS).
      noise_density, mean_span_length: T5's 0.15 and 3.0.
      random_roll: roll the noise mask by a random offset (`random_spans_noise_mask`).

    Returns:
      ``(inputs, targets)`` int32 arrays, each ending with EOS.
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"span_corruption takes one example [n], got shape {tokens.shape}")
    sentinels = np.asarray(special.sentinel_ids, np.int32)
    if np.isin(tokens, sentinels).any():
        raise ValueError("span_corruption input already contains sentinel ids "
                         f"{sorted(set(tokens[np.isin(tokens, sentinels)].tolist()))}; sentinels "
                         "must be reserved for the objective")
    eos = np.asarray([special.eos_id], np.int32)
    if tokens.size == 0:
        return eos.copy(), eos.copy()
    mask = random_spans_noise_mask(tokens.size, rng, noise_density, mean_span_length, random_roll)
    inputs = _replace_spans(tokens, mask, sentinels)
    targets = _sentinel_then_span(tokens, mask, sentinels)
    return (np.concatenate([inputs, eos]).astype(np.int32),
            np.concatenate([targets, eos]).astype(np.int32))


def reconstruct_span_corruption(inputs: np.ndarray, targets: np.ndarray,
                                special: SpecialTokens) -> np.ndarray:
    """The original tokens from `span_corruption`'s ``(inputs, targets)`` (trailing EOS optional):
    every sentinel in ``inputs`` is replaced by the tokens that follow the same sentinel in
    ``targets``. Also usable on model predictions in place of ``targets``."""
    sentinels = set(special.sentinel_ids)

    def strip(a) -> list[int]:
        a = [int(t) for t in np.asarray(a).reshape(-1)]
        return a[:-1] if a and a[-1] == special.eos_id else a

    spans: dict[int, list[int]] = {}
    current = None
    for t in strip(targets):
        if t in sentinels:
            current = spans.setdefault(t, [])
        elif current is not None:
            current.append(t)
    out: list[int] = []
    for t in strip(inputs):
        if t in sentinels:
            out.extend(spans.get(t, []))
        else:
            out.append(t)
    return np.asarray(out, np.int32)
