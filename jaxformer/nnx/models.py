"""The three families as Flax NNX modules, twins of the Linen ones in `jaxformer.models`.

* `EncoderOnly` (BERT; Devlin et al. 2019), `DecoderOnly` (GPT; Radford et al. 2019) and
  `EncoderDecoder` (Vaswani et al. 2017; T5, Raffel et al. 2020).

A model holds one `ParamNode` per part of `jaxformer.layers.params.model_spec` (``token_embed``,
``decoder``, ``lm_head``, …), so its `nnx.Param` state is exactly the Linen ``params`` tree, and
its forward pass is `jaxformer.models.forward`'s, the Linen models' own: the stacks run
`jaxformer.ops.stack.run_stack` (`jax.lax.scan` over ``layers`` when ``cfg.scan_layers``).

Dropout follows `nnx.Dropout`: models start in evaluation mode (``deterministic=True``, as the
Linen models' default); ``model.train()`` / ``model.eval()`` switch it, and a call's
``deterministic`` overrides. Keys come from the call's ``rngs`` — an `nnx.Rngs`, an `nnx.RngStream`
or a plain `jax.random` key (so a jitted step stays a pure function of (params, batch, key)) — or
else from a fork of the constructor's ``dropout`` (or default) stream. Part ``p`` of the model
draws ``fold_in(key, crc32(p))``; layer ``i`` of a stack ``split(its key, num_layers)[i]``.
Masks differ from Linen's (other key paths); without dropout the outputs are equal.

Decoding (`jaxformer.decode.generate`) runs the shared decode program on the model's parameters
through its Linen twin (`jaxformer.nnx.to_linen`): the KV cache lives in that program, not in NNX
variables.
"""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.config import ModelConfig
from jaxformer.layers.params import model_spec
from jaxformer.models import forward
from jaxformer.nnx.params import ParamNode
from jaxformer.ops.stack import has_dropout, run_stack

RngsArg = nnx.Rngs | nnx.RngStream | jax.Array | None


def _dropout_key(rngs: RngsArg) -> jax.Array:
    if rngs is None:
        raise ValueError("dropout is on (deterministic=False) but no key: pass rngs= to the call "
                         "(an nnx.Rngs, an RngStream or a jax.random key), or build the model "
                         "with rngs holding a 'dropout' (or default) stream")
    if isinstance(rngs, nnx.Rngs):
        return rngs.dropout()
    if isinstance(rngs, nnx.RngStream):
        return rngs()
    return rngs


class _NNXParts:
    """`jaxformer.models.forward.Parts` of an NNX model (no ``decode_state``: NNX calls never
    decode); the dropout key is drawn on first use."""

    def __init__(self, model: _Model, deterministic: bool, rngs: RngsArg):
        self.model, self.cfg, self.deterministic = model, model.cfg, deterministic
        self._rngs, self._key, self.values = rngs, None, {}

    def params(self, name: str) -> dict:
        if name not in self.values:
            node = getattr(self.model, name) if name in self.model.part_names else None
            self.values[name] = {} if node is None else node.tree()
        return self.values[name]

    def rng(self, name: str | None) -> jax.Array:
        if self._key is None:
            self._key = _dropout_key(self._rngs)
        return jax.random.fold_in(self._key, zlib.crc32((name or "model").encode()))

    def stack(self, name, x, *, num_layers, causal, cross_attention, decode, cache_index,
              **inputs):
        # NNX calls never decode (``decode`` is False): generation runs the shared KV-cache
        # program on the parameters (`jaxformer.decode.generate`).
        rng = None if self.deterministic or not has_dropout(self.cfg) else self.rng(name)
        return run_stack(self.params(name), x, cfg=self.cfg, num_layers=num_layers,
                         dropout_rng=rng, constrain=forward.constrain, causal=causal, **inputs)


