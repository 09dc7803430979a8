"""Model inputs as pure functions: token lookup, and the sum of token, position and type embeddings.

Parameters are plain dicts laid out by `jaxformer.layers.params` (``token_embed_spec``,
``input_embedding_spec``); the models call these functions. ``constrain(x,
names)`` is the optional sharding hook of `jaxformer.ops.blocks` (logical axis names).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxformer.ops.blocks import ACTIVATION_AXES, Constrain
from jaxformer.ops.dense import dense
from jaxformer.ops.dropout import dropout
from jaxformer.ops.embedding import check_ids, embed
from jaxformer.ops.norms import normalize
from jaxformer.ops.positions import lookup_positions, sinusoidal
from jaxformer.ops.settings import ModelSettings

Array = jnp.ndarray


def _no_constraint(x: Array, _names) -> Array:
    return x


def _whole_rows(table: Array, row_axis: str, constrain: Constrain) -> Array:
    """A `[rows, d_model]` table constrained to whole rows (d_model gathered over the FSDP axis).

    Gathering rows of an FSDP-sharded table would give d_model-sharded activations, which the
    compiler cannot reshard to batch-sharded ones without replicating them first. Only the
    forward is pinned (`_gathered`): the lookup's gradient is left to the compiler.
    """
    return _gathered(table, (row_axis, None), constrain)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _gathered(table: Array, names: tuple, constrain: Constrain) -> Array:
    """``constrain(table, names)`` whose gradient is not constrained. A sharding constraint's
    transpose pins the cotangent to the same sharding, here whole rows on every FSDP shard: the
    scatter-add of a batch-sharded lookup's gradient then has to be summed over the batch shards
    into a full `[rows, d_model]` array before each device keeps its shard (on a TPU, a float32
    reduce-scatter of the whole table, V·D·4 bytes). Unpinned, the compiler routes the `[B, L, D]`
    row updates to the devices holding their columns (an all-to-all, B·L·D) and scatters locally."""
    return constrain(table, names)


def _gathered_fwd(table: Array, names: tuple, constrain: Constrain):
    return constrain(table, names), None


def _gathered_bwd(names: tuple, constrain: Constrain, _, g: Array):
    return (g,)


_gathered.defvjp(_gathered_fwd, _gathered_bwd)


def embed_tokens(table: Array, ids: Array, *, dtype, constrain: Constrain | None = None) -> Array:
    """Rows of the `[vocab, d_model]` token table at `[B, L]` ids → `[B, L, D]` in ``dtype`` (NaN rows
    for out-of-vocabulary ids, see `jaxformer.ops.embedding.embed`)."""
    pin = constrain or _no_constraint
    return pin(embed(_whole_rows(table, "vocab", pin), ids, dtype=jnp.dtype(dtype)), ACTIVATION_AXES)


def embed_inputs(params: dict, token_embeddings: Array, positions: Array,
                 token_types: Array | None = None, *, cfg: ModelSettings,
                 dropout_rng: jax.Array | None = None, constrain: Constrain | None = None) -> Array:
    """x = proj?(dropout(norm?(scale · E[tokens] + P[positions] + T[token_types]))), `[B, L, D]`.

    ``scale`` is sqrt(d_model) when ``cfg.scale_embeddings`` (Vaswani et al. 2017 §3.4), else 1.
    Positions are sinusoidal (§3.5; no parameters) or a learned `[max_len + offset, d_model]` table
    (``params["pos_embedding"]``, BERT/GPT-2; position ``p`` reads row ``p + cfg.position_offset``,
    as RoBERTa and BART keep rows before position 0); RoPE and relative positions act inside
    attention instead. Token types `[B, L]` (BERT segments A/B, default 0) read
    ``params["type_embedding"]``; ``params["norm"]`` is BERT's embedding LayerNorm. With
    ``cfg.embedding_size`` (ALBERT's factorised embedding, Lan et al. 2019 §3.1) the tables and the
    norm are E wide and ``params["projection"]`` (`[E, D]` kernel + bias) maps the result to
    d_model.

    Args:
      token_embeddings: `[B, L, E]` (see `embed_tokens`; E = d_model unless factorised).
      positions: `[B, L]` int32.
      dropout_rng: enables dropout at ``cfg.dropout_rate`` when given.
    """
    pin = constrain or _no_constraint
    x = token_embeddings
    if cfg.scale_embeddings:
        x = x * jnp.sqrt(jnp.asarray(cfg.d_model, x.dtype))
    if cfg.position == "learned":
        check_ids(positions, cfg.max_len, "positions", f"the learned table [0, model.max_len="
                  f"{cfg.max_len})", "use shorter rows or a larger model.max_len")
        table = _whole_rows(params["pos_embedding"], "length", pin)
        x = x + lookup_positions(table, positions + cfg.position_offset).astype(x.dtype)
    elif cfg.position == "sinusoidal":
        x = x + sinusoidal(positions, x.shape[-1], dtype=x.dtype)
    if cfg.type_vocab_size:
        types = jnp.zeros_like(positions) if token_types is None else token_types
        check_ids(types, cfg.type_vocab_size, "token_types",
                  f"[0, model.type_vocab_size={cfg.type_vocab_size})", "segment A is 0, segment B 1")
        x = x + embed(_whole_rows(params["type_embedding"], "types", pin), types, dtype=x.dtype)
    if cfg.embedding_norm:
        x = normalize(cfg.norm, x, params["norm"], eps=cfg.norm_eps)
    x = dropout(x, cfg.dropout_rate, dropout_rng)
    if "projection" in params:
        x = dense(params["projection"], pin(x, ACTIVATION_AXES))
    return pin(x, ACTIVATION_AXES)
