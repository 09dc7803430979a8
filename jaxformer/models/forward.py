"""The three families' forward passes as pure functions of (config, parameters, inputs, key, cache).

``params`` is the model's parameter tree (`jaxformer.models.spec.model_spec`: ``token_embed``,
``decoder``, ``lm_head``, …; a part without parameters is absent). ``rng`` None runs
deterministically (no dropout); a key turns dropout on: part ``p`` of the model draws
``fold_in(rng, crc32(p))``, the model-level draws (word dropout) ``fold_in(rng, crc32("model"))``,
and layer ``i`` of a stack ``split(its key, num_layers)[i]`` (`jaxformer.ops.stack.run_stack`).
``cache`` (decoding; `jaxformer.models.model.init_cache`'s pure dict ``{"decoder": stack cache,
"index": next slot, "positions": [B, S]}``) makes a call append its tokens at the cache's next slot
and return ``(output, updated cache)``.

Inputs follow one convention: ``tokens`` `[batch, length]` int32; ``positions`` `[batch, length]`
(default ``0..length-1``; packed rows restart them per segment; consecutive within a segment, which
T5's relative bias relies on: `in_row_index`); ``segment_ids`` `[batch, length]` (0 = padding,
equal ids attend to each other; default: all one segment).
"""

from __future__ import annotations

import contextlib
import contextvars
import zlib

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from jaxformer.config import ModelConfig
from jaxformer.models.spec import embedding_width
from jaxformer.ops import permutation, ring_attention
from jaxformer.ops.dropout import token_dropout
from jaxformer.ops.embedding import check_token_ids
from jaxformer.ops.heads import (
    classify,
    lm_head_inputs,
    lm_logits,
    mlm_head_inputs,
    mlm_logits,
    pooled,
    span_logits,
    transform,
)
from jaxformer.ops.inputs import embed_inputs, embed_tokens
from jaxformer.ops.masks import local_window_mask, prefix_lm_mask, sliding_window_mask
from jaxformer.ops.moe import RouterStats
from jaxformer.ops.norms import normalize
from jaxformer.ops.patches import image_inputs
from jaxformer.ops.positions import alibi_bias, relative_position_bias
from jaxformer.ops.stack import has_dropout, run_stack

Array = jnp.ndarray
# The sharding hook handed to `jaxformer.ops`: binds logical names to the mesh while
# `jaxformer.parallel.partition.mesh_rules` is active (a no-op otherwise).
constrain = nn.with_logical_constraint


def part(params: dict, name: str) -> dict:
    """Parameters of part ``name`` (``{}`` for a part without any, e.g. a tied LM head)."""
    return params[name] if name in params else {}


def part_rng(rng: jax.Array, name: str | None) -> jax.Array:
    """Dropout key of part ``name`` (None: the model's own): ``fold_in(rng, crc32(name))``."""
    return jax.random.fold_in(rng, zlib.crc32((name or "model").encode()))


def _rng(rng: jax.Array | None, name: str | None, rate: float) -> jax.Array | None:
    return None if rng is None or not rate else part_rng(rng, name)


def check_tokens(cfg: ModelConfig, tokens, name: str = "tokens", *, default_positions=False):
    """``tokens`` are `[batch, length]` ids in the vocabulary; with learned positions and the
    default ``0..length-1`` the length fits the table (a static check, so also under jit)."""
    if getattr(tokens, "ndim", None) != 2:
        raise ValueError(f"{name} must be [batch, length] token ids, got shape "
                         f"{getattr(tokens, 'shape', type(tokens).__name__)}")
    check_token_ids(tokens, cfg.vocab_size, name)
    if default_positions and cfg.position == "learned" and tokens.shape[1] > cfg.max_len:
        raise ValueError(f"{name} of length {tokens.shape[1]} exceed model.max_len="
                         f"{cfg.max_len}, the learned position table's size")


def default_positions(tokens, positions, offset=0):
    """``positions`` if given, else ``offset + 0..length-1`` per row, `[B, L]` int32."""
    if positions is not None:
        return positions
    return jnp.broadcast_to(offset + jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)


