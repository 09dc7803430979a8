"""The three families as Flax Linen modules (the NNX twins are in `jaxformer.nnx`).

* `EncoderOnly`  (BERT; Devlin et al. 2019): bidirectional stack + MLM / classification heads.
* `DecoderOnly`  (GPT; Radford et al. 2019): causal stack + LM head; KV-cache decoding.
* `EncoderDecoder` (Vaswani et al. 2017; T5, Raffel et al. 2020): encoder + causal decoder with
  cross-attention + LM head; ``encode`` / ``decode`` entry points for generation.

The forward passes are `jaxformer.models.forward`'s, shared with the NNX models; these modules only
declare each part's parameters (`jaxformer.layers.params.Part`), make dropout keys, run the stacks
(`jaxformer.layers.Stack`) and hold the decode cache. Inputs: see `jaxformer.models.forward`.
Models are pure Linen modules: ``params = model.init(rng, ...)`` then ``model.apply(params, ...)``;
dropout needs ``rngs={"dropout": key}`` and ``deterministic=False``.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from jaxformer.config import ModelConfig
from jaxformer.layers.params import Part, model_spec
from jaxformer.layers.stack import Stack
from jaxformer.models import forward


class _LinenParts:
    """`forward.Parts` of a Linen model: a `Part` submodule per name, declared on first use."""

    def __init__(self, module: nn.Module, deterministic: bool):
        self.module, self.cfg, self.deterministic = module, module.cfg, deterministic
        self.spec = model_spec(self.cfg)
        self.parts: dict[str, nn.Module] = {}
        self.values: dict[str, dict] = {}

    def _part(self, name: str) -> nn.Module:
        if name not in self.parts:
            self.parts[name] = Part(self.spec.get(name, {}), jnp.dtype(self.cfg.param_dtype),
                                    name=name)
        return self.parts[name]

    def params(self, name: str) -> dict:
        if name not in self.values:
            self.values[name] = self._part(name)()[0]
        return self.values[name]

    def rng(self, name: str | None):
        return self.module.make_rng("dropout") if name is None else self._part(name)(True)[1]

    def stack(self, name, x, *, num_layers, causal, cross_attention, decode, cache_index,
              positions, segment_ids, bias, encoder_out, encoder_segment_ids, two_stream=None):
        return Stack(self.cfg, num_layers, causal=causal, cross_attention=cross_attention,
                     deterministic=self.deterministic, decode=decode, name=name)(
            x, positions, segment_ids, bias, encoder_out, encoder_segment_ids, None, cache_index,
            two_stream)

    def decode_state(self, tokens, positions):
        """The model-level cache: the next slot ``index`` and each slot's position `[B, S]`;
        (cache_index, positions, slot positions), the last None while initialising."""
        m = self.module
        initializing = not m.has_variable("cache", "index")
        index = m.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
        slot_pos = m.variable("cache", "positions", lambda: jnp.zeros(tokens.shape, jnp.int32))
        if initializing:
            return None, forward.default_positions(tokens, positions), None
        i, positions, slot_pos.value, index.value = forward.advance_decode_state(
            index.value, slot_pos.value, tokens, positions)
        return i, positions, slot_pos.value


class EncoderOnly(nn.Module):
    """BERT-style bidirectional encoder. Output: the configured head's logits."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, tokens, *, positions=None, segment_ids=None, token_types=None,
                 deterministic: bool = True, return_hidden: bool = False):
        """tokens `[B, L]` → MLM logits `[B, L, V]` (plus NSP `[B, 2]`), class logits `[B, C]`,
        token logits `[B, L, C]` or hidden states `[B, L, D]`, by ``cfg.head``; ``return_hidden``:
        (that output, the last hidden states `[B, L, D]`)."""
        return forward.encoder_only(_LinenParts(self, deterministic), tokens, positions=positions,
                                    segment_ids=segment_ids, token_types=token_types,
                                    return_hidden=return_hidden)


class DecoderOnly(nn.Module):
    """GPT-style causal decoder. With ``decode=True`` it reads and writes the ``cache`` collection."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, tokens, *, positions=None, segment_ids=None, deterministic: bool = True,
                 decode: bool = False, factorization_rank=None, return_hidden: bool = False,
                 decode_mask=None):
        """tokens `[B, L]` → logits `[B, L, V]` (or `[B, C]` with the classify head).

        In decode mode the call appends ``L`` tokens at the cache's current index (``L`` may be a
        whole left-padded prompt with ``segment_ids`` 0 on the padding, then 1 per step, or one
        per beam); ``decode_mask`` `[B, L, S]` limits the cache slots each sees. With
        ``factorization_rank`` `[B, L]`: XLNet's query-stream logits (`forward.permutation_lm`).
        ``return_hidden``: (that output, the last hidden states `[B, L, D]`).
        """
        return forward.decoder_only(_LinenParts(self, deterministic), tokens, positions=positions,
                                    segment_ids=segment_ids, decode=decode,
                                    factorization_rank=factorization_rank,
                                    return_hidden=return_hidden, decode_mask=decode_mask)


class EncoderDecoder(nn.Module):
    """T5 / Transformer-base: encoder, causal decoder with cross-attention, shared token table."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, inputs=None, targets_in=None, *, encoder_out=None, inputs_positions=None,
                 inputs_segment_ids=None, targets_positions=None, targets_segment_ids=None,
                 deterministic: bool = True, decode: bool = False, decode_mask=None):
        """inputs `[B, S]`, targets_in `[B, L]` (targets shifted right) → logits `[B, L, V]`.

        With ``targets_in=None`` returns the encoder output `[B, S, D]`; with ``encoder_out`` given
        the encoder is skipped. ``decode=True`` uses the cache (cross-attention keys/values are
        computed on the call that passes ``encoder_out`` and reused when it is None;
        ``decode_mask`` as in `DecoderOnly`).
        """
        return forward.encoder_decoder(
            _LinenParts(self, deterministic), inputs, targets_in, encoder_out=encoder_out,
            inputs_positions=inputs_positions, inputs_segment_ids=inputs_segment_ids,
            targets_positions=targets_positions, targets_segment_ids=targets_segment_ids,
            decode=decode, decode_mask=decode_mask)

    def encode(self, inputs, **kwargs):
        """inputs `[B, S]` → encoder output `[B, S, D]`."""
        return self(inputs, None, **kwargs)

    def decode(self, encoder_out, targets_in, **kwargs):
        """Decoder pass over a given encoder output: `[B, S, D]`, `[B, L]` → `[B, L, V]`."""
        return self(None, targets_in, encoder_out=encoder_out, **kwargs)


MODELS = {"encoder": EncoderOnly, "decoder": DecoderOnly, "encoder_decoder": EncoderDecoder}


def build_model(cfg: ModelConfig) -> nn.Module:
    """The Linen module for ``cfg.family``."""
    return MODELS[cfg.family](cfg)
