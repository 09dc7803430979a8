"""The three families as Flax NNX modules: the library's one module implementation.

* `EncoderOnly` (BERT; Devlin et al. 2019), `DecoderOnly` (GPT; Radford et al. 2019) and
  `EncoderDecoder` (Vaswani et al. 2017; T5, Raffel et al. 2020).

A model holds one `ParamNode` per part of `jaxformer.layers.params.model_spec` (``token_embed``,
``decoder``, ``lm_head``, …), so its `nnx.Param` state is exactly the ``params`` tree of
checkpoints (those written with the former Linen modules too) and of the HF converters, and its
forward pass is `jaxformer.layers.forward`'s: the stacks run `jaxformer.ops.stack.run_stack`
(`jax.lax.scan` over ``layers`` when ``cfg.scan_layers``).

Dropout follows `nnx.Dropout`: models start in evaluation mode (``deterministic=True``, as the
former Linen models' default); ``model.train()`` / ``model.eval()`` switch it, and a call's
``deterministic`` overrides. Keys come from the call's ``rngs`` — an `nnx.Rngs`, an `nnx.RngStream`
or a plain `jax.random` key (so a jitted step stays a pure function of (params, batch, key)) — or
else from a fork of the constructor's ``dropout`` (or default) stream. Part ``p`` of the model
draws ``fold_in(key, crc32(p))``; layer ``i`` of a stack ``split(its key, num_layers)[i]``.

KV cache (decoder-only and encoder-decoder models): ``model.init_cache(batch_size, max_length,
source_length=None)`` allocates it as `nnx.Cache` state, `DecodeCache`; a call with
``decode=True`` appends its tokens at the cache's next slot and updates it in place (as flax's
``nnx.MultiHeadAttention`` and bonsai's layer caches do). Its pure dict,
``nnx.to_pure_dict(nnx.state(model, nnx.Cache))["cache"]``, is laid out as the former Linen
``cache`` collection: ``{"decoder": stack cache (`jaxformer.ops.stack.stack_cache`), "index": the
next slot, "positions": [B, S] each slot's position}``; `jaxformer.decode` works on that dict
through `jaxformer.nnx.FunctionalModel`.
"""

from __future__ import annotations

import functools
import zlib

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.config import ModelConfig
from jaxformer.layers import forward
from jaxformer.layers.params import model_spec
from jaxformer.nnx.params import ParamNode
from jaxformer.ops.stack import has_dropout, run_stack, stack_cache

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


class DecodeCache(nnx.Module):
    """A model's KV cache as `nnx.Cache` variables: one per decoding stack (its `stack_cache`
    tree), ``index`` (int32 scalar, the next free slot) and ``positions`` (`[B, S]` int32, each
    slot's position). Built from (and read back as) the pure dict of the module docstring."""

    def __init__(self, tree: dict):
        self.names = tuple(tree)
        for name, value in tree.items():
            setattr(self, name, nnx.Cache(value))

    def tree(self) -> dict:
        """The cache as a pure dict (arrays, nested as `stack_cache` and the module docstring)."""
        return {name: getattr(self, name).get_value() for name in self.names}


def cache_tree(cfg: ModelConfig, batch_size: int, max_length: int,
               source_length: int | None = None) -> dict:
    """A zero cache (the pure dict of `DecodeCache`) for ``batch_size`` rows of up to ``max_length``
    target tokens; encoder-decoder models need ``source_length`` (the padded source length, which
    sizes the cached cross-attention keys/values)."""
    if cfg.family not in ("decoder", "encoder_decoder"):
        raise ValueError(f"model.family={cfg.family!r} cannot generate: use a 'decoder' or "
                         "'encoder_decoder' model")
    if cfg.share_layers:
        raise ValueError("model.share_layers=True stacks do not decode (encoder family only)")
    cross = cfg.family == "encoder_decoder"
    if cross and source_length is None:
        raise ValueError("an encoder-decoder cache needs source_length (the padded source "
                         "length, which sizes the cached cross-attention keys/values)")
    layers = cfg.num_decoder_layers if cross else cfg.num_layers
    return {"decoder": stack_cache(cfg, layers, batch_size, max_length,
                                   source_length if cross else None),
            "index": jnp.zeros((), jnp.int32),
            "positions": jnp.zeros((batch_size, max_length), jnp.int32)}


