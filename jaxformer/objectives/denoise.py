"""BART-style denoising (Lewis et al. 2020, §2.2), host-side NumPy, one example at a time.

Three of BART's corruptions, applied in this order to one example ``x`` (without EOS):

* **text infilling**: ``round(len · infill_rate)`` tokens are covered by spans whose lengths are
  drawn from Poisson(λ = ``poisson_lambda``) (the last one truncated so the total is exact); each
  span is replaced by a single ``[MASK]``; a 0-length span inserts a ``[MASK]``. Spans do not
  overlap and their places are uniformly random.
* **token deletion**: each remaining original token is dropped with probability ``delete_rate``.
* **token masking**: each remaining original token becomes ``[MASK]`` with probability
  ``token_mask_rate`` (its own name: MLM's ``mask_rate``, 0.15 by default, must not leak in).

The target is the original sequence. Inputs and targets end with EOS, as for `span_corruption`.
The defaults are BART's final choice of noise for these three (30% text infilling, λ = 3);
sentence permutation and document rotation are not implemented.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxformer.settings import fraction, positive, setting
from jaxformer.vocab import SpecialTokens


# The ``objective.*`` options of BART denoising with their defaults (BART's final choice: 30% text
# infilling, λ = 3; no token deletion or masking).
@dataclasses.dataclass(frozen=True)
class DenoiseOptions:
    """The ``objective.*`` options of objective ``denoise`` (BART's noising, Lewis et al. 2020)."""

    infill_rate: float = setting(
        0.3, "denoise: fraction of tokens in spans replaced by one mask (text infilling)",
        check=fraction)
    poisson_lambda: float = setting(
        3.0, "denoise: mean span length λ of the Poisson span lengths", check=positive)
    delete_rate: float = setting(0.0, "denoise: fraction of tokens deleted", check=fraction)
    token_mask_rate: float = setting(
        0.0, "denoise: fraction of tokens masked one by one", check=fraction)



def poisson_span_lengths(num_tokens: int, rng: np.random.Generator, poisson_lambda: float = 3.0
                         ) -> np.ndarray:
    """Poisson(λ) span lengths `[k]` drawn until they cover ``num_tokens``; the last one is
    shortened so they sum to exactly ``num_tokens`` (empty when ``num_tokens`` is 0)."""
    lengths: list[int] = []
    total = 0
    while total < num_tokens:
        n = int(rng.poisson(poisson_lambda))
        lengths.append(min(n, num_tokens - total))
        total += lengths[-1]
    return np.asarray(lengths, np.int64)


def denoise(tokens: np.ndarray, rng: np.random.Generator, special: SpecialTokens, *,
            infill_rate: float = 0.3, poisson_lambda: float = 3.0, delete_rate: float = 0.0,
            token_mask_rate: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Corrupt one example `[n]` (no EOS) → ``(inputs, targets)`` int32, both ending with EOS;
    ``targets`` is the original. See the module docstring for the three corruptions."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"denoise takes one example [n], got shape {tokens.shape}")
    for name, rate in (("infill_rate", infill_rate), ("delete_rate", delete_rate),
                       ("token_mask_rate", token_mask_rate)):
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"{name}={rate} must be in [0, 1)")
    if poisson_lambda <= 0:
        raise ValueError(f"poisson_lambda={poisson_lambda} must be > 0 (BART uses 3)")
    n = tokens.size
    eos = np.asarray([special.eos_id], np.int32)

    # Text infilling: place the spans among the kept tokens (stars and bars), -1 marks [MASK].
    lengths = poisson_span_lengths(int(np.round(n * infill_rate)), rng, poisson_lambda)
    k, covered = lengths.size, int(lengths.sum())
    is_span = np.zeros(n - covered + k, bool)
    is_span[rng.choice(is_span.size, size=k, replace=False)] = True
    lengths = rng.permutation(lengths)
    source = []  # index into tokens, or -1 for [MASK]
    i = j = 0
    for span in is_span:
        if span:
            source.append(-1)
            i += int(lengths[j])
            j += 1
        else:
            source.append(i)
            i += 1
    source = np.asarray(source, np.int64)

    original = source >= 0
    keep = ~original | (rng.random(source.size) >= delete_rate)
    source = source[keep]
    original = source >= 0
    masked = original & (rng.random(source.size) < token_mask_rate)
    inputs = np.where(original & ~masked, tokens[np.maximum(source, 0)],
                      special.mask_id)
    return (np.concatenate([inputs, eos]).astype(np.int32),
            np.concatenate([tokens, eos]).astype(np.int32))
