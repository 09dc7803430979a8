"""An NNX family as the pure functions the trainer and the decoding loops call: ``init`` and ``apply``.

``apply({"params": params}, ...)`` is ``nnx.merge(graphdef, params)(...)``: the NNX module is rebuilt
from the static graph definition and the plain parameter dict while tracing, so a jitted train step
stays a pure function of (params, batch, key) and `TrainState`, the optimizer, checkpoints, pmap and
the sharding code (`jaxformer.train`) see plain pytrees. The merge costs Python time when tracing
only, never per compiled step. ``jaxformer.models.build_model(cfg)`` returns this.

Decoding is the same pattern with the KV cache (`jaxformer.nnx.models.DecodeCache`) as a second
pytree: ``apply({"params": p, "cache": c}, ..., decode=True, mutable=["cache"])`` returns
``(output, {"cache": updated c})``, as ``graphdef, params, cache = nnx.split(model, nnx.Param,
nnx.Cache)`` / ``nnx.merge`` would; ``init_cache`` gives the zero cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
from flax import nnx

from jaxformer.config import ModelConfig
from jaxformer.nnx.models import build_model, cache_tree
from jaxformer.nnx.params import boxed_params


class FunctionalModel:
    """``init(rng, *inputs)`` / ``apply(variables, *inputs, deterministic, rngs, method, mutable)``
    of the NNX model of ``cfg``, with the signatures of Flax's functional modules.

    ``init`` returns ``{"params": tree}`` with each parameter boxed as
    `flax.linen.LogicallyPartitioned` (its logical axes), which the trainer's sharding code reads;
    the example inputs are not needed (an NNX model builds its parameters from the config alone).
    Two instances of one config are equal (and hash equal), so jitted functions taking the model
    as a static argument compile once per config.
    """

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self.graphdef = nnx.split(nnx.eval_shape(lambda: build_model(cfg, nnx.Rngs(params=0))))[0]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FunctionalModel) and other.cfg == self.cfg

    def __hash__(self) -> int:
        return hash(self.cfg)

    def init(self, rng: jax.Array, *args, **kwargs) -> dict[str, Any]:
        return {"params": boxed_params(build_model(self.cfg, nnx.Rngs(params=rng)))}

    def init_cache(self, batch_size: int, max_length: int,
                   source_length: int | None = None) -> dict:
        """The zero KV cache (pure dict) of `jaxformer.nnx.models.cache_tree`."""
        return cache_tree(self.cfg, batch_size, max_length, source_length)

    def merge(self, params: Any) -> nnx.Module:
        """The NNX model holding ``params`` (a pure dict; boxed leaves are unboxed)."""
        return nnx.merge(self.graphdef, nn.unbox(params))

    def apply(self, variables: dict, *args, deterministic: bool = True,
              rngs: dict[str, jax.Array] | None = None, method: str | None = None,
              mutable: Sequence[str] = (), **kwargs):
        """The model's ``method`` (default: its call) on ``variables["params"]``; with a
        ``variables["cache"]`` the model holds that KV cache, and ``mutable=["cache"]`` returns
        (output, ``{"cache": the updated cache}``)."""
        model = self.merge(variables["params"])
        if "cache" in variables:
            model.set_cache(variables["cache"])
        fn = model if method is None else getattr(model, method)
        out = fn(*args, deterministic=deterministic, rngs=(rngs or {}).get("dropout"), **kwargs)
        if "cache" not in mutable:
            return out
        return out, {"cache": None if model.cache is None else model.cache.tree()}
