"""Input embeddings (tokens + positions + token types) and the tied/untied output projection."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from jaxformer.config import ModelConfig
from jaxformer.layers.block import ACTIVATION_AXES
from jaxformer.layers.params import ParamSpec, declare, norm_spec
from jaxformer.ops.dropout import dropout
from jaxformer.ops.embedding import attend, check_ids, embed
from jaxformer.ops.norms import normalize
from jaxformer.ops.positions import lookup_positions, relative_position_bias, sinusoidal


def _whole_rows(table, row_axis: str):
    """A `[rows, d_model]` table constrained to whole rows (d_model gathered over the FSDP axis).

    Gathering rows of an FSDP-sharded table would give d_model-sharded activations, which the
    compiler cannot reshard to batch-sharded ones without replicating them first. No-op without a
    mesh.
    """
    return nn.with_logical_constraint(table, (row_axis, None))


class TokenEmbed(nn.Module):
    """The `[vocab, d_model]` token table; `attend` reuses it as the output projection (tied)."""

    cfg: ModelConfig

    def setup(self):
        cfg = self.cfg
        self.params_ = declare(self, {"embedding": ParamSpec(
            (cfg.vocab_size, cfg.d_model), ("vocab", "embed"), "normal", cfg.embed_init_std)},
            jnp.dtype(cfg.param_dtype))

    def __call__(self, ids):
        """`[B, T]` ids → `[B, T, D]` in the compute dtype (NaN rows for out-of-vocabulary ids)."""
        out = embed(_whole_rows(self.params_["embedding"], "vocab"), ids,
                    dtype=jnp.dtype(self.cfg.dtype))
        return nn.with_logical_constraint(out, ACTIVATION_AXES)

    def attend(self, x):
        """`[B, T, D]` → `[B, T, vocab]` logits with the transposed table."""
        return attend(self.params_["embedding"], x)


class InputEmbedding(nn.Module):
    """x = dropout(norm?(scale · E[tokens] + P[positions] + T[token_types])).

    ``scale`` is sqrt(d_model) when ``cfg.scale_embeddings`` (Vaswani §3.4), else 1. Positions are
    sinusoidal (no parameters) or a learned `[max_len, d_model]` table; RoPE and relative positions
    act inside attention instead.
    """

    cfg: ModelConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, token_embeddings, positions, token_types=None):
        cfg = self.cfg
        spec = {}
        if cfg.position == "learned":
            spec["pos_embedding"] = ParamSpec((cfg.max_len, cfg.d_model), ("length", "embed"),
                                              "normal", cfg.embed_init_std)
        if cfg.type_vocab_size:
            spec["type_embedding"] = ParamSpec((cfg.type_vocab_size, cfg.d_model), ("types", "embed"),
                                               "normal", cfg.embed_init_std)
        if cfg.embedding_norm:
            spec["norm"] = norm_spec(cfg)
        p = declare(self, spec, jnp.dtype(cfg.param_dtype))
        x = token_embeddings
        if cfg.scale_embeddings:
            x = x * jnp.sqrt(jnp.asarray(cfg.d_model, x.dtype))
        if cfg.position == "learned":
            check_ids(positions, cfg.max_len, "positions", f"the learned table [0, model.max_len="
                      f"{cfg.max_len})", "use shorter rows or a larger model.max_len")
            x = x + lookup_positions(_whole_rows(p["pos_embedding"], "length"), positions).astype(x.dtype)
        elif cfg.position == "sinusoidal":
            x = x + sinusoidal(positions, cfg.d_model, dtype=x.dtype)
        if cfg.type_vocab_size:
            types = jnp.zeros_like(positions) if token_types is None else token_types
            check_ids(types, cfg.type_vocab_size, "token_types",
                      f"[0, model.type_vocab_size={cfg.type_vocab_size})",
                      "segment A is 0, segment B 1")
            x = x + embed(_whole_rows(p["type_embedding"], "types"), types, dtype=x.dtype)
        if cfg.embedding_norm:
            x = normalize(cfg.norm, x, p["norm"], eps=cfg.norm_eps)
        rng = None if self.deterministic or cfg.dropout_rate == 0 else self.make_rng("dropout")
        return nn.with_logical_constraint(dropout(x, cfg.dropout_rate, rng), ACTIVATION_AXES)


class FinalNorm(nn.Module):
    """The norm after the last pre-LN block."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x):
        p = declare(self, norm_spec(self.cfg), jnp.dtype(self.cfg.param_dtype))
        return normalize(self.cfg.norm, x, p, eps=self.cfg.norm_eps)


class RelativeBias(nn.Module):
    """T5's learned `[buckets, heads]` table; one per stack, shared by its layers."""

    cfg: ModelConfig
    bidirectional: bool

    @nn.compact
    def __call__(self, q_positions, kv_positions):
        cfg = self.cfg
        p = declare(self, {"embedding": ParamSpec((cfg.relative_num_buckets, cfg.num_heads),
                                                  ("relpos", "heads"), "normal", cfg.embed_init_std)},
                    jnp.dtype(cfg.param_dtype))
        return relative_position_bias(p["embedding"], q_positions, kv_positions,
                                      bidirectional=self.bidirectional,
                                      max_distance=cfg.relative_max_distance).astype(cfg.dtype)