class _NNXParts:
    """`jaxformer.layers.forward.Parts` of an NNX model; the dropout key is drawn on first use,
    decoding calls read and update the model's `DecodeCache`."""

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

    def _cache(self) -> DecodeCache:
        if self.model.cache is None:
            raise ValueError("decode=True needs the model's KV cache: call "
                             "model.init_cache(batch_size, max_length[, source_length]) first")
        return self.model.cache

    def stack(self, name, x, *, num_layers, causal, cross_attention, decode, cache_index,
              **inputs):
        with jax.named_scope(name):  # op names in HLO and profiles: <Family>/<stack>/layer_<i>/…
            return self._stack(name, x, num_layers=num_layers, causal=causal, decode=decode,
                               cache_index=cache_index, **inputs)

    def _stack(self, name, x, *, num_layers, causal, decode, cache_index, **inputs):
        rng = None if self.deterministic or not has_dropout(self.cfg) else self.rng(name)
        run = lambda **c: run_stack(self.params(name), x, cfg=self.cfg, num_layers=num_layers,
                                    dropout_rng=rng, constrain=forward.constrain, causal=causal,
                                    **c, **inputs)
        if not decode:
            return run()
        variable = getattr(self._cache(), name)
        x, new = run(cache=variable.get_value(), cache_index=cache_index)
        variable.set_value(new)
        return x

    def decode_state(self, tokens, positions):
        """(cache_index, positions `[B, L]`, slot positions `[B, S]`) of a decoding call, the
        cache's ``index`` and ``positions`` advanced (`forward.advance_decode_state`)."""
        cache = self._cache()
        i, positions, slots, nxt = forward.advance_decode_state(
            cache.index.get_value(), cache.positions.get_value(), tokens, positions)
        cache.positions.set_value(slots)
        cache.index.set_value(nxt)
        return i, positions, slots


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
        self.cache: DecodeCache | None = nnx.data(None)

    def init_cache(self, batch_size: int, max_length: int, source_length: int | None = None):
        """Allocate the KV cache (zeros, `cache_tree`) for ``batch_size`` rows of up to
        ``max_length`` target tokens (prompt included); ``source_length``: encoder-decoder."""
        self.set_cache(cache_tree(self.cfg, batch_size, max_length, source_length))

    def set_cache(self, tree: dict | None):
        """Hold ``tree`` (a pure cache dict, `cache_tree`'s layout) as the KV cache; None drops it."""
        self.cache = nnx.data(None) if tree is None else DecodeCache(tree)

    def _parts(self, deterministic: bool | None, rngs: RngsArg) -> _NNXParts:
        deterministic = self.deterministic if deterministic is None else deterministic
        return _NNXParts(self, deterministic, self.rngs if rngs is None else rngs)


def _named(call):
    """``call`` inside `jax.named_scope` of the model's class name, so that compiled programs and
    profiles name each op by its place in the model (``DecoderOnly/decoder/layer_0/…``)."""

    @functools.wraps(call)
    def named_call(self, *args, **kwargs):
        with jax.named_scope(type(self).__name__):
            return call(self, *args, **kwargs)

    return named_call


class EncoderOnly(_Model):
    """BERT-style bidirectional encoder. Output: the configured head's logits."""

    family = "encoder"

    @_named
    def __call__(self, tokens, *, positions=None, segment_ids=None, token_types=None,
                 deterministic: bool | None = None, rngs: RngsArg = None,
                 return_hidden: bool = False, head_inputs: bool = False, predict_positions=None):
        """tokens `[B, L]` → MLM logits `[B, L, V]` (plus NSP `[B, 2]`), class logits `[B, C]`,
        token logits `[B, L, C]` or hidden states `[B, L, D]`, by ``cfg.head``; ``return_hidden``:
        (that output, the last hidden states `[B, L, D]`). ``head_inputs``: the MLM head's
        operands instead of its logits; ``predict_positions`` `[B, P]`: the MLM head reads only
        these positions (`forward.head`)."""
        return forward.encoder_only(self._parts(deterministic, rngs), tokens, positions=positions,
                                    segment_ids=segment_ids, token_types=token_types,
                                    return_hidden=return_hidden, head_inputs=head_inputs,
                                    predict_positions=predict_positions)


class DecoderOnly(_Model):
    """GPT-style causal decoder: tokens `[B, L]` → logits `[B, L, V]` (or the head's output)."""

    family = "decoder"

    @_named
    def __call__(self, tokens, *, positions=None, segment_ids=None,
                 deterministic: bool | None = None, rngs: RngsArg = None, decode: bool = False,
                 factorization_rank=None, return_hidden: bool = False, decode_mask=None,
                 head_inputs: bool = False):
        """tokens `[B, L]` → logits `[B, L, V]` (or `[B, C]` with the classify head).

        With ``decode=True`` the call appends ``L`` tokens at the KV cache's next slot
        (`init_cache`; ``L`` may be a whole left-padded prompt with ``segment_ids`` 0 on the
        padding, then 1 per step, or one per beam); ``decode_mask`` `[B, L, S]` limits the cache
        slots each sees. With ``factorization_rank`` `[B, L]`: XLNet's query-stream logits
        (`forward.permutation_lm`). ``return_hidden``: (that output, the last hidden states).
        ``head_inputs``: the LM head's operands instead of its logits (`forward.head`).
        """
        return forward.decoder_only(self._parts(deterministic, rngs), tokens, positions=positions,
                                    segment_ids=segment_ids, decode=decode,
                                    factorization_rank=factorization_rank,
                                    return_hidden=return_hidden, decode_mask=decode_mask,
                                    head_inputs=head_inputs)


class EncoderDecoder(_Model):
    """T5 / Transformer-base: encoder, causal decoder with cross-attention, shared token table."""

    family = "encoder_decoder"

    @_named
    def __call__(self, inputs=None, targets_in=None, *, encoder_out=None, inputs_positions=None,
                 inputs_segment_ids=None, targets_positions=None, targets_segment_ids=None,
                 deterministic: bool | None = None, rngs: RngsArg = None, decode: bool = False,
                 decode_mask=None, head_inputs: bool = False):
        """inputs `[B, S]`, targets_in `[B, L]` (targets shifted right) → logits `[B, L, V]`;
        ``targets_in=None`` returns the encoder output `[B, S, D]`; ``encoder_out`` skips the
        encoder. ``decode=True`` uses the KV cache (`init_cache`): the call that passes
        ``encoder_out`` stores the cross-attention keys/values, later calls (``encoder_out=None``)
        reuse them; ``decode_mask`` and ``head_inputs`` as in `DecoderOnly`."""
        return forward.encoder_decoder(
            self._parts(deterministic, rngs), inputs, targets_in, encoder_out=encoder_out,
            inputs_positions=inputs_positions, inputs_segment_ids=inputs_segment_ids,
            targets_positions=targets_positions, targets_segment_ids=targets_segment_ids,
            decode=decode, decode_mask=decode_mask, head_inputs=head_inputs)

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
