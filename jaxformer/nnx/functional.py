"""An NNX family as the two pure functions the trainer calls: ``init`` and ``apply``.

``apply({"params": params}, ...)`` is ``nnx.merge(graphdef, params)(...)``: the NNX module is rebuilt
from the static graph definition and the plain parameter dict while tracing, so the jitted train
step stays a pure function of (params, batch, key) and `TrainState`, the optimizer, checkpoints,
pmap and the sharding code (`jaxformer.train`) see the same pytrees as with the Linen models. The
merge costs Python time when tracing only, never per compiled step. Selected by
``config.module_api = "nnx"``.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
from flax import nnx

from jaxformer.config import ModelConfig
from jaxformer.nnx.models import build_model
from jaxformer.nnx.params import boxed_params


class FunctionalModel:
    """``init(rng, *inputs)`` / ``apply(variables, *inputs, deterministic, rngs, method)`` of the
    NNX model of ``cfg``, with the Linen modules' signatures.

    ``init`` returns ``{"params": tree}`` with each parameter boxed as
    `flax.linen.LogicallyPartitioned` (its logical axes), as Linen's ``init`` does; the example
    inputs are not needed (an NNX model builds its parameters from the config alone).
    """

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self.graphdef = nnx.split(nnx.eval_shape(lambda: build_model(cfg, nnx.Rngs(params=0))))[0]

    def init(self, rng: jax.Array, *args, **kwargs) -> dict[str, Any]:
        return {"params": boxed_params(build_model(self.cfg, nnx.Rngs(params=rng)))}

    def merge(self, params: Any) -> nnx.Module:
        """The NNX model holding ``params`` (a pure dict; boxed leaves are unboxed)."""
        return nnx.merge(self.graphdef, nn.unbox(params))

    def apply(self, variables: dict, *args, deterministic: bool = True,
              rngs: dict[str, jax.Array] | None = None, method: str | None = None, **kwargs):
        model = self.merge(variables["params"])
        fn = model if method is None else getattr(model, method)
        return fn(*args, deterministic=deterministic, rngs=(rngs or {}).get("dropout"), **kwargs)
