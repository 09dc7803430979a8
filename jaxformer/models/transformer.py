"""The three families, assembled from the same layers.

* `EncoderOnly`  (BERT; Devlin et al. 2019): bidirectional stack + MLM / classification heads.
* `DecoderOnly`  (GPT; Radford et al. 2019): causal stack + LM head; KV-cache decoding.
* `EncoderDecoder` (Vaswani et al. 2017; T5, Raffel et al. 2020): encoder + causal decoder with
  cross-attention + LM head; ``encode`` / ``decode`` entry points for generation.

Inputs follow one convention: ``tokens`` `[batch, length]` int32; ``positions`` `[batch, length]`
(default ``0..length-1``; packed rows restart them per segment); ``segment_ids`` `[batch, length]`
(0 = padding, equal ids attend to each other; default: all one segment). Models are pure Linen
modules: ``params = model.init(rng, ...)`` then ``model.apply(params, ...)``; dropout needs
``rngs={"dropout": key}`` and ``deterministic=False``.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from jaxformer.config import ModelConfig
from jaxformer.layers.embed import FinalNorm, InputEmbedding, RelativeBias, TokenEmbed
from jaxformer.layers.heads import ClassifierHead, LMHead, MLMHead, Pooler
from jaxformer.layers.stack import Stack
from jaxformer.ops.dropout import token_dropout
from jaxformer.ops.embedding import check_token_ids


def _check_tokens(cfg: ModelConfig, tokens, name: str = "tokens", *, default_positions=False):
    """``tokens`` are `[batch, length]` ids in the vocabulary; with learned positions and the
    default ``0..length-1`` the length fits the table (a static check, so also under jit)."""
    if getattr(tokens, "ndim", None) != 2:
        raise ValueError(f"{name} must be [batch, length] token ids, got shape "
                         f"{getattr(tokens, 'shape', type(tokens).__name__)}")
    check_token_ids(tokens, cfg.vocab_size, name)
    if default_positions and cfg.position == "learned" and tokens.shape[1] > cfg.max_len:
        raise ValueError(f"{name} of length {tokens.shape[1]} exceed model.max_len="
                         f"{cfg.max_len}, the learned position table's size")


def _positions(tokens, positions, offset=0):
    if positions is not None:
        return positions
    return jnp.broadcast_to(offset + jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)


def _decode_state(module: nn.Module, tokens, positions):
    """Model-level decode cache: the next slot ``index`` and each slot's position `[B, S]`.

    Returns (cache_index, positions, slot_positions or None while initialising).
    """
    initializing = not module.has_variable("cache", "index")
    index = module.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
    slot_pos = module.variable("cache", "positions", lambda: jnp.zeros(tokens.shape, jnp.int32))
    if initializing:
        return None, _positions(tokens, positions), None
    i = index.value
    size = slot_pos.value.shape[1]
    if not isinstance(i, jax.core.Tracer) and int(i) + tokens.shape[1] > size:
        raise ValueError(f"decoding {tokens.shape[1]} more token(s) at cache index {int(i)} "
                         f"overflows the cache of {size} slots (its length at init); initialise "
                         "the cache with a longer dummy input")
    positions = _positions(tokens, positions, offset=i)
    slot_pos.value = lax.dynamic_update_slice_in_dim(slot_pos.value, positions, i, axis=1)
    index.value = i + tokens.shape[1]
    return i, positions, slot_pos.value


def _stack_pass(module, cfg, name, x, positions, segment_ids, *, causal, deterministic,
                decode=False, cache_index=None, kv_positions=None, num_layers=None,
                cross_attention=False, encoder_out=None, encoder_segment_ids=None):
    """Relative bias (if any) → Stack → final norm (pre-LN). `[B, T, D]` → `[B, T, D]`."""
    bias = None
    if cfg.position == "relative":
        kv_pos = positions if kv_positions is None else kv_positions
        bias = RelativeBias(cfg, bidirectional=not causal, name=f"{name}_relative_bias")(positions, kv_pos)
    x = Stack(cfg, num_layers or cfg.num_layers, causal=causal, cross_attention=cross_attention,
              deterministic=deterministic, decode=decode, name=name)(
        x, positions, segment_ids, bias, encoder_out, encoder_segment_ids, None, cache_index)
    if cfg.norm_position == "pre":
        x = FinalNorm(cfg, name=f"{name}_norm")(x)
    return x


def _apply_head(cfg: ModelConfig, x, token_embed, segment_ids, deterministic):
    """Run the configured head on final hidden states `[B, T, D]`."""
    if cfg.head == "lm":
        return LMHead(cfg, name="lm_head")(x, token_embed)
    if cfg.head == "mlm":
        logits = MLMHead(cfg, name="mlm_head")(x, token_embed)
        if cfg.nsp_head:
            pooled = Pooler(cfg, name="pooler")(x, segment_ids)
            return logits, ClassifierHead(cfg, 2, deterministic, name="nsp_head")(pooled)
        return logits
    if cfg.head == "classify":
        pooled = Pooler(cfg, name="pooler")(x, segment_ids)
        return ClassifierHead(cfg, cfg.num_classes, deterministic, name="classifier")(pooled)
    if cfg.head == "token_classify":
        return ClassifierHead(cfg, cfg.num_classes, deterministic, name="token_classifier")(x)
    if cfg.pooler:  # head == "none"
        return x, Pooler(cfg, name="pooler")(x, segment_ids)
    return x


class EncoderOnly(nn.Module):
    """BERT-style bidirectional encoder. Output: the configured head's logits."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, tokens, *, positions=None, segment_ids=None, token_types=None,
                 deterministic: bool = True):
        """tokens `[B, T]` → MLM logits `[B, T, V]` (plus NSP `[B, 2]`), class logits `[B, C]`,
        token logits `[B, T, C]` or hidden states `[B, T, D]`, by ``cfg.head``."""
        cfg = self.cfg
        _check_tokens(cfg, tokens, default_positions=positions is None)
        positions = _positions(tokens, positions)
        token_embed = TokenEmbed(cfg, name="token_embed")
        x = InputEmbedding(cfg, deterministic, name="embed")(token_embed(tokens), positions, token_types)
        x = _stack_pass(self, cfg, "encoder", x, positions, segment_ids, causal=False,
                        deterministic=deterministic)
        return _apply_head(cfg, x, token_embed, segment_ids, deterministic)


