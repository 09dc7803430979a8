"""Sequence classification fine-tuning (BERT GLUE, Devlin et al. 2019 §4.1; GPT, Radford et al.
2018 §3.2): one label per row, read by the model's pooled classifier head."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jaxformer.objectives._common import require, segments_and_positions
from jaxformer.vocab import SpecialTokens

Array = jnp.ndarray


def prepare_classify(batch: Mapping[str, Array], rng: jax.Array, special: SpecialTokens,
                     options: Any = None) -> dict:
    """Batch ``inputs`` `[B, L]`, ``label`` `[B]` int (optional segment ids / positions and
    ``inputs_token_types`` for sentence pairs; or ``image``: `prepare_image_classify`) →
    ``model_inputs`` {tokens, positions, segment_ids
    [, token_types]}, ``targets`` `[B]` = label, ``weights`` `[B]` float32: 1 for rows holding an
    example, 0 for all-padding rows (the filler of a finite evaluation pass).

    Rows must be unpacked (one example per row): the head pools one token per row.
    """
    del rng, options
    if "image" in batch:  # an image model's batch (`jaxformer.data.images`)
        return prepare_image_classify(batch)
    require(batch, "classify", "inputs", "label")
    tokens, seg, pos = segments_and_positions(batch, "inputs", special.pad_id)
    label = jnp.asarray(batch["label"], jnp.int32)
    if label.shape != tokens.shape[:1]:
        raise ValueError(f"classify: label must have shape [batch]={tokens.shape[:1]}, got "
                         f"{label.shape}")
    model_inputs = {"tokens": tokens, "positions": pos, "segment_ids": seg}
    if "inputs_token_types" in batch:
        model_inputs["token_types"] = jnp.asarray(batch["inputs_token_types"], jnp.int32)
    return {"model_inputs": model_inputs, "targets": label,
            "weights": jnp.any(seg != 0, axis=1).astype(jnp.float32)}


def prepare_image_classify(batch: Mapping[str, Array]) -> dict:
    """Image classification (ViT, Dosovitskiy et al. 2021): batch ``image`` `[B, H, W, C]`, ``label``
    `[B]` and ``image_valid`` `[B]` (`jaxformer.data.images`; default all 1) → ``model_inputs``
    {images}, ``targets`` = label, ``weights`` = image_valid (0 on a finite pass's padding rows)."""
    require(batch, "classify", "image", "label")
    images = jnp.asarray(batch["image"], jnp.float32)
    label = jnp.asarray(batch["label"], jnp.int32)
    if label.shape != images.shape[:1]:
        raise ValueError(f"classify: label must have shape [batch]={images.shape[:1]}, got "
                         f"{label.shape}")
    valid = batch.get("image_valid")
    weights = jnp.ones(label.shape, jnp.float32) if valid is None else jnp.asarray(valid, jnp.float32)
    return {"model_inputs": {"images": images}, "targets": label, "weights": weights}
