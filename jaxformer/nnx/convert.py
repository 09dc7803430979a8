"""NNX models ↔ the one pure parameter dict (checkpoints, the HF converter, Linen code).

    model = from_params(cfg, params)          # a checkpoint / load_hf / Linen-era params tree → NNX
    params = param_dict(model)                # and back (`jaxformer.nnx.params`)
    linen_model, params = to_linen(model)     # a Linen module (flax.nnx.bridge) on those parameters
    model = build_sharded(cfg, mesh, key)     # initialised straight into the mesh's shardings
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.core
import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx import bridge
from jax.sharding import Mesh

from jaxformer.config import ModelConfig
from jaxformer.nnx.models import MODELS, build_model
from jaxformer.nnx.params import param_dict, param_shardings
from jaxformer.parallel.rules import LOGICAL_AXIS_RULES, Rules


def abstract_model(cfg: ModelConfig) -> nnx.Module:
    """The NNX model of ``cfg`` with `jax.ShapeDtypeStruct` parameters (nothing computed)."""
    return nnx.eval_shape(lambda: build_model(cfg, nnx.Rngs(params=0)))


def _flat(tree) -> dict[str, Any]:
    return {"/".join(str(k.key) for k in path): v
            for path, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def check_params(cfg: ModelConfig, params: Mapping) -> None:
    """ValueError naming the paths when ``params`` is not ``cfg``'s parameter tree."""
    want = _flat(param_dict(abstract_model(cfg)))
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
                      "jaxformer.layers.vocab_padding.fit_vocab")
        raise ValueError(f"parameters do not fit the model: missing {missing[:6]}, unexpected "
                         f"{extra[:6]}, shapes {shapes[:6]}{layout}")


def from_params(cfg: ModelConfig, params: Mapping, **kwargs) -> nnx.Module:
    """The NNX model of ``cfg`` holding ``params`` (the Linen ``params`` collection, boxed or not,
    ``{"params": tree}`` too; a checkpoint's or `jaxformer.convert.load_hf`'s tree).
    ``kwargs`` go to the model (e.g. ``deterministic``)."""
    params = flax.core.meta.unbox(params)
    if set(params) == {"params"}:
        params = params["params"]
    check_params(cfg, params)
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: build_model(cfg, nnx.Rngs(params=0), **kwargs)))
    return nnx.merge(graphdef, jax.tree.map(jnp.asarray, dict(params)))


def linen_model(cfg: ModelConfig) -> nn.Module:
    """The model of ``cfg`` as a Flax Linen module, through flax's own bridge
    (`flax.nnx.bridge.to_linen`), for code written against Linen: ``init(rng, *inputs)`` gives
    ``{"params": tree}`` with the paths of `param_dict` (each leaf boxed in the bridge's metadata,
    ``nn.unbox`` gives the arrays), so checkpoints and params trees of the former hand-written
    Linen modules load unchanged, and ``apply({"params": tree}, *inputs, deterministic=...)`` is
    the NNX model's call. Dropout draws from ``rngs={"dropout": key}``; decoding runs on the NNX
    model (`jaxformer.decode`)."""
    return bridge.to_linen(MODELS[cfg.family], cfg)


def to_linen(model: nnx.Module) -> tuple[nn.Module, dict]:
    """(`linen_model` of the NNX model's config, its parameters): equal outputs."""
    return linen_model(model.cfg), param_dict(model)


def build_sharded(cfg: ModelConfig, mesh: Mesh, key: jax.Array,
                  rules: Rules = LOGICAL_AXIS_RULES) -> nnx.Module:
    """The NNX model initialised by a jit whose outputs are the parameters' mesh shardings (each
    device materialises only its shards), as the trainer initialises Linen parameters."""
    abstract = abstract_model(cfg)
    graphdef, _ = nnx.split(abstract)
    init = jax.jit(lambda k: param_dict(build_model(cfg, nnx.Rngs(params=k))),
                   out_shardings=param_shardings(abstract, mesh, rules))
    return nnx.merge(graphdef, init(key))
