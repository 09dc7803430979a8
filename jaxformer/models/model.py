"""The model as pure functions of its parameter pytree: `Model`, the one `build_model` and the one
`init_cache`.

    model = build_model(cfg)                         # cfg: jaxformer.config.ModelConfig
    params = model.init(jax.random.key(0))           # plain nested dict == checkpoints' params
    logits = model.apply(params, tokens)             # [batch, length] → [batch, length, vocab]
    logits = model.apply(params, tokens, rng=key)    # dropout on
    cache = model.init_cache(batch_size, max_length)
    logits, cache = model.apply(params, tokens, cache=cache)   # decoding: appends at the next slot

``params`` is laid out by the one parameter table (`jaxformer.models.spec.model_spec`), so it is
exactly the ``params`` of every checkpoint, of the HF converters and of LoRA's transform; the
logical axis names come from the same table (`Model.logical_axes`), and the forward passes are
`jaxformer.models.forward`'s. A jitted train step is a pure function of (params, batch, key), and a
`Model` (hashable by its config) may be a static argument: one compilation per config.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from jaxformer.config import ModelConfig
from jaxformer.models import forward
from jaxformer.models.spec import ParamSpec, model_spec
from jaxformer.ops.stack import stack_cache
from jaxformer.parallel.rules import LOGICAL_AXIS_RULES, Rules
from jaxformer.parallel.rules import param_shardings as rules_param_shardings

# The named scope each family's ops run in (compiled programs and profiles name an op by its place:
# ``DecoderOnly/decoder/layer_0/…``).
SCOPES = {"encoder": "EncoderOnly", "decoder": "DecoderOnly", "encoder_decoder": "EncoderDecoder"}


def _is_spec(x) -> bool:
    return isinstance(x, ParamSpec)


def init_tree(spec: Mapping, draw: Callable[[], jax.Array], dtype) -> dict:
    """Initialise ``spec`` leaf by leaf in its insertion order, depth first (not `jax.tree` order,
    which sorts keys), each leaf from the next key ``draw()`` gives, in ``dtype``."""
    out = {}
    for name, s in spec.items():
        out[name] = s.initializer()(draw(), s.shape, dtype) if _is_spec(s) else init_tree(s, draw, dtype)
    return out


def key_stream(rng: jax.Array) -> Callable[[], jax.Array]:
    """Keys ``fold_in(rng, 0)``, ``fold_in(rng, 1)``, … on successive calls: what
    ``nnx.Rngs(params=rng).params()`` draws (flax/nnx/rnglib.py, ``RngStream.__call__``), so
    fresh parameters are those of the NNX models before issue 61. Raw ``uint32`` key data is
    wrapped, as nnx does."""
    if rng.dtype == jnp.uint32:
        rng = jax.random.wrap_key_data(rng)
    count = itertools.count()
    return lambda: jax.random.fold_in(rng, next(count))


def init_cache(cfg: ModelConfig, batch_size: int, max_length: int,
               source_length: int | None = None) -> dict:
    """A zero KV cache for ``batch_size`` rows of up to ``max_length`` target tokens:
    ``{"decoder": stack cache (`jaxformer.ops.stack.stack_cache`), "index": int32 scalar, the next
    slot, "positions": [B, S] int32, each slot's position}``. Encoder-decoder models need
    ``source_length`` (the padded source length, which sizes the cached cross-attention keys/values)."""
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


@dataclasses.dataclass(frozen=True)
class Model:
    """The model of ``cfg.family`` as pure functions of its parameter dict. Hashable by ``cfg``."""

    cfg: ModelConfig

    def spec(self) -> dict:
        """The parameter table (`jaxformer.models.spec.model_spec`): `ParamSpec` leaves."""
        return model_spec(self.cfg)

    def init(self, rng: jax.Array) -> dict:
        """Fresh parameters (nested dict of arrays in ``cfg.param_dtype``): leaf ``i`` of the spec
        in insertion order from ``fold_in(rng, i)`` (`key_stream`), by its initialiser."""
        return init_tree(self.spec(), key_stream(rng), jnp.dtype(self.cfg.param_dtype))

    def abstract(self) -> dict:
        """`jax.ShapeDtypeStruct` per parameter (nothing computed)."""
        dtype = jnp.dtype(self.cfg.param_dtype)
        return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, dtype), self.spec(),
                            is_leaf=_is_spec)

    def logical_axes(self) -> dict:
        """Each parameter's logical axis names (a tuple; scanned stacks start with ``layers``)."""
        return jax.tree.map(lambda s: s.axes, self.spec(), is_leaf=_is_spec)

    def apply(self, params: Mapping, *inputs, rng: jax.Array | None = None,
              cache: dict | None = None, router_stats: bool = False, **kwargs):
        """The forward pass (`jaxformer.models.forward`) of ``cfg.family`` on ``inputs``: ``tokens``
        (encoder, decoder) or ``inputs, targets_in`` (encoder-decoder; ``inputs`` None with an
        ``encoder_out=``). ``rng`` None: deterministic, else dropout keyed by it. ``cache`` (from
        `init_cache`): decode, returning (output, updated cache). ``kwargs``: the family's
        keywords (``positions``, ``segment_ids``, ``token_types``, ``return_hidden``,
        ``head_inputs``, ``predict_positions``, ``factorization_rank``, ``decode_mask``,
        ``encoder_out``, ``inputs_``/``targets_positions``, ``inputs_``/``targets_segment_ids``).
        ``router_stats``: return (that output, the mean `jaxformer.ops.moe.RouterStats` over the
        MoE layers, None for a dense model), for the auxiliary losses and their metrics."""
        fn = forward.FORWARD[self.cfg.family]
        if cache is not None:
            kwargs["cache"] = cache
        with jax.named_scope(SCOPES[self.cfg.family]):
            if not router_stats:
                return fn(self.cfg, params, *inputs, rng=rng, **kwargs)
            with forward.collect_router_stats() as collected:
                out = fn(self.cfg, params, *inputs, rng=rng, **kwargs)
            return out, forward.router_stats_of(collected)

    def encode(self, params: Mapping, inputs, **kwargs):
        """Encoder-decoder models: inputs `[B, S]` → encoder output `[B, S, D]`."""
        if self.cfg.family != "encoder_decoder":
            raise ValueError(f"model.family={self.cfg.family!r} has no separate encoder to run: "
                             "encode is for 'encoder_decoder' models (apply runs the others)")
        return self.apply(params, inputs, None, **kwargs)

    def init_cache(self, batch_size: int, max_length: int, source_length: int | None = None) -> dict:
        """`init_cache` of this model's config."""
        return init_cache(self.cfg, batch_size, max_length, source_length)


def build_model(cfg: ModelConfig) -> Model:
    """The model of ``cfg`` (one of the three families, by ``cfg.family``)."""
    return Model(cfg)


def _flat(tree) -> dict[str, Any]:
    return {"/".join(str(k.key) for k in path): v
            for path, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def check_params(cfg: ModelConfig, params: Mapping) -> None:
    """ValueError naming the paths when ``params`` is not ``cfg``'s parameter tree."""
    want = _flat(Model(cfg).abstract())
    got = _flat(params)
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    shapes = [f"{p} {tuple(got[p].shape)} (expected {tuple(want[p].shape)})" for p in want
              if p in got and tuple(got[p].shape) != tuple(want[p].shape)]
    if missing or extra or shapes:
        layout = ""
        if any("/layers/" in p for p in missing) != any("/layers/" in p for p in extra):
            layout = (f"; the stacks are {'unrolled' if cfg.scan_layers else 'scanned'} in these "
                      f"parameters: set model.scan_layers={not cfg.scan_layers}")
        elif any(p.startswith("token_embed/") for p in shapes):
            layout = (f"; the vocabulary tables have {cfg.padded_vocab_size} rows in this model "
                      f"(vocab_pad_multiple={cfg.vocab_pad_multiple}): re-pad the parameters with "
                      "jaxformer.models.vocab_padding.fit_vocab")
        raise ValueError(f"parameters do not fit the model: missing {missing[:6]}, unexpected "
                         f"{extra[:6]}, shapes {shapes[:6]}{layout}")


def param_shardings(cfg: ModelConfig, mesh: Mesh, rules: Rules = LOGICAL_AXIS_RULES) -> dict:
    """`NamedSharding` per parameter of ``cfg``'s model (a dict like `Model.init`'s), by the logical
    rules (`jaxformer.parallel.rules`), divisibility checked."""
    model = Model(cfg)
    return rules_param_shardings(model.logical_axes(), model.abstract(), mesh, rules)
