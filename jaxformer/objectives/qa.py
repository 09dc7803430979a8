"""Extractive question answering fine-tuning (BERT on SQuAD, Devlin et al. 2019 §4.2): predict the
answer's first and last token of ``[CLS] question [SEP] context [SEP]`` rows
(`jaxformer.data.qa_windows`) with the model's span head (``model.head="span"``).

The loss is the cross-entropy of the start position plus that of the end position, halved (HF
``BertForQuestionAnswering``): the span head returns `[B, 2, L]` logits and the targets are
`[B, 2]`, so the trainer's mean cross-entropy over weighted positions is exactly that mean. Windows
that do not hold the answer (and unanswerable questions) point at [CLS], position 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jaxformer.objectives._common import require, segments_and_positions
from jaxformer.settings import positive, setting
from jaxformer.vocab import SpecialTokens

Array = jnp.ndarray

@dataclasses.dataclass(frozen=True)
class QAOptions:
    """The ``objective.*`` options of objective ``qa`` (extractive QA, BERT's run_squad.py)."""

    doc_stride: int = setting(
        128, "qa: context tokens between the starts of consecutive windows of a long context (BERT's "
        "run_squad.py)", check=positive)
    max_question_len: int = setting(
        64, "qa: question tokens kept (the rest are cut, counted)", check=positive)
    max_answer_len: int = setting(
        30, "qa: longest answer in tokens that span decoding returns", check=positive)



def prepare_qa(batch: Mapping[str, Array], rng: jax.Array, special: SpecialTokens,
               options: Any = None) -> dict:
    """Batch ``inputs`` `[B, L]`, ``inputs_token_types`` `[B, L]`, ``start_position``,
    ``end_position`` `[B]` int → ``model_inputs`` {tokens, positions, segment_ids, token_types},
    ``targets`` `[B, 2]` = (start, end), ``weights`` `[B, 2]` float32: 1 on rows holding a feature,
    0 on all-padding rows. Rows are unpacked (one feature per row)."""
    del rng, options
    require(batch, "qa", "inputs", "inputs_token_types", "start_position", "end_position")
    tokens, seg, pos = segments_and_positions(batch, "inputs", special.pad_id)
    targets = jnp.stack([jnp.asarray(batch["start_position"], jnp.int32),
                         jnp.asarray(batch["end_position"], jnp.int32)], axis=-1)
    if targets.shape != (tokens.shape[0], 2):
        raise ValueError(f"qa: start_position and end_position must have shape [batch]="
                         f"{tokens.shape[:1]}, got {targets.shape[:-1]}")
    model_inputs = {"tokens": tokens, "positions": pos, "segment_ids": seg,
                    "token_types": jnp.asarray(batch["inputs_token_types"], jnp.int32)}
    row = jnp.any(seg != 0, axis=1).astype(jnp.float32)
    return {"model_inputs": model_inputs, "targets": targets,
            "weights": jnp.broadcast_to(row[:, None], targets.shape)}
