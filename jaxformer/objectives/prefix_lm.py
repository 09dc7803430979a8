"""Prefix language modelling (Raffel et al. 2020, "Exploring the Limits of Transfer Learning with
a Unified Text-to-Text Transformer", §3.2.1 Figs. 3–4 and the prefix-LM objective of §3.2.3) on the
decoder family.

Each packed segment of ``n`` tokens is split into a prefix, its first ``p = floor(prefix_fraction ·
n)`` tokens, and the rest. The model reads the prefix bidirectionally and the rest causally (the
"causal with prefix" mask, `jaxformer.ops.masks.prefix_lm_mask`, applied by the decoder when its
``prefix`` input is given), and the loss is the next-token loss on the rest only: position ``t``
predicts token ``t+1`` when ``t+1`` lies after the prefix (position ``p−1``, the prefix's last token,
predicts the first token after it). A prefix token is never a target: the prefix's other tokens
see it. Raffel et al. split each span at a random point; here the split is the fixed fraction
``objective.prefix_fraction`` of every segment, so a row's loss needs no random draw.
``prefix_fraction=0`` is exactly the causal LM (`prepare_clm`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.config import ModelConfig
from jaxformer.objectives._common import require, segments_and_positions, shift_left_within_segments
from jaxformer.settings import setting
from jaxformer.vocab import SpecialTokens

Array = jnp.ndarray


def _below_one(v: float) -> str | None:
    return None if 0.0 <= v < 1.0 else "must lie in [0, 1) (1 would leave no token to predict)"


@dataclasses.dataclass(frozen=True)
class PrefixLMOptions:
    """The ``objective.*`` option of objective ``prefix_lm`` (Raffel et al. 2020 §3.2.3)."""

    prefix_fraction: float = setting(
        0.5, "prefix_lm: the first floor(prefix_fraction · n) tokens of each n-token segment are "
        "its prefix, read bidirectionally and never a target (0 = the causal LM)", check=_below_one)


def check_prefix_lm_model(model_cfg: ModelConfig) -> None:
    """Objective 'prefix_lm' needs a decoder with an LM head whose attention takes the prefix's
    additive mask (ValueError naming the field, before compiling)."""
    if model_cfg.family != "decoder" or model_cfg.head != "lm":
        raise ValueError(f"objective.name='prefix_lm' trains a decoder's LM head: model.family="
                         f"{model_cfg.family!r}, model.head={model_cfg.head!r} must be 'decoder', 'lm'")
    if model_cfg.permutation_lm:
        raise ValueError("objective.name='prefix_lm' reads the prefix through one stream: set "
                         "model.permutation_lm=False (XLNet's two streams are objective 'plm')")
    if model_cfg.attention_kernel not in ("xla", "chunked"):
        raise ValueError(f"objective.name='prefix_lm' adds the prefix's visibility to the attention "
                         f"logits as a bias, which model.attention_impl={model_cfg.attention_impl!r} "
                         f"(runs {model_cfg.attention_kernel!r}) does not take: use 'xla' or 'chunked'")


def segment_lengths(segment_ids: Array) -> Array:
    """The length of each token's segment, `[B, L]` int32 (0 on padding, segment id 0)."""
    batch, length = segment_ids.shape
    counts = jnp.zeros((batch, length + 1), jnp.int32).at[
        jnp.arange(batch)[:, None], segment_ids].add(1)
    return jnp.where(segment_ids != 0, jnp.take_along_axis(counts, segment_ids, axis=1), 0)


def prepare_prefix_lm(batch: Mapping[str, Array], rng: jax.Array, special: SpecialTokens,
                      options: PrefixLMOptions | None = None) -> dict:
    """Prefix-LM inputs, targets and weights.

    Batch: ``inputs`` `[B, L]` int32, optional ``inputs_segment_ids`` / ``inputs_positions`` (as
    `prepare_clm`; positions count from 0 in each segment, as packing writes them). ``rng`` unused.

    Returns ``model_inputs`` {tokens, positions, segment_ids, prefix `[B, L]` bool: the token lies in
    its segment's prefix} (keywords of the decoder's forward), ``targets`` `[B, L]` =
    ``inputs[t+1]`` within the segment (``pad_id`` elsewhere) and ``weights`` `[B, L]` float32, 1
    where that next token exists and lies after the prefix.
    """
    del rng
    require(batch, "prefix_lm", "inputs")
    fraction = (options or PrefixLMOptions()).prefix_fraction
    tokens, seg, pos = segments_and_positions(batch, "inputs", special.pad_id)
    targets, valid = shift_left_within_segments(tokens, seg, fill=special.pad_id)
    # floor(fraction · n) for every possible n, in float64 on the host (as documented; float32
    # on the device differs, e.g. 63 for 0.7 · 90 = 62.99999999999999)
    prefix_of_length = np.floor(fraction * np.arange(tokens.shape[1] + 1)).astype(np.int32)
    prefix_len = jnp.asarray(prefix_of_length)[segment_lengths(seg)]
    in_prefix = (seg != 0) & (pos < prefix_len)
    return {
        "model_inputs": {"tokens": tokens, "positions": pos, "segment_ids": seg, "prefix": in_prefix},
        "targets": targets,
        "weights": (valid & (pos + 1 >= prefix_len)).astype(jnp.float32),
    }
