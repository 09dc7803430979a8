"""Sequence-to-sequence teacher forcing (Vaswani et al. 2017; T5, Raffel et al. 2020).

The encoder reads ``inputs`` `[B, S]`; the decoder reads ``targets`` shifted right by one within
each packed segment, starting with a decoder start token, and predicts ``targets`` `[B, L]`.
T5 starts the decoder with the padding id 0 (its ``shift_right``; Hugging Face's
``decoder_start_token_id = pad_token_id``), which is the default here (``special.pad_id``); set
``objective.decoder_start_id`` for other conventions (e.g. BOS). The start token is never a
target, so reusing the pad id is harmless: padding is recognised by segment id 0, not by value.

Span corruption (T5) and BART denoising run on the host in the data pipeline
(`jaxformer.objectives.span_corruption`, `jaxformer.objectives.denoise`); on the device they are
this objective.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jaxformer.objectives._common import (
    require,
    segments_and_positions,
    shift_right_within_segments,
)
from jaxformer.vocab import SpecialTokens

Array = jnp.ndarray


def prepare_seq2seq(batch: Mapping[str, Array], rng: jax.Array, special: SpecialTokens,
                    options: Any = None, decoder_start_id: int | None = None) -> dict:
    """Encoder-decoder batch → model inputs, targets and weights.

    Batch: ``inputs`` `[B, S]`, ``targets`` `[B, L]` (ending with EOS, not shifted) and optional
    ``{inputs,targets}_{segment_ids,positions}``. ``options`` unused (those of span corruption,
    denoising or scheduled sampling act elsewhere); ``decoder_start_id`` (None: the pad id, T5's)
    is the decoder's first input (``objective.decoder_start_id``; `Objective.bind` passes it).

    Returns ``model_inputs`` with the keyword names of `EncoderDecoder` (inputs, targets_in,
    inputs_positions, inputs_segment_ids, targets_positions, targets_segment_ids), ``targets``
    `[B, L]` and ``weights`` `[B, L]` float32 = (targets_segment_ids != 0).
    """
    del rng, options
    require(batch, "seq2seq", "inputs", "targets")
    start = special.pad_id if decoder_start_id is None else int(decoder_start_id)
    inputs, in_seg, in_pos = segments_and_positions(batch, "inputs", special.pad_id)
    targets, tg_seg, tg_pos = segments_and_positions(batch, "targets", special.pad_id)
    targets_in = shift_right_within_segments(targets, tg_seg, start, pad=special.pad_id)
    return {
        "model_inputs": {"inputs": inputs, "targets_in": targets_in, "inputs_positions": in_pos,
                         "inputs_segment_ids": in_seg, "targets_positions": tg_pos,
                         "targets_segment_ids": tg_seg},
        "targets": targets,
        "weights": (tg_seg != 0).astype(jnp.float32),
    }
