"""Output heads: LM (tied or untied), BERT MLM, sequence and token classification, NSP."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from jaxformer.config import ModelConfig
from jaxformer.layers.params import ParamSpec, declare, norm_spec
from jaxformer.ops.activations import get_activation
from jaxformer.ops.dense import dense
from jaxformer.ops.dropout import dropout
from jaxformer.ops.norms import normalize


def _dense_spec(cfg: ModelConfig, d_in: int, d_out: int, axes, bias: bool) -> dict:
    out = {"kernel": ParamSpec((d_in, d_out), axes, "normal", cfg.init_std)}
    if bias:
        out["bias"] = ParamSpec((d_out,), axes[1:], "zeros")
    return out


def pool(x, segment_ids, how: str):
    """`[B, T, D]` → `[B, D]`: the first token, the last non-padding token, or the masked mean or
    per-feature max over the non-padding tokens (max-over-time, Collobert et al. 2011; Kim 2014;
    an all-padding row gives zeros)."""
    if how == "first":
        return x[:, 0]
    valid = jnp.ones(x.shape[:2], bool) if segment_ids is None else segment_ids != 0
    if how == "last":
        last = jnp.maximum(jnp.sum(valid, axis=1) - 1, 0)
        return jnp.take_along_axis(x, last[:, None, None], axis=1)[:, 0]
    if how == "max":
        low = jnp.finfo(x.dtype).min
        m = jnp.max(jnp.where(valid[..., None], x, low), axis=1)
        return jnp.where(jnp.any(valid, axis=1)[:, None], m, 0)
    w = valid.astype(x.dtype)[..., None]
    return jnp.sum(x * w, axis=1) / jnp.maximum(jnp.sum(w, axis=1), 1.0)


class LMHead(nn.Module):
    """`[B, T, D]` → `[B, T, vocab]`: tied (E·h, optionally h·d^-0.5 first, as T5) or a kernel."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x, token_embed):
        cfg = self.cfg
        if cfg.tie_embeddings:
            if cfg.rescale_tied_logits:
                x = x * (cfg.d_model ** -0.5)
            logits = token_embed.attend(x)
            if cfg.lm_head_bias:
                p = declare(self, {"bias": ParamSpec((cfg.vocab_size,), ("vocab",), "zeros")},
                            jnp.dtype(cfg.param_dtype))
                logits = logits + p["bias"].astype(logits.dtype)
            return logits
        p = declare(self, _dense_spec(cfg, cfg.d_model, cfg.vocab_size, ("embed", "vocab"),
                                      cfg.lm_head_bias), jnp.dtype(cfg.param_dtype))
        return dense(p, x)


class MLMHead(nn.Module):
    """BERT's masked-LM head: dense → activation → LayerNorm (``mlm_transform``), then the LM head."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x, token_embed):
        cfg = self.cfg
        if cfg.mlm_transform:
            spec = {"dense": _dense_spec(cfg, cfg.d_model, cfg.d_model, ("embed", "mlp"), True),
                    "norm": norm_spec(cfg)}
            p = declare(self, spec, jnp.dtype(cfg.param_dtype))
            x = get_activation(cfg.activation)(dense(p["dense"], x))
            x = normalize(cfg.norm, x, p["norm"], eps=cfg.norm_eps)
        return LMHead(cfg, name="decoder")(x, token_embed)


class Pooler(nn.Module):
    """`[B, T, D]` → `[B, D]`: `pool` by ``cfg.pooling``, then BERT's dense+tanh if ``cfg.pooler``."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x, segment_ids=None):
        cfg = self.cfg
        h = pool(x, segment_ids, cfg.pooling)
        if not cfg.pooler:
            return h
        p = declare(self, _dense_spec(cfg, cfg.d_model, cfg.d_model, ("embed", "mlp"), True),
                    jnp.dtype(cfg.param_dtype))
        return jnp.tanh(dense(p, h))


class ClassifierHead(nn.Module):
    """dropout → dense: `[..., D]` → `[..., num_outputs]` (sequence, token or NSP classification)."""

    cfg: ModelConfig
    num_outputs: int
    deterministic: bool = True

    @nn.compact
    def __call__(self, h):
        cfg = self.cfg
        p = declare(self, _dense_spec(cfg, cfg.d_model, self.num_outputs, ("embed", "classes"), True),
                    jnp.dtype(cfg.param_dtype))
        rng = None if self.deterministic or cfg.dropout_rate == 0 else self.make_rng("dropout")
        return dense(p, dropout(h, cfg.dropout_rate, rng))