def ring_order(*arrays):
    """``arrays`` (`[B, L, ...]` or None) in zig-zag order when the sequence is split over a
    context-parallel mesh axis (`jaxformer.ops.ring_attention`), else as they are. The model
    reorders its inputs once, so every layer and mask sees the same order (positions travel with
    their tokens), and `natural_order` restores its last hidden states before the head."""
    cp = ring_attention.active()
    if cp is None:
        return arrays
    return tuple(None if a is None else ring_attention.to_zigzag(a, cp.shards) for a in arrays)


def ring_scope(decode: bool, *arrays):
    """Context in which a forward over ``arrays`` (`[B, L, ...]` or None) runs: context-parallel
    as configured, except when decoding (a cache step has one query) or when a length does not
    split into the zig-zag's 2N chunks (evaluation or generation at another length; training
    lengths are checked by the config) — then attention runs whole, as on one device."""
    cp = ring_attention.active()
    if cp is None:
        return contextlib.nullcontext()
    if decode or any(a is not None and a.shape[1] % (2 * cp.shards) for a in arrays):
        return ring_attention.context_parallel(None)
    return contextlib.nullcontext()


def natural_order(x):
    """Inverse of `ring_order` for hidden states `[B, L, D]`."""
    cp = ring_attention.active()
    if cp is None:
        return x
    # still split over the length (natural order now), not gathered before the head
    return constrain(ring_attention.from_zigzag(x, cp.shards), ("batch", "act_length", "act_embed"))


def advance_decode_state(index, slot_positions, tokens, positions):
    """One decoding call's bookkeeping: ``tokens`` `[B, L]` take cache slots ``index … index+L-1``.

    Args:
      index: int32 scalar, the next free slot; slot_positions: `[B, S]` position held by each slot.
      positions: `[B, L]` or None (``index + 0..L-1``).

    Returns:
      (index, positions `[B, L]`, updated slot positions, next index). ValueError when a concrete
      index would overflow the ``S`` slots.
    """
    size = slot_positions.shape[1]
    if not isinstance(index, jax.core.Tracer) and int(index) + tokens.shape[1] > size:
        raise ValueError(f"decoding {tokens.shape[1]} more token(s) at cache index {int(index)} "
                         f"overflows the cache of {size} slots (its length at init); initialise "
                         "the cache with a longer dummy input")
    positions = default_positions(tokens, positions, offset=index)
    slots = lax.dynamic_update_slice_in_dim(slot_positions, positions, index, axis=1)
    return index, positions, slots, index + tokens.shape[1]


def _decode_state(cache: dict, tokens, positions):
    """(cache_index, positions `[B, L]`, slot positions `[B, S]`, the cache with ``index`` and
    ``positions`` advanced) of a decoding call (`advance_decode_state`)."""
    index, positions, slots, nxt = advance_decode_state(cache["index"], cache["positions"], tokens,
                                                        positions)
    return index, positions, slots, {**cache, "positions": slots, "index": nxt}


def run_part_stack(cfg: ModelConfig, params: dict, name: str, x, *, rng, num_layers: int,
                   causal: bool, cache: dict | None = None, cache_index=None, **inputs):
    """The blocks of stack ``name`` (`jaxformer.ops.stack.run_stack`) on `[B, L, D]` (or the pair of
    streams with ``two_stream``), dropout keyed by ``part_rng(rng, name)``; with a decoding
    ``cache`` (the model cache, its ``name`` entry used) the pair (`[B, L, D]`, its new ``name``
    entry). ``inputs``: `transformer_block`'s ``positions``, ``segment_ids``, ``bias``,
    ``encoder_out``, ``encoder_segment_ids`` (and ``two_stream``)."""
    with jax.named_scope(name):  # op names in HLO and profiles: <Family>/<stack>/layer_<i>/…
        dropout_rng = None if rng is None or not has_dropout(cfg) else part_rng(rng, name)
        stack_cache = {} if cache is None else dict(cache=cache[name], cache_index=cache_index)
        collected = _ROUTER_STATS.get()
        out = run_stack(part(params, name), x, cfg=cfg, num_layers=num_layers,
                        dropout_rng=dropout_rng, constrain=constrain, causal=causal, **stack_cache,
                        router_stats=collected is not None, **inputs)
        if collected is None:
            return out
        out, stats = out
        if stats is not None:
            collected.append((stats, sum(cfg.moe_layer(i) for i in range(num_layers))))
        return out


