"""`Transformer`: the model as one Flax NNX module, for users who hold models as objects.

    model = Transformer(cfg, nnx.Rngs(0))            # or Transformer(cfg, params=checkpoint_params)
    logits = model(tokens)                            # [batch, length] → [batch, length, vocab]
    model.train(); logits = model(tokens, rngs=key)   # dropout on (nnx.Dropout's convention)
    model.init_cache(batch_size, max_length)          # KV cache as nnx.Cache state; then
    logits = model(tokens, decode=True)               # appends tokens at the cache's next slot
    params = model.param_dict()                       # == nnx.to_pure_dict(nnx.state(model, nnx.Param))

It holds one `nnx.Param` per leaf of the parameter table (`jaxformer.models.spec.model_spec`),
named by its path, its logical axes as ``out_sharding`` metadata, and its call is
`jaxformer.models.model.Model.apply` on those parameters: one forward pass for the module and the
pure functions the trainer and the decoding loops call.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.config import ModelConfig
from jaxformer.models.model import Model, check_params, init_tree
from jaxformer.models.spec import ParamSpec

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


def _params(spec: dict, values: dict) -> dict:
    """``values`` as `nnx.Param`s carrying ``spec``'s logical axes (placed on a mesh by jit
    ``out_shardings``, not at creation, so a model can be built without a mesh)."""
    return {name: nnx.Param(jnp.asarray(values[name]), out_sharding=s.axes, eager_sharding=False)
            if isinstance(s, ParamSpec) else _params(s, values[name]) for name, s in spec.items()}


class Transformer(nnx.Module):
    """The model of ``cfg`` (any family) as an NNX module.

    Args:
      cfg: the model config.
      rngs: an `nnx.Rngs` or a seed: its ``params`` (or default) stream draws fresh parameters (one
        key per spec leaf, in the spec's order, as `Model.init`), its ``dropout`` (or default)
        stream, if any, the module's own dropout keys.
      params: the parameter dict to hold instead (a checkpoint's, `Model.init`'s, the HF
        converter's); checked against the config (`check_params`).
      deterministic: start without dropout (evaluation mode; ``train()`` / ``eval()`` switch it).
    """

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs | int = 0, *, params: dict | None = None,
                 deterministic: bool = True):
        if not isinstance(rngs, nnx.Rngs):
            rngs = nnx.Rngs(rngs)
        self.cfg = cfg
        self.deterministic = deterministic
        model = Model(cfg)
        spec = model.spec()
        if params is None:
            params = init_tree(spec, rngs.params, jnp.dtype(cfg.param_dtype))
        else:
            check_params(cfg, params)
        self.part_names = tuple(spec)
        for name, value in _params(spec, params).items():
            setattr(self, name, nnx.data(value))
        stream = "dropout" if "dropout" in rngs else "default" if "default" in rngs else None
        self.rngs = nnx.data(None if stream is None else rngs[stream].fork())
        self.cache = nnx.data(None)

    @property
    def model(self) -> Model:
        return Model(self.cfg)

    def param_dict(self) -> dict:
        """The parameters as the one pure dict of checkpoints and `Model.apply` (arrays by path)."""
        return nnx.to_pure_dict(nnx.state(self, nnx.Param))

    def init_cache(self, batch_size: int, max_length: int, source_length: int | None = None):
        """Allocate the KV cache (zeros, `jaxformer.models.model.init_cache`) as `nnx.Cache`
        state, for ``batch_size`` rows of up to ``max_length`` target tokens (prompt included);
        ``source_length``: encoder-decoder models."""
        self.set_cache(self.model.init_cache(batch_size, max_length, source_length))

    def set_cache(self, tree: dict | None):
        """Hold ``tree`` (a pure cache dict, `init_cache`'s layout) as the KV cache; None drops it."""
        self.cache = nnx.data(None if tree is None else {k: nnx.Cache(v) for k, v in tree.items()})

    def cache_dict(self) -> dict | None:
        """The KV cache as a pure dict (`init_cache`'s layout), or None."""
        return None if self.cache is None else {k: v.get_value() for k, v in self.cache.items()}

    def __call__(self, *inputs, rngs: RngsArg = None, deterministic: bool | None = None,
                 decode: bool = False, **kwargs):
        """`Model.apply` on the held parameters: ``inputs`` and ``kwargs`` as there. Dropout runs
        unless ``deterministic`` (default: the module's mode), keyed by ``rngs`` (an `nnx.Rngs`, an
        `nnx.RngStream` or a `jax.random` key) or else a draw from the module's own stream.
        ``decode=True`` appends the tokens at the KV cache's next slot (`init_cache` first) and
        updates the cache in place."""
        deterministic = self.deterministic if deterministic is None else deterministic
        rng = None if deterministic else _dropout_key(self.rngs if rngs is None else rngs)
        if not decode:
            return self.model.apply(self.param_dict(), *inputs, rng=rng, **kwargs)
        if self.cache is None:
            raise ValueError("decode=True needs the model's KV cache: call "
                             "model.init_cache(batch_size, max_length[, source_length]) first")
        out, cache = self.model.apply(self.param_dict(), *inputs, rng=rng, cache=self.cache_dict(),
                                      **kwargs)
        for name, value in cache.items():
            self.cache[name].set_value(value)
        return out

    def encode(self, inputs, **kwargs):
        """Encoder-decoder models: inputs `[B, S]` → encoder output `[B, S, D]`."""
        return self(inputs, None, **kwargs)