class _Model(nnx.Module):
    """Parameters of ``model_spec(cfg)`` as attributes, one `ParamNode` per part.

    Args:
      cfg: the model config (its ``family`` must match the class).
      rngs: ``params`` (or default) stream: parameter init; ``dropout`` (or default) stream, if
        any: the model's own dropout keys.
      deterministic: start without dropout (evaluation mode).
    """

    family = ""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, deterministic: bool = True):
        if cfg.family != self.family:
            raise ValueError(f"model.family={cfg.family!r} needs jaxformer.nnx."
                             f"{MODELS[cfg.family].__name__}, not {type(self).__name__}")
        self.cfg = cfg
        self.deterministic = deterministic
        spec = model_spec(cfg)
        self.part_names = tuple(spec)
        for name, part in spec.items():
            setattr(self, name, ParamNode(part, rngs=rngs, param_dtype=jnp.dtype(cfg.param_dtype)))
        stream = "dropout" if "dropout" in rngs else "default" if "default" in rngs else None
        self.rngs = nnx.data(None if stream is None else rngs[stream].fork())

    def _parts(self, deterministic: bool | None, rngs: RngsArg) -> _NNXParts:
        deterministic = self.deterministic if deterministic is None else deterministic
        return _NNXParts(self, deterministic, self.rngs if rngs is None else rngs)


class EncoderOnly(_Model):
    """BERT-style bidirectional encoder. Output: the configured head's logits."""

    family = "encoder"

    def __call__(self, tokens, *, positions=None, segment_ids=None, token_types=None,
                 deterministic: bool | None = None, rngs: RngsArg = None,
                 return_hidden: bool = False):
        """tokens `[B, L]` → MLM logits `[B, L, V]` (plus NSP `[B, 2]`), class logits `[B, C]`,
        token logits `[B, L, C]` or hidden states `[B, L, D]`, by ``cfg.head``; ``return_hidden``:
        (that output, the last hidden states `[B, L, D]`)."""
        return forward.encoder_only(self._parts(deterministic, rngs), tokens, positions=positions,
                                    segment_ids=segment_ids, token_types=token_types,
                                    return_hidden=return_hidden)


class DecoderOnly(_Model):
    """GPT-style causal decoder: tokens `[B, L]` → logits `[B, L, V]` (or the head's output)."""

    family = "decoder"

    def __call__(self, tokens, *, positions=None, segment_ids=None,
                 deterministic: bool | None = None, rngs: RngsArg = None, factorization_rank=None,
                 return_hidden: bool = False):
        return forward.decoder_only(self._parts(deterministic, rngs), tokens, positions=positions,
                                    segment_ids=segment_ids, factorization_rank=factorization_rank,
                                    return_hidden=return_hidden)


class EncoderDecoder(_Model):
    """T5 / Transformer-base: encoder, causal decoder with cross-attention, shared token table."""

    family = "encoder_decoder"

    def __call__(self, inputs=None, targets_in=None, *, encoder_out=None, inputs_positions=None,
                 inputs_segment_ids=None, targets_positions=None, targets_segment_ids=None,
                 deterministic: bool | None = None, rngs: RngsArg = None):
        """inputs `[B, S]`, targets_in `[B, L]` (targets shifted right) → logits `[B, L, V]`;
        ``targets_in=None`` returns the encoder output `[B, S, D]`; ``encoder_out`` skips the
        encoder."""
        return forward.encoder_decoder(
            self._parts(deterministic, rngs), inputs, targets_in, encoder_out=encoder_out,
            inputs_positions=inputs_positions, inputs_segment_ids=inputs_segment_ids,
            targets_positions=targets_positions, targets_segment_ids=targets_segment_ids)

    def encode(self, inputs, **kwargs):
        """inputs `[B, S]` → encoder output `[B, S, D]`."""
        return self(inputs, None, **kwargs)

    def decode(self, encoder_out, targets_in, **kwargs):
        """Decoder pass over a given encoder output: `[B, S, D]`, `[B, L]` → `[B, L, V]`."""
        return self(None, targets_in, encoder_out=encoder_out, **kwargs)


MODELS = {"encoder": EncoderOnly, "decoder": DecoderOnly, "encoder_decoder": EncoderDecoder}


def build_model(cfg: ModelConfig, rngs: nnx.Rngs | int | None = None, **kwargs) -> _Model:
    """The NNX model for ``cfg.family``; ``rngs`` an `nnx.Rngs` or a seed (default 0)."""
    if not isinstance(rngs, nnx.Rngs):
        rngs = nnx.Rngs(0 if rngs is None else rngs)
    return MODELS[cfg.family](cfg, rngs=rngs, **kwargs)