# The MoE layers' statistics of the stacks run inside `collect_router_stats` (None outside).
_ROUTER_STATS: contextvars.ContextVar[list | None] = contextvars.ContextVar("router_stats",
                                                                           default=None)


@contextlib.contextmanager
def collect_router_stats():
    """Inside it, every stack that runs records its MoE layers' mean `RouterStats` and their count
    (in the list it yields), for `router_stats_of`; outside it no statistics are kept."""
    collected: list = []
    token = _ROUTER_STATS.set(collected)
    try:
        yield collected
    finally:
        _ROUTER_STATS.reset(token)


def router_stats_of(collected: list) -> RouterStats | None:
    """The mean `RouterStats` over every MoE layer of the model (`collect_router_stats`'s list);
    None for a dense model."""
    if not collected:
        return None
    total = sum(n for _, n in collected)
    return jax.tree.map(lambda *a: sum(a) / total, *[jax.tree.map(lambda v, n=n: v * n, st)
                                                    for st, n in collected])


def embed(cfg: ModelConfig, params: dict, name: str, ids, positions, token_types=None, *, rng=None,
          word_dropout=False):
    """Token lookup, word dropout (``cfg.target_token_dropout_rate``, when asked), then part
    ``name``'s input embedding: `[B, L]` → `[B, L, D]`."""
    columns = embedding_width(cfg)[1]  # the tables' column axis: their gradients' sharding
    x = embed_tokens(part(params, "token_embed")["embedding"], ids, dtype=cfg.dtype,
                     constrain=constrain, columns=columns)
    if word_dropout:
        x = token_dropout(x, cfg.target_token_dropout_rate,
                          _rng(rng, None, cfg.target_token_dropout_rate))
    return embed_inputs(part(params, name), x, positions, token_types, cfg=cfg,
                        dropout_rng=_rng(rng, name, cfg.dropout_rate), constrain=constrain,
                        columns=columns)


def in_row_index(positions):
    """`[1, L]` int32: each position's index in its row, ``0..L-1`` in the order the model runs
    (`ring_order`), for a self-attention bias shared over the batch, `[1, H, L, L]`.

    T5's relative bias depends on ``kv_pos − q_pos`` only. Within a segment, positions are
    consecutive (packing restarts them at 0, left padding or a prefix shifts them by a constant),
    so that difference is the difference of the in-row indices; pairs across segments or with
    padding are hidden by the segment ids anyway. The bias is thus the same for every row: computed
    once from the indices, as T5, t5x and HF's T5 do, without the per-row `[B, H, L, L]` gather and
    its scatter-add onto the bucket table in the backward pass. A decoding call (queries against
    cache slots) keeps the per-row bias of its positions."""
    (index,) = ring_order(jnp.arange(positions.shape[1], dtype=jnp.int32)[None])
    return index


def relative_bias(cfg: ModelConfig, table, positions, kv_positions=None, *, causal: bool):
    """T5's relative-position bias (Raffel et al. 2020, §2.1) from ``table`` `[buckets, H]`, in
    ``cfg.dtype``: `[1, H, L, L]` for a self-attention over ``positions`` `[B, L]` (shared over the
    batch, `in_row_index`), `[B, H, L, S]` for queries at ``positions`` against cache slots at
    ``kv_positions`` `[B, S]` (decoding)."""
    if kv_positions is None:
        positions = kv_positions = in_row_index(positions)
    return relative_position_bias(table, positions, kv_positions, bidirectional=not causal,
                                  max_distance=cfg.relative_max_distance).astype(cfg.dtype)