class DecoderOnly(nn.Module):
    """GPT-style causal decoder. With ``decode=True`` it reads and writes the ``cache`` collection."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, tokens, *, positions=None, segment_ids=None, deterministic: bool = True,
                 decode: bool = False):
        """tokens `[B, T]` → logits `[B, T, V]` (or `[B, C]` with the classify head).

        In decode mode the call appends ``T`` tokens at the cache's current index (``T`` may be a
        whole left-padded prompt with ``segment_ids`` 0 on the padding, then 1 per step).
        """
        cfg = self.cfg
        _check_tokens(cfg, tokens, default_positions=positions is None and not decode)
        cache_index, kv_positions = None, None
        if decode:
            cache_index, positions, kv_positions = _decode_state(self, tokens, positions)
        positions = _positions(tokens, positions)
        token_embed = TokenEmbed(cfg, name="token_embed")
        x = InputEmbedding(cfg, deterministic, name="embed")(token_embed(tokens), positions)
        x = _stack_pass(self, cfg, "decoder", x, positions, segment_ids, causal=True,
                        deterministic=deterministic, decode=decode, cache_index=cache_index,
                        kv_positions=kv_positions)
        return _apply_head(cfg, x, token_embed, segment_ids, deterministic)


class EncoderDecoder(nn.Module):
    """T5 / Transformer-base: encoder, causal decoder with cross-attention, shared token table."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, inputs=None, targets_in=None, *, encoder_out=None, inputs_positions=None,
                 inputs_segment_ids=None, targets_positions=None, targets_segment_ids=None,
                 deterministic: bool = True, decode: bool = False):
        """inputs `[B, S]`, targets_in `[B, T]` (targets shifted right) → logits `[B, T, V]`.

        With ``targets_in=None`` returns the encoder output `[B, S, D]`; with ``encoder_out`` given
        the encoder is skipped. ``decode=True`` uses the cache (cross-attention keys/values are
        computed on the call that passes ``encoder_out`` and reused when it is None).
        """
        cfg = self.cfg
        token_embed = TokenEmbed(cfg, name="token_embed")
        if inputs is not None and encoder_out is None:
            _check_tokens(cfg, inputs, "inputs", default_positions=inputs_positions is None)
            pos = _positions(inputs, inputs_positions)
            x = InputEmbedding(cfg, deterministic, name="encoder_embed")(token_embed(inputs), pos)
            encoder_out = _stack_pass(self, cfg, "encoder", x, pos, inputs_segment_ids, causal=False,
                                      deterministic=deterministic,
                                      num_layers=cfg.num_encoder_layers)
            if targets_in is None:
                return encoder_out
        if targets_in is None:
            raise ValueError("EncoderDecoder needs targets_in to decode")
        _check_tokens(cfg, targets_in, "targets_in",
                      default_positions=targets_positions is None and not decode)
        cache_index, kv_positions = None, None
        if decode:
            cache_index, targets_positions, kv_positions = _decode_state(
                self, targets_in, targets_positions)
        pos = _positions(targets_in, targets_positions)
        y = token_embed(targets_in)
        if cfg.target_token_dropout_rate and not (deterministic or decode):
            y = token_dropout(y, cfg.target_token_dropout_rate, self.make_rng("dropout"))
        y = InputEmbedding(cfg, deterministic, name="decoder_embed")(y, pos)
        if encoder_out is None and not decode:
            raise ValueError("EncoderDecoder needs inputs or encoder_out (only decode steps after "
                             "the first may omit it: they reuse cached cross-attention keys/values)")
        y = _stack_pass(self, cfg, "decoder", y, pos, targets_segment_ids, causal=True,
                        deterministic=deterministic, decode=decode, cache_index=cache_index,
                        kv_positions=kv_positions, num_layers=cfg.num_decoder_layers,
                        cross_attention=True, encoder_out=encoder_out,
                        encoder_segment_ids=inputs_segment_ids)
        return LMHead(cfg, name="lm_head")(y, token_embed)

    def encode(self, inputs, **kwargs):
        """inputs `[B, S]` → encoder output `[B, S, D]`."""
        return self(inputs, None, **kwargs)

    def decode(self, encoder_out, targets_in, **kwargs):
        """Decoder pass over a given encoder output: `[B, S, D]`, `[B, T]` → `[B, T, V]`."""
        return self(None, targets_in, encoder_out=encoder_out, **kwargs)


MODELS = {"encoder": EncoderOnly, "decoder": DecoderOnly, "encoder_decoder": EncoderDecoder}


def build_model(cfg: ModelConfig) -> nn.Module:
    """The Linen module for ``cfg.family``."""
    return MODELS[cfg.family](cfg)
