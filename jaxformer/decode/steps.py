"""Prefill and one-token steps of the two generative families on the KV cache.

The search loops (`search.py`, `beam.py`) see a model only through `start` and `step`, so they are
the same for GPT-style and T5-style models:

* decoder-only: prompts `[B, L]` (right-padded, as in pipeline batches) are left-aligned inside the
  jitted function, so every row's last prompt token sits in slot ``L − 1``; the whole prompt is
  prefilled in one cached call with ``segment_ids`` 0 on the padding (never attended) and per-row
  positions ``slot − num_pads`` (clipped at 0 on the padding, where a learned position table would
  otherwise give NaN). Row ``b`` then continues at position ``length_b``.
* encoder-decoder: sources `[B, S]` (right-padded) are encoded once; the decoder start token
  (``decoder_start_id``, 0 = pad in T5) is fed with the encoder output, which stores the
  cross-attention keys/values in the cache; later steps pass ``encoder_out=None`` and the source
  segment ids (the padding mask), carried in the decode state.

The model is a `jaxformer.models.Model` (what ``jaxformer.models.build_model`` gives; a
`Transformer`'s own, `jaxformer.decode.api`): each call is ``model.apply(params, ..., cache=c)`` →
(logits, updated cache), so the loops are pure functions of pytrees. The decode state is
``{"cache": ..., "source_segment_ids"?: [B, S]}``, the cache `jaxformer.models.init_cache`'s pure
dict (`jaxformer.decode.cache`).

The cache grows as the loops go (`segment_ends`): it is allocated for the first 32 generated tokens
and doubled in steps (32, 64, 128, … tokens; `DecodeStart.grow`), so that attention, which reads
every slot of the cache, reads the filled slots rounded up to the next step rather than the whole
``max_new_tokens`` from the first token (each segment is a loop of its own, compiled once).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax.numpy as jnp

from jaxformer.decode.cache import cache_slot_axes, grow_slots, init_cache
from jaxformer.models import Model

Array = jnp.ndarray


class DecodeStart(NamedTuple):
    """What the search loops start from.

    Attributes:
      logits: `[B, V]` float32 logits of the first token to generate.
      state: decode state pytree (cache, and source segment ids for encoder-decoder models).
      positions: `[B]` int32 position of the next token fed to the model.
      prefix_slots: cache slots before the first generated token's (the padded prompt's length, or
        1: the encoder-decoder start token).
      ends: `segment_ends`: the loops run steps ``[0, ends[0])``, ``[ends[0], ends[1])``, ….
      grow: ``grow(state, end)``: ``state`` with its cache padded to fit steps before ``end``
        (the cache ``start`` returns fits those before ``ends[0]``).
    """

    logits: Array
    state: dict[str, Any]
    positions: Array
    prefix_slots: int
    ends: tuple[int, ...]
    grow: Callable[[dict[str, Any], int], dict[str, Any]]


def segment_ends(max_new_tokens: int, first: int = 32) -> tuple[int, ...]:
    """Step counts at which the decoding loops stop to grow the cache: ``first``, doubled until
    ``max_new_tokens`` (the last end). E.g. 256 → (32, 64, 128, 256); 20 → (20,)."""
    ends = [min(first, max_new_tokens)]
    while ends[-1] < max_new_tokens:
        ends.append(min(2 * ends[-1], max_new_tokens))
    return tuple(ends)


def start(model: Model, params: Any, inputs: Array, lengths: Array, *, max_new_tokens: int,
          decoder_start_id: int = 0, tokens_per_step: int = 1) -> DecodeStart:
    """Run the prompt (decoder-only) or the source + start token (encoder-decoder).

    Args:
      inputs: `[B, L]` int32 right-padded prompts or sources.
      lengths: `[B]` int32 number of real tokens per row (prompts need ≥ 1).
      max_new_tokens: tokens to generate (`segment_ends` of it size the cache).
      decoder_start_id: first decoder input of encoder-decoder models.
      tokens_per_step: tokens each row appends per step (beam search: one per beam, all in the
        example's one cache, `jaxformer.decode.beam`); the cache holds the prompt (or start
        token) and ``tokens_per_step`` slots per step after it.
    """
    b, length = inputs.shape
    slot = jnp.arange(length, dtype=jnp.int32)[None, :]
    lengths = lengths.astype(jnp.int32)
    if model.cfg.family == "decoder":
        shift = (length - lengths)[:, None]  # number of left pads per row
        tokens = jnp.take_along_axis(inputs, (slot - shift) % length, axis=1)
        seg = (slot >= shift).astype(jnp.int32)
        tokens = jnp.where(seg == 1, tokens, 0)
        positions = jnp.maximum(slot - shift, 0)
        source_length, prefix = None, length
    else:
        seg = (slot < lengths[:, None]).astype(jnp.int32)
        encoder_out = model.encode(params, inputs, inputs_segment_ids=seg)
        tokens = jnp.full((b, 1), decoder_start_id, jnp.int32)
        positions = jnp.zeros_like(tokens)
        source_length, prefix = length, 1
    ends = segment_ends(max_new_tokens)

    def slots(end):  # the prompt (or start token), then tokens_per_step per step
        return prefix + tokens_per_step * end

    cache = init_cache(model, b, slots(ends[0]), source_length=source_length)
    if model.cfg.family == "decoder":
        logits, cache = model.apply(params, tokens, positions=positions, segment_ids=seg,
                                    cache=cache)
        state, next_positions = {"cache": cache}, lengths
    else:
        logits, cache = model.apply(params, None, tokens, encoder_out=encoder_out,
                                    inputs_segment_ids=seg, targets_positions=positions,
                                    cache=cache)
        state = {"cache": cache, "source_segment_ids": seg}
        next_positions = jnp.ones((b,), jnp.int32)
    axes = cache_slot_axes(model, b, source_length)

    def grow(state, end):
        return {**state, "cache": grow_slots(state["cache"], axes, slots(end))}

    return DecodeStart(logits[:, -1].astype(jnp.float32), state, next_positions, prefix, ends,
                       grow)


def step(model: Model, params: Any, state: dict[str, Any], tokens: Array,
         positions: Array, mask: Array | None = None) -> tuple[Array, dict[str, Any]]:
    """Append one token per row: tokens `[B]` at positions `[B]` → (`[B, V]` float32 logits,
    state); or ``L`` per row: `[B, L]`, `[B, L]` → `[B, L, V]`, each seeing the cache slots
    ``mask`` `[B, L, S]` allows (besides causality and validity)."""
    one = tokens.ndim == 1
    if one:
        tokens, positions = tokens[:, None], positions[:, None]
    tokens = tokens.astype(jnp.int32)
    if model.cfg.family == "decoder":
        logits, cache = model.apply(params, tokens, positions=positions, decode_mask=mask,
                                    cache=state["cache"])
    else:
        logits, cache = model.apply(params, None, tokens,
                                    inputs_segment_ids=state["source_segment_ids"],
                                    targets_positions=positions, decode_mask=mask,
                                    cache=state["cache"])
    logits = logits.astype(jnp.float32)
    return logits[:, 0] if one else logits, {**state, "cache": cache}