def stack_pass(cfg: ModelConfig, params: dict, name: str, x, positions, segment_ids, *, rng=None,
               causal: bool, num_layers: int | None = None, cache: dict | None = None,
               cache_index=None, kv_positions=None, encoder_out=None, encoder_segment_ids=None,
               decode_mask=None, prefix=None):
    """Relative or ALiBi bias, sliding window or ModernBERT's local window (if any) → the stack
    ``name`` → final norm (pre-LN).
    `[B, L, D]` → `[B, L, D]` (with a decoding ``cache``: and the stack's new cache entry). The
    relative bias of a call without ``kv_positions`` (not decoding) is shared over the batch
    (`in_row_index`): it assumes positions consecutive within a segment. ``decode_mask`` `[B, L, S]`
    (decoding): the cache slots each query may see, added to the self-attention bias as 0 / −∞.
    ``prefix`` `[B, L]` bool (a causal stack, not decoding): the tokens of their segment's prefix,
    seen by every query (`jaxformer.ops.masks.prefix_lm_mask`, added as 0 / −∞; the stack then runs
    unmasked by causality, and the position biases take their bidirectional form)."""
    bias = None
    kv_pos = positions if kv_positions is None else kv_positions  # the keys' (cache slots' when decoding)
    one_way = causal and prefix is None  # a prefix is read both ways
    if cfg.position == "relative":
        bias = relative_bias(cfg, part(params, f"{name}_relative_bias")["embedding"], positions,
                             kv_positions, causal=one_way)
    if cfg.position == "alibi":  # float32: bfloat16 holds slope · distance in steps of 2 from 256 on
        bias = alibi_bias(positions, kv_pos, cfg.num_heads, bidirectional=not one_way)
    if cfg.sliding_window is not None and causal:
        in_window_Bx1xLxS = sliding_window_mask(
            positions, positions if kv_positions is None else kv_positions, cfg.sliding_window)
        window_Bx1xLxS = jnp.where(in_window_Bx1xLxS, 0.0, -jnp.inf).astype(cfg.dtype)
        bias = window_Bx1xLxS if bias is None else bias + window_Bx1xLxS
    if decode_mask is not None:
        hidden_Bx1xLxS = jnp.where(decode_mask[:, None], 0.0, -jnp.inf).astype(cfg.dtype)
        bias = hidden_Bx1xLxS if bias is None else bias + hidden_Bx1xLxS
    if prefix is not None:
        seen_Bx1xLxL = jnp.where(prefix_lm_mask(positions, positions, prefix), 0.0, -jnp.inf)
        bias = seen_Bx1xLxL.astype(cfg.dtype) if bias is None else bias + seen_Bx1xLxL.astype(cfg.dtype)
    local = None  # ModernBERT's local layers' window (`jaxformer.ops.blocks.layer_kind`)
    if cfg.local_attention is not None and not causal:
        local = local_window_mask(positions, positions, cfg.local_attention)
    out = run_part_stack(cfg, params, name, x, rng=rng, num_layers=num_layers or cfg.num_layers,
                         causal=one_way, cache=cache, cache_index=cache_index, positions=positions,
                         segment_ids=segment_ids, bias=bias, encoder_out=encoder_out,
                         encoder_segment_ids=encoder_segment_ids, local_mask=local)
    x, new = out if cache is not None else (out, None)
    if cfg.norm_position == "pre":
        x = normalize(cfg.norm, x, part(params, f"{name}_norm"), eps=cfg.norm_eps)
    return x if cache is None else (x, new)


