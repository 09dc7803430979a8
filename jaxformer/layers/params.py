"""Parameter specifications: shapes, logical axis names and initialisers, in one table.

A spec is a nested dict whose leaves are `ParamSpec`. The same spec

* initialises a plain pytree without any module system (`init_params`), for users of the pure
  functions in `jaxformer.ops.blocks`, and
* declares the parameters of a Flax module (`declare`), each wrapped with
  `nn.with_logical_partitioning` so a mesh can shard it by rules (`jaxformer.parallel`).

Logical axis names used across the library: ``vocab``, ``embed`` (d_model), ``heads``, ``kv_heads``,
``kv`` (head_dim), ``mlp`` (d_ff), ``classes``, ``relpos`` (relative buckets), ``length``
(learned positions), ``types``; ``layers`` is prepended by scanned stacks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxformer.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    shape: tuple[int, ...]
    axes: tuple[str | None, ...]
    init: str = "normal"  # "normal" | "zeros" | "ones"
    std: float = 0.02

    def initializer(self):
        if self.init == "normal":
            return nn.initializers.normal(self.std)
        if self.init == "zeros":
            return nn.initializers.zeros_init()
        if self.init == "ones":
            return nn.initializers.ones_init()
        raise ValueError(f"unknown initializer {self.init!r}")


def _dense(cfg: ModelConfig, shape, axes, bias_shape, bias_axes, *, bias: bool | None = None) -> dict:
    out = {"kernel": ParamSpec(tuple(shape), tuple(axes), "normal", cfg.init_std)}
    if cfg.use_bias if bias is None else bias:
        out["bias"] = ParamSpec(tuple(bias_shape), tuple(bias_axes), "zeros")
    return out


def norm_spec(cfg: ModelConfig) -> dict:
    out = {"scale": ParamSpec((cfg.d_model,), ("embed",), "ones")}
    if cfg.norm == "layer" and cfg.norm_bias:
        out["bias"] = ParamSpec((cfg.d_model,), ("embed",), "zeros")
    return out


def attention_spec(cfg: ModelConfig) -> dict:
    d, h, k, dh = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    return {
        "query": _dense(cfg, (d, h, dh), ("embed", "heads", "kv"), (h, dh), ("heads", "kv")),
        "key": _dense(cfg, (d, k, dh), ("embed", "kv_heads", "kv"), (k, dh), ("kv_heads", "kv")),
        "value": _dense(cfg, (d, k, dh), ("embed", "kv_heads", "kv"), (k, dh), ("kv_heads", "kv")),
        "out": _dense(cfg, (h, dh, d), ("heads", "kv", "embed"), (d,), ("embed",)),
    }


def ffn_spec(cfg: ModelConfig) -> dict:
    d, f = cfg.d_model, cfg.d_ff
    out = {"wi": _dense(cfg, (d, f), ("embed", "mlp"), (f,), ("mlp",))}
    if cfg.gated_ffn:
        out["wi_gate"] = _dense(cfg, (d, f), ("embed", "mlp"), (f,), ("mlp",))
    out["wo"] = _dense(cfg, (f, d), ("mlp", "embed"), (d,), ("embed",))
    return out


def block_spec(cfg: ModelConfig, *, cross_attention: bool = False) -> dict:
    """Spec of one `jaxformer.ops.blocks.transformer_block`."""
    spec = {"self_attn": attention_spec(cfg), "self_attn_norm": norm_spec(cfg)}
    if cross_attention:
        spec["cross_attn"] = attention_spec(cfg)
        spec["cross_attn_norm"] = norm_spec(cfg)
    spec["ffn"] = ffn_spec(cfg)
    spec["ffn_norm"] = norm_spec(cfg)
    return spec


def init_params(rng: jax.Array, spec: Mapping, dtype=jnp.float32) -> dict:
    """Initialise a plain pytree from a spec (no Flax), e.g. ``init_params(key, block_spec(cfg))``."""
    leaves, treedef = jax.tree_util.tree_flatten(spec, is_leaf=lambda x: isinstance(x, ParamSpec))
    keys = jax.random.split(rng, len(leaves))
    values = [s.initializer()(k, s.shape, dtype) for s, k in zip(leaves, keys)]
    return jax.tree_util.tree_unflatten(treedef, values)


class ParamTree(nn.Module):
    """Declares a nested spec as parameters; returns them as a nested dict of arrays."""

    spec: Mapping
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self) -> dict:
        return declare(self, self.spec, self.param_dtype)


def declare(module: nn.Module, spec: Mapping, param_dtype=jnp.float32) -> dict:
    """Inside a compact ``module``: a param per leaf, a child `ParamTree` per nested dict."""
    out = {}
    for name, s in spec.items():
        if isinstance(s, ParamSpec):
            init = nn.with_logical_partitioning(s.initializer(), s.axes)
            out[name] = module.param(name, init, s.shape, param_dtype)
        else:
            out[name] = ParamTree(s, param_dtype, name=name)()
    return out
