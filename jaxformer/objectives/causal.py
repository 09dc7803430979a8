"""Causal language modelling (GPT; Radford et al. 2018, 2019) and its fine-tuning variant (SFT).

Teacher forcing on packed rows: the model reads ``inputs`` `[B, L]` and position ``t`` predicts
``inputs[t+1]``, the next token *of the same segment*. The last token of every packed segment, the
last position of the row and padding get weight 0, so nothing is predicted across documents.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jaxformer.objectives._common import require, segments_and_positions, shift_left_within_segments
from jaxformer.vocab import SpecialTokens

Array = jnp.ndarray


def _next_token(batch: Mapping[str, Array], special: SpecialTokens, name: str) -> dict:
    require(batch, name, "inputs")
    tokens, seg, pos = segments_and_positions(batch, "inputs", special.pad_id)
    targets, valid = shift_left_within_segments(tokens, seg, fill=special.pad_id)
    return {
        "model_inputs": {"tokens": tokens, "positions": pos, "segment_ids": seg},
        "targets": targets,
        "weights": valid.astype(jnp.float32),
    }


def prepare_clm(batch: Mapping[str, Array], rng: jax.Array, special: SpecialTokens,
                options: Any = None) -> dict:
    """Next-token prediction.

    Batch: ``inputs`` `[B, L]` int32, optional ``inputs_segment_ids`` / ``inputs_positions``
    (default: one segment of the non-pad tokens, positions ``0..L-1``). ``rng``, ``options`` unused.

    Returns ``model_inputs`` {tokens, positions, segment_ids} (kwargs of `DecoderOnly`),
    ``targets`` `[B, L]` = ``inputs[t+1]`` within the segment (``pad_id`` elsewhere) and
    ``weights`` `[B, L]` float32, 1 where that next token exists.
    """
    del rng, options
    return _next_token(batch, special, "clm")


def prepare_sft(batch: Mapping[str, Array], rng: jax.Array, special: SpecialTokens,
                options: Any = None) -> dict:
    """Supervised fine-tuning of a causal LM on prompt/response rows: `prepare_clm`, but the loss
    counts only positions whose *target* (next) token is a response token.

    Batch: the `prepare_clm` keys plus ``inputs_loss_mask`` `[B, L]` (1 on response tokens, 0 on
    prompt tokens and padding). ``weights[t] = clm_weights[t] · inputs_loss_mask[t+1]``, so the
    first response token is predicted from the last prompt token and the prompt is never a target.
    """
    del rng, options
    require(batch, "sft", "inputs", "inputs_loss_mask")
    out = _next_token(batch, special, "sft")
    loss_mask = jnp.asarray(batch["inputs_loss_mask"]).astype(jnp.int32)
    seg = out["model_inputs"]["segment_ids"]
    next_mask, valid = shift_left_within_segments(loss_mask, seg, fill=0)
    out["weights"] = (valid & (next_mask != 0)).astype(jnp.float32)
    return out