def head(cfg: ModelConfig, params: dict, x, segment_ids, *, rng=None, head_inputs: bool = False,
         predict_positions=None):
    """The configured head on final hidden states `[B, L, D]` (see `encoder_only` for outputs).

    ``head_inputs``: the LM and MLM heads return their output projection's operands
    (`jaxformer.ops.heads.HeadInputs`) instead of logits, for a loss that never forms them.
    ``predict_positions`` `[B, P]` (MLM): the head reads only these positions' hidden states
    (BERT's ``max_predictions_per_seq`` gather), giving `[B, P, V]` logits."""

    def classifier(name, h):
        if cfg.prediction_head and name != "nsp_head":  # ModernBERT's dense → act → norm first
            h = transform(part(params, "prediction_head"), h, cfg=cfg)
        return classify(part(params, name), h, cfg=cfg, dropout_rng=_rng(rng, name, cfg.dropout_rate))

    table = part(params, "token_embed").get("embedding")  # None: an image model (no vocabulary)
    if cfg.head == "lm":
        return (lm_head_inputs if head_inputs else lm_logits)(part(params, "lm_head"), x, table,
                                                              cfg=cfg)
    if cfg.head == "mlm":
        logits = (mlm_head_inputs if head_inputs else mlm_logits)(
            part(params, "mlm_head"), gather_positions(x, predict_positions), table, cfg=cfg)
        if cfg.nsp_head:
            return logits, classifier("nsp_head", pooled(part(params, "pooler"), x, segment_ids,
                                                         cfg=cfg))
        return logits
    if cfg.head == "classify":
        return classifier("classifier", pooled(part(params, "pooler"), x, segment_ids, cfg=cfg))
    if cfg.head == "token_classify":
        return classifier("token_classifier", x)
    if cfg.head == "span":
        return span_logits(part(params, "qa_outputs"), x)
    if cfg.pooler:  # head == "none"
        return x, pooled(part(params, "pooler"), x, segment_ids, cfg=cfg)
    return x


def gather_positions(x, positions):
    """``x`` `[B, L, D]` at ``positions`` `[B, P]` → `[B, P, D]` (``x`` itself when None), as a
    one-hot `[B, P, L]` matmul at full precision (exact: one term a sum): a dot keeps the batch-
    sharded, lane-major layout of the hidden states, where a gather and its scatter-add gradient
    compiled to more bytes in every layer of bert_base on v5p (docs/scaling.md)."""
    if positions is None:
        return x
    one_hot_BxPxL = jax.nn.one_hot(positions, x.shape[1], dtype=x.dtype)
    return jnp.einsum("bpl,bld->bpd", one_hot_BxPxL, x, precision=lax.Precision.HIGHEST)


def encoder_only(cfg: ModelConfig, params: dict, tokens=None, *, images=None, rng=None,
                 positions=None, segment_ids=None, token_types=None, return_hidden: bool = False,
                 head_inputs: bool = False, predict_positions=None):
    """BERT (Devlin et al. 2019): tokens `[B, L]` → MLM logits `[B, L, V]` (plus NSP `[B, 2]`), class
    logits `[B, C]`, token logits `[B, L, C]`, span logits `[B, 2, L]` or hidden states `[B, L, D]`,
    by ``cfg.head``. ``return_hidden``: (that output, the last hidden states `[B, L, D]` the head
    reads), e.g. for distillation's cosine loss (`jaxformer.train.distill`). ``head_inputs`` and
    ``predict_positions`` `[B, P]`: see `head`; with the latter the MLM logits (and the hidden
    states ``return_hidden`` gives) are those of the ``P`` positions, `[B, P, ...]`.
    A model with ``cfg.image_size`` reads ``images`` instead (`image_encoder`)."""
    if cfg.image_size is not None or images is not None:
        if tokens is not None or positions is not None or token_types is not None:
            raise ValueError("an image model (model.image_size set) reads images=[B, H, W, C] "
                             "only, not tokens, positions or token types")
        return image_encoder(cfg, params, images, rng=rng, return_hidden=return_hidden)
    check_tokens(cfg, tokens, default_positions=positions is None)
    positions = default_positions(tokens, positions)
    with ring_scope(False, tokens):
        ids, pos, seg, types = ring_order(tokens, positions, segment_ids, token_types)
        x = embed(cfg, params, "embed", ids, pos, types, rng=rng)
        x = natural_order(stack_pass(cfg, params, "encoder", x, pos, seg, rng=rng, causal=False))
    out = head(cfg, params, x, segment_ids, rng=rng, head_inputs=head_inputs,
               predict_positions=predict_positions)
    return (out, gather_positions(x, predict_positions)) if return_hidden else out


