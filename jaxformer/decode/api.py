"""User-facing generation: token-id lists or text in, generations out; one jitted function inside.

    result = generate(model, params, [[5, 17, 9], [8]], strategy="beam", beam_size=4,
                      max_new_tokens=20)
    texts = generate_text(model, params, tokenizer, ["Once upon a time"], strategy="sample",
                          temperature=0.8, top_p=0.9, rng=jax.random.key(0))

Sampling without ``rng`` draws from ``jax.random.key(DEFAULT_SEED)`` (0, as the command lines'
``--seed``): the same call gives the same samples; pass another key for other samples.

Two conventions, one program. ``model`` is what ``jaxformer.models.build_model`` returns (a
`jaxformer.models.Model`) and ``params`` its parameter tree (a checkpoint's, `load_hf`'s); or an NNX
model (`jaxformer.models.Transformer`, `from_hf`), which carries its parameters, so its calls omit
them: ``generate(nnx_model, prompts, ...)``, ``generate_text(nnx_model, tokenizer, texts, ...)``.
Either way the jitted program holds the model (its config) statically and takes the parameters and
the KV cache (`jaxformer.models.init_cache`'s dict) as pytrees.

For decoder-only models the inputs are prompts (continued); for encoder-decoder models they are
sources (the decoder starts from ``decoder_start_id``, 0 = pad as in T5). Everything from the prompt
to the last token runs in one `jax.jit` (``generate_padded``, compiled once per model, config and
padded input shape), so it also runs on sharded parameters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from jaxformer.decode import steps
from jaxformer.decode.beam import BeamResult, beam_search
from jaxformer.decode.refill import generate_refill, refill_supported
from jaxformer.decode.sampling import sample
from jaxformer.decode.search import DecodeResult, decode_loop
from jaxformer.models import Model
from jaxformer.ops.embedding import check_token_ids
from jaxformer.progress import bar_disabled

STRATEGIES = ("greedy", "sample", "beam")


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """How to generate. Changing ``temperature`` or ``top_p`` does not recompile.

    Attributes:
      strategy: "greedy" (argmax), "sample" (temperature / top-k / top-p) or "beam".
      max_new_tokens: tokens generated per row at most (EOS included).
      temperature, top_k, top_p: sampling controls (`jaxformer.decode.sampling.sample`);
        temperature 0 = greedy; top_k None/0 and top_p None/1 disable the filters.
      beam_size, length_penalty: beam width k and GNMT exponent alpha (0 = none).
      eos_id: id that ends a sequence (None: always generate ``max_new_tokens``).
      pad_id: id written after EOS.
      decoder_start_id: first decoder input of encoder-decoder models (T5: pad = 0).
      no_repeat_ngram_size: never generate an n-gram twice in one sequence (its generated tokens;
        `jaxformer.decode.ngram`), every strategy; 0 = off.
    """

    strategy: str = "greedy"
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    beam_size: int = 4
    length_penalty: float = 0.6
    eos_id: int | None = 1
    pad_id: int = 0
    decoder_start_id: int = 0
    no_repeat_ngram_size: int = 0

    def __post_init__(self):
        def bad(field, want):
            raise ValueError(f"{field}={getattr(self, field)!r} is invalid: {want}")

        def positive_int(x):
            return isinstance(x, int) and not isinstance(x, bool) and x > 0

        if self.strategy not in STRATEGIES:
            bad("strategy", f"choose one of {STRATEGIES}")
        if not positive_int(self.max_new_tokens):
            bad("max_new_tokens", "must be a positive integer")
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            bad("temperature", "must be a number >= 0 (0 = greedy)")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 0):
            bad("top_k", "must be None or an integer >= 0 (0 or None = off)")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            bad("top_p", "must be None or in (0, 1] (None or 1 = off)")
        if not positive_int(self.beam_size):
            bad("beam_size", "must be a positive integer")
        if not isinstance(self.length_penalty, (int, float)):
            bad("length_penalty", "must be a number (the GNMT alpha, e.g. 0.6; 0 = none)")
        if not isinstance(self.no_repeat_ngram_size, int) or self.no_repeat_ngram_size < 0:
            bad("no_repeat_ngram_size", "must be an integer >= 0 (0 = off)")
        for f in ("pad_id", "decoder_start_id") + (() if self.eos_id is None else ("eos_id",)):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 0:
                bad(f, "must be a non-negative token id")

    def check_model(self, cfg) -> None:
        """Raise ValueError if this config cannot run on a model with config ``cfg``."""
        if cfg.family not in ("decoder", "encoder_decoder") or cfg.head != "lm":
            raise ValueError(f"cannot generate with model.family={cfg.family!r}, "
                             f"model.head={cfg.head!r}: need a 'decoder' or 'encoder_decoder' "
                             "model with the 'lm' head")
        ids = {"pad_id": self.pad_id, "decoder_start_id": self.decoder_start_id,
               "eos_id": self.eos_id}
        for name, v in ids.items():
            if v is not None and v >= cfg.vocab_size:
                raise ValueError(
                    f"{name}={v} is outside the model vocabulary [0, {cfg.vocab_size})")


def _program(config: GenerationConfig) -> GenerationConfig:
    """``config`` reduced to what changes the compiled program (the jit cache key).

    Temperature and top-p are passed traced, so only whether they are active matters (then
    marked 1.0 / 0.5); options of the other strategies are reset to their defaults.
    """
    default = GenerationConfig()
    off = dict(temperature=default.temperature, top_k=None, top_p=None)
    if config.strategy == "beam":
        return dataclasses.replace(config, **off)
    beam_defaults = dict(beam_size=default.beam_size, length_penalty=default.length_penalty)
    if config.strategy == "greedy" or config.temperature == 0:
        return dataclasses.replace(config, strategy="greedy", **off, **beam_defaults)
    top_p_on = config.top_p is not None and config.top_p < 1.0
    return dataclasses.replace(config, temperature=1.0, top_k=config.top_k or None,
                               top_p=0.5 if top_p_on else None, **beam_defaults)


def _generate_impl(model: Model, program: GenerationConfig, params: Any, inputs: jax.Array,
                   lengths: jax.Array, rng: jax.Array | None, temperature: jax.Array,
                   top_p: jax.Array) -> DecodeResult | BeamResult:
    beam = program.strategy == "beam"
    s = steps.start(model, params, inputs, lengths, max_new_tokens=program.max_new_tokens,
                    decoder_start_id=program.decoder_start_id,
                    tokens_per_step=program.beam_size if beam else 1)
    step_fn = partial(steps.step, model, params)
    if beam:
        return beam_search(step_fn, s.logits, s.state, s.positions, prefix_slots=s.prefix_slots,
                           beam_size=program.beam_size, max_new_tokens=program.max_new_tokens,
                           alpha=program.length_penalty, eos_id=program.eos_id,
                           pad_id=program.pad_id,
                           no_repeat_ngram_size=program.no_repeat_ngram_size,
                           ends=s.ends, grow=s.grow)
    if program.strategy == "greedy":
        choose = partial(sample, temperature=0.0)
    else:
        choose = partial(sample, temperature=temperature, top_k=program.top_k,
                         top_p=None if program.top_p is None else top_p)
    return decode_loop(step_fn, s.logits, s.state, s.positions, choose,
                       max_new_tokens=program.max_new_tokens, eos_id=program.eos_id,
                       pad_id=program.pad_id, rng=rng,
                       no_repeat_ngram_size=program.no_repeat_ngram_size, ends=s.ends,
                       grow=s.grow)


_generate_jit = jax.jit(_generate_impl, static_argnums=(0, 1))

DEFAULT_SEED = 0  # the key sampling draws from when no rng is given (the CLIs' --seed default)


def sampling_key(rng: jax.Array | None) -> jax.Array:
    """``rng``, or ``jax.random.key(DEFAULT_SEED)`` when None: sampling is reproducible either way."""
    return jax.random.key(DEFAULT_SEED) if rng is None else rng


def generate_padded(model: Model, params: Any, inputs: jax.Array, lengths: jax.Array,
                    config: GenerationConfig, rng: jax.Array | None = None
                    ) -> DecodeResult | BeamResult:
    """Jitted generation from a right-padded batch (e.g. a pipeline batch's ``inputs``).

    Args:
      model: the `Model` of a decoder-only or encoder-decoder config.
      params: its parameter tree (the ``"params"`` collection).
      inputs: `[B, L]` int32 prompts (decoder-only) or sources (encoder-decoder), right-padded.
      lengths: `[B]` int32 real tokens per row (prompts need at least one).
      rng: PRNG key for ``strategy="sample"`` (default `sampling_key`: ``key(DEFAULT_SEED)``).

    Returns:
      `DecodeResult` (greedy/sample) or `BeamResult` (beam), arrays of shape `[B, max_new_tokens]`.
    """
    config.check_model(model.cfg)
    program = _program(config)
    knobs = jnp.float32(config.temperature), jnp.float32(config.top_p or 1.0)
    return _generate_jit(model, program, params, inputs, lengths,
                         sampling_key(rng) if program.strategy == "sample" else None, *knobs)


def _functional(model: Any, params: Any) -> tuple[Model, Any]:
    """(model, params) of a `Model` and its params, or of an NNX model (its `nnx.Param` state)."""
    if isinstance(model, nnx.Module):
        return Model(model.cfg), nnx.to_pure_dict(nnx.state(model, nnx.Param))
    return model, params


def _unwrap(params: Any) -> Any:
    if isinstance(params, Mapping) and set(params) == {"params"}:
        return params["params"]
    return params


def generate(
    model: Model | nnx.Module,
    params: Any = None,
    prompts: Sequence[Sequence[int]] | None = None,
    *,
    strategy: str = "greedy",
    max_new_tokens: int = 32,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    beam_size: int = 4,
    length_penalty: float = 0.6,
    eos_id: int | None = 1,
    pad_id: int = 0,
    decoder_start_id: int = 0,
    no_repeat_ngram_size: int = 0,
    rng: jax.Array | None = None,
    pad_to: int = 0,
) -> DecodeResult | BeamResult:
    """Generate continuations of ``prompts`` (decoder-only) or targets for sources (enc-dec).

    ``prompts`` is a list of token-id lists of any lengths (padded here; with greedy and beam
    search each row's result equals generating it alone; sampling draws every row from one key,
    so a row's sample depends on the batch it is in). See `GenerationConfig` for the options.
    ``params`` is the parameter tree (``{"params": tree}`` is accepted too); an NNX model holds
    its own, so ``generate(nnx_model, prompts, ...)``. ``pad_to``: pad the inputs to at least
    this width, so batches of shorter prompts reuse one compiled program (the results are the
    same). Use ``result.sequences(eos_id)`` for Python lists.
    """
    if isinstance(model, nnx.Module) and prompts is None:
        params, prompts = None, params
    model, params = _functional(model, params)
    if prompts is None:
        raise ValueError("generate needs prompts, e.g. generate(model, params, [[5, 6], [7]])")
    config = GenerationConfig(
        strategy=strategy, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
        top_p=top_p, beam_size=beam_size, length_penalty=length_penalty, eos_id=eos_id,
        pad_id=pad_id, decoder_start_id=decoder_start_id,
        no_repeat_ngram_size=no_repeat_ngram_size)
    cfg = model.cfg
    config.check_model(cfg)
    if isinstance(prompts, (str, bytes)) or not len(prompts):
        raise ValueError("prompts must be a non-empty list of token-id lists, e.g. [[5, 6], [7]]")
    if not all(hasattr(p, "tolist") or isinstance(p, Sequence) and not isinstance(p, (str, bytes))
               for p in prompts) or any(getattr(p, "ndim", 1) != 1 for p in prompts):
        raise ValueError("prompts must be a list of token-id lists, e.g. [[5, 6], [7]] (one "
                         "prompt is [[5, 6]], not [5, 6])")
    rows = [p.tolist() if hasattr(p, "tolist") else list(p) for p in prompts]
    floats = [x for r in rows for x in r if not isinstance(x, int) or isinstance(x, bool)]
    if floats:
        raise ValueError(f"prompts must hold integer token ids, got e.g. {floats[:3]}")
    inputs, lengths = _pad_rows(cfg, rows, config, max(1, pad_to))
    return generate_padded(model, _unwrap(params), jnp.asarray(inputs), jnp.asarray(lengths),
                           config, rng)


def _pad_rows(cfg, rows: Sequence[Sequence[int]], config: GenerationConfig,
              width: int) -> tuple[np.ndarray, np.ndarray]:
    """(`[B, W]` right-padded int32 inputs, `[B]` lengths) of token-id lists, ``W`` = the longest
    or ``width`` if more; ValueError for an empty prompt, an id outside the vocabulary, or a
    length the learned position table cannot hold."""
    lengths = np.array([len(r) for r in rows], np.int32)
    decoder_only = cfg.family == "decoder"
    if decoder_only and lengths.min() == 0:
        raise ValueError(f"prompt {int(np.argmin(lengths))} is empty: a decoder-only model needs "
                         "at least one token to continue from (e.g. the BOS id)")
    inputs = np.full((len(rows), max(width, int(lengths.max()))), config.pad_id, np.int32)
    for i, r in enumerate(rows):
        inputs[i, :len(r)] = r
    check_token_ids(inputs, cfg.vocab_size, "prompts" if decoder_only else "sources")
    if cfg.position == "learned":
        new = config.max_new_tokens
        need = int(lengths.max()) + new if decoder_only else max(int(lengths.max()), new)
        if need > cfg.max_len:
            what = ("longest prompt + max_new_tokens" if decoder_only
                    else "max(source length, max_new_tokens)")
            raise ValueError(f"{what} = {need} exceeds model.max_len={cfg.max_len} (the learned "
                             "position table); shorten the input or lower max_new_tokens")
    return inputs, lengths


def bucket_width(longest: int, cap: int, smallest: int = 8) -> int:
    """The padded width of a batch whose longest input has ``longest`` tokens: the next power of
    two (at least ``smallest``), at most ``cap`` (the longest input of the whole set, if more)."""
    return max(longest, min(cap, max(smallest, 1 << max(longest - 1, 0).bit_length())))


def generate_batches(model: Model | nnx.Module, params: Any,
                     prompts: Sequence[Sequence[int]], config: GenerationConfig, *,
                     batch_size: int, rng: jax.Array | None = None,
                     progress: bool | None = False, refill: bool = False,
                     segment: int = 16) -> list[list[int]]:
    """Generated ids (EOS and what follows removed) for each of ``prompts``, in their order,
    decoded ``batch_size`` at a time (what `predict` and `evaluate` decode with).

    ``refill`` (greedy and sampling without ``no_repeat_ngram_size``; ignored otherwise): one
    batch of ``batch_size`` rows runs ``segment`` steps at a time and, between segments, rows that
    finished take the next waiting prompt (`jaxformer.decode.refill`): outputs that end at very
    different lengths do not keep a batch running for its longest. Greedy results are the same
    either way; sampled rows draw from ``fold_in(rng, segment number)``.

    The prompts are sorted by length and each batch is padded to its longest rounded up to a power
    of two (`bucket_width`), so that a batch of short prompts does not pay, in prefill and in every
    step's attention over the cache, for the longest prompt of the set, and a handful of programs
    is compiled (one per width). The last batch is filled up with copies of its first prompt
    (their outputs are dropped). Greedy and beam results do not depend on the batching (each row
    equals generating it alone); sampling draws the ``n``-th batch (in length order) from
    ``fold_in(rng, n)``. An NNX model holds its parameters (pass None).
    """
    model, params = _functional(model, params)
    config.check_model(model.cfg)
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be at least 1")
    rows = [list(p) for p in prompts]
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    cap = max(len(r) for r in rows)
    rng = sampling_key(rng)
    if refill and refill_supported(config):
        if not isinstance(segment, int) or segment < 1:
            raise ValueError(f"segment={segment!r} must be a positive integer (steps between "
                             "refills)")
        return generate_refill(
            model, _unwrap(params), rows, config, batch_size=batch_size,
            width=bucket_width(cap, 1 << max(cap - 1, 0).bit_length()),
            pad_rows=lambda batch, width: _pad_rows(model.cfg, batch, config, width),
            program=_program(config),
            knobs=(jnp.float32(config.temperature), jnp.float32(config.top_p or 1.0)),
            segment=segment, rng=rng if config.strategy == "sample" else None)
    out: list[list[int]] = [[] for _ in rows]
    starts = range(0, len(order), batch_size)
    for n, start in enumerate(tqdm(starts, desc=f"decode ({config.strategy})", unit="batch",
                                   disable=bar_disabled(progress), leave=False)):
        idx = order[start:start + batch_size]
        batch = [rows[i] for i in idx]
        batch += [batch[0]] * (batch_size - len(batch))
        inputs, lengths = _pad_rows(model.cfg, batch, config,
                                    bucket_width(max(len(r) for r in batch), cap))
        result = generate_padded(model, _unwrap(params), jnp.asarray(inputs),
                                 jnp.asarray(lengths), config, jax.random.fold_in(rng, n))
        for i, seq in zip(idx, result.sequences(config.eos_id)):
            out[i] = seq
    return out


def generate_text(model: Model | nnx.Module, params: Any = None, tokenizer: Any = None,
                  texts: Sequence[str] | None = None, *,
                  add_bos: bool = False, append_eos: bool | None = None, **kwargs) -> list[str]:
    """Text in, text out. ``tokenizer`` has ``encode(str) -> list[int]``,
    ``decode(list[int]) -> str`` and ``special`` (`jaxformer.vocab.SpecialTokens`, whose
    eos/pad ids are the defaults). An NNX model holds its parameters:
    ``generate_text(nnx_model, tokenizer, texts, ...)``.

    Args:
      add_bos: prepend the BOS id to each input.
      append_eos: append the EOS id to each input; default True for encoder-decoder sources
        (T5 inputs end with EOS), False for prompts.
      kwargs: `generate` options.

    Returns:
      the generated texts (EOS removed), one per input.
    """
    if isinstance(model, nnx.Module) and texts is None:
        params, tokenizer, texts = None, params, tokenizer
    model, params = _functional(model, params)
    if isinstance(texts, str):
        raise ValueError("texts must be a list of strings, e.g. ['Hello'], not one string")
    special = tokenizer.special
    kwargs.setdefault("eos_id", special.eos_id)
    kwargs.setdefault("pad_id", max(special.pad_id, 0))  # Llama's tokenizers have no pad
    ids = encode_prompts(tokenizer, texts, model.cfg.family, add_bos=add_bos,
                         append_eos=append_eos)
    result = generate(model, params, ids, **kwargs)
    return [tokenizer.decode(s) for s in result.sequences(kwargs["eos_id"])]


def encode_prompts(tokenizer: Any, texts: Sequence[str], family: str, *, add_bos: bool = False,
                   append_eos: bool | None = None) -> list[list[int]]:
    """The token ids `generate_text` feeds `generate`: ``<s>? text`` for a decoder-only model's
    prompts, ``text </s>`` for an encoder-decoder model's sources (``append_eos`` None: by
    ``family``)."""
    special = tokenizer.special
    if append_eos is None:
        append_eos = family == "encoder_decoder"
    return [([special.bos_id] if add_bos else []) + list(tokenizer.encode(t))
            + ([special.eos_id] if append_eos else []) for t in texts]