def check_images(cfg: ModelConfig, images) -> None:
    """``images`` are `[batch, height, width, model.num_channels]` pixels (channels last) of an image
    model, whose sides are multiples of ``model.patch_size`` (a static check, also under jit)."""
    if cfg.image_size is None:
        raise ValueError("images were given to a text model: set model.image_size (and patch_size, "
                         "num_channels) to read images")
    shape = getattr(images, "shape", None)
    if shape is None or len(shape) != 4 or shape[-1] != cfg.num_channels:
        raise ValueError(f"images must be [batch, height, width, model.num_channels="
                         f"{cfg.num_channels}] pixels (channels last), got shape {shape}")
    if shape[1] % cfg.patch_size or shape[2] % cfg.patch_size:
        raise ValueError(f"images of {shape[1]}x{shape[2]} pixels do not divide into model.patch_size="
                         f"{cfg.patch_size} patches; resize them to a multiple (model.image_size="
                         f"{cfg.image_size})")


def image_encoder(cfg: ModelConfig, params: dict, images, *, rng=None, return_hidden: bool = False):
    """The Vision Transformer (Dosovitskiy et al. 2021, eq. 1–4): images `[B, H, W, C]` → patches and
    class token `[B, L, D]` (`jaxformer.ops.patches.image_inputs`) → the encoder stack (pre-LN:
    its final norm) → the head: class logits `[B, C]` of the class token (``pooling="first"``,
    eq. 4) or of the mean of the patch tokens (``"mean"``), or hidden states `[B, L, D]` (and the
    pooler's `[B, D]` with ``pooler``). Images of another size than ``cfg.image_size`` read the
    learned positions resampled to their grid (``cfg.position_interpolation``, ViT §3.2).
    ``return_hidden``: as `encoder_only`. Not split over a context-parallel mesh axis."""
    check_images(cfg, images)
    x = image_inputs(params["embed"], images, grid=cfg.image_grid, position=cfg.position,
                     dtype=cfg.dtype, dropout_rate=cfg.dropout_rate,
                     dropout_rng=_rng(rng, "embed", cfg.dropout_rate),
                     resize_method=cfg.position_interpolation)
    x = constrain(x, ("batch", "act_length", "act_embed"))
    positions = jnp.broadcast_to(jnp.arange(x.shape[1], dtype=jnp.int32), x.shape[:2])
    whole = ring_attention.context_parallel(None) if ring_attention.active() else contextlib.nullcontext()
    with whole:
        x = stack_pass(cfg, params, "encoder", x, positions, None, rng=rng, causal=False)
    # mean pooling reads the patches only: the class token (if any) is marked as padding for it
    pool_ids = (positions >= int(cfg.class_token)).astype(jnp.int32)
    out = head(cfg, params, x, pool_ids, rng=rng)
    return (out, x) if return_hidden else out


def decoder_only(cfg: ModelConfig, params: dict, tokens, *, rng=None, cache: dict | None = None,
                 positions=None, segment_ids=None, factorization_rank=None,
                 return_hidden: bool = False, decode_mask=None, head_inputs: bool = False,
                 prefix=None):
    """GPT (Radford et al. 2019): tokens `[B, L]` → logits `[B, L, V]` (or the head's output).
    With a ``cache`` the call appends ``L`` tokens at the cache's current index and returns
    (output, updated cache); ``decode_mask`` `[B, L, S]` bool then limits the cache slots each of
    them sees (besides causality by slot and the slots' validity; beam search's hypotheses sharing
    one cache, `jaxformer.decode.beam`). With ``factorization_rank`` `[B, L]`
    (``cfg.permutation_lm``): `permutation_lm`'s query-stream logits. ``return_hidden``: (that
    output, the last hidden states `[B, L, D]`), as `encoder_only`. ``head_inputs``: see `head`.
    ``prefix`` `[B, L]` bool (objective ``prefix_lm``; Raffel et al. 2020 §3.2.1): the tokens of
    their segment's prefix, which every query of the segment sees ("causal with prefix").
    """
    if prefix is not None and (cache is not None or factorization_rank is not None):
        raise ValueError("a prefix (objective 'prefix_lm') is read in one forward pass: not with a "
                         "decoding cache or a factorization_rank")
    if factorization_rank is not None:
        return permutation_lm(cfg, params, tokens, factorization_rank, rng=rng, positions=positions,
                              segment_ids=segment_ids, head_inputs=head_inputs)
    decode = cache is not None
    check_tokens(cfg, tokens, default_positions=positions is None and not decode)
    cache_index, kv_positions = None, None
    if decode:
        cache_index, positions, kv_positions, cache = _decode_state(cache, tokens, positions)
    positions = default_positions(tokens, positions)
    with ring_scope(decode, tokens):
        ids, pos, seg, pre = ring_order(tokens, positions, segment_ids, prefix)
        x = embed(cfg, params, "embed", ids, pos, rng=rng)
        x = stack_pass(cfg, params, "decoder", x, pos, seg, rng=rng, causal=True, cache=cache,
                       cache_index=cache_index, kv_positions=kv_positions, decode_mask=decode_mask,
                       prefix=pre)
        if decode:
            x, cache = x[0], {**cache, "decoder": x[1]}
        x = natural_order(x)
    out = head(cfg, params, x, segment_ids, rng=rng, head_inputs=head_inputs)
    out = (out, x) if return_hidden else out
    return (out, cache) if decode else out


def permutation_lm(cfg: ModelConfig, params: dict, tokens, rank, *, rng=None, positions=None,
                   segment_ids=None, head_inputs: bool = False):
    """XLNet's two-stream permutation LM (Yang et al. 2019 §2.3) through the decoder's own blocks:
    tokens `[B, L]` and the factorisation order ``rank`` `[B, L]` (`jaxformer.ops.permutation`) →
    the query stream's logits `[B, L, V]`, row ``i`` predicting ``tokens[i]`` from its predecessors
    in the order. The content stream is the GPT under the content mask; the query stream starts
    from `jaxformer.ops.permutation.query_stream_input` (the ``jump_embed`` table).
    """
    if not cfg.permutation_lm or cfg.head != "lm":
        raise ValueError("a factorization_rank (objective 'plm') needs model.permutation_lm=True "
                         f"(it adds the query stream's jump_embed table) and head='lm' (got "
                         f"permutation_lm={cfg.permutation_lm}, head={cfg.head!r})")
    check_tokens(cfg, tokens, default_positions=positions is None)
    positions = default_positions(tokens, positions)
    segment_ids = jnp.ones_like(tokens) if segment_ids is None else segment_ids
    x = embed(cfg, params, "embed", tokens, positions, rng=rng)
    pred = permutation.predecessor_index(rank, segment_ids)
    g, query_positions = permutation.query_stream_input(
        x, positions, pred, part(params, "jump_embed")["embedding"])
    two_stream = {"content_mask": permutation.content_stream_mask(rank, segment_ids),
                  "query_mask": permutation.query_stream_mask(rank, segment_ids),
                  "query_positions": query_positions}
    _, g = run_part_stack(cfg, params, "decoder", (x, g), rng=rng, num_layers=cfg.num_layers,
                          causal=False, positions=positions, segment_ids=segment_ids, bias=None,
                          encoder_out=None, encoder_segment_ids=None, two_stream=two_stream)
    if cfg.norm_position == "pre":
        g = normalize(cfg.norm, g, part(params, "decoder_norm"), eps=cfg.norm_eps)
    return head(cfg, params, g, segment_ids, rng=rng, head_inputs=head_inputs)


def encoder_decoder(cfg: ModelConfig, params: dict, inputs=None, targets_in=None, *, rng=None,
                    cache: dict | None = None, encoder_out=None, inputs_positions=None,
                    inputs_segment_ids=None, targets_positions=None, targets_segment_ids=None,
                    decode_mask=None, head_inputs: bool = False):
    """Vaswani et al. 2017 / T5 (Raffel et al. 2020): inputs `[B, S]`, targets_in `[B, L]` (targets
    shifted right) → logits `[B, L, V]`; ``targets_in=None`` returns the encoder output `[B, S, D]`;
    a given ``encoder_out`` skips the encoder. With a ``cache`` (decoding) the call that passes
    ``encoder_out`` stores the cross-attention keys/values, later calls (``encoder_out=None``) reuse
    them; it returns (logits, updated cache). ``decode_mask``: as in `decoder_only`;
    ``head_inputs``: the LM head's operands instead of logits (see `head`)."""
    with ring_scope(cache is not None, inputs, targets_in, encoder_out):
        return _encoder_decoder(cfg, params, inputs, targets_in, rng=rng, cache=cache,
                                encoder_out=encoder_out, inputs_positions=inputs_positions,
                                inputs_segment_ids=inputs_segment_ids,
                                targets_positions=targets_positions,
                                targets_segment_ids=targets_segment_ids, decode_mask=decode_mask,
                                head_inputs=head_inputs)


def _encoder_decoder(cfg: ModelConfig, params: dict, inputs, targets_in, *, rng, cache, encoder_out,
                     inputs_positions, inputs_segment_ids, targets_positions, targets_segment_ids,
                     decode_mask, head_inputs=False):
    """`encoder_decoder`; with context parallelism (never when decoding) both sequences run in
    zig-zag order, the encoder output staying in it for the cross-attention's ring."""
    decode = cache is not None
    (enc_seg,) = ring_order(inputs_segment_ids)
    if encoder_out is not None:
        (encoder_out,) = ring_order(encoder_out)
    if inputs is not None and encoder_out is None:
        check_tokens(cfg, inputs, "inputs", default_positions=inputs_positions is None)
        ids, pos = ring_order(inputs, default_positions(inputs, inputs_positions))
        x = embed(cfg, params, "encoder_embed", ids, pos, rng=rng)
        encoder_out = stack_pass(cfg, params, "encoder", x, pos, enc_seg, rng=rng, causal=False,
                                 num_layers=cfg.num_encoder_layers)
        if targets_in is None:
            return natural_order(encoder_out)
    if targets_in is None:
        raise ValueError("the encoder-decoder model needs targets_in to decode")
    check_tokens(cfg, targets_in, "targets_in",
                 default_positions=targets_positions is None and not decode)
    cache_index, kv_positions = None, None
    if decode:
        cache_index, targets_positions, kv_positions, cache = _decode_state(cache, targets_in,
                                                                            targets_positions)
    ids, pos, seg = ring_order(targets_in, default_positions(targets_in, targets_positions),
                               targets_segment_ids)
    y = embed(cfg, params, "decoder_embed", ids, pos, rng=rng,
              word_dropout=bool(cfg.target_token_dropout_rate) and not decode)
    if encoder_out is None and not decode:
        raise ValueError("the encoder-decoder model needs inputs or encoder_out (only decode steps "
                         "after the first may omit it: they reuse cached cross-attention keys/values)")
    y = stack_pass(cfg, params, "decoder", y, pos, seg, rng=rng, causal=True, cache=cache,
                   cache_index=cache_index, kv_positions=kv_positions,
                   num_layers=cfg.num_decoder_layers, encoder_out=encoder_out,
                   encoder_segment_ids=enc_seg, decode_mask=decode_mask)
    if decode:
        y, cache = y[0], {**cache, "decoder": y[1]}
    out = (lm_head_inputs if head_inputs else lm_logits)(
        part(params, "lm_head"), natural_order(y), part(params, "token_embed")["embedding"], cfg=cfg)
    return (out, cache) if decode else out


FORWARD = {"encoder": encoder_only, "decoder": decoder_only, "encoder_decoder": encoder_decoder}
