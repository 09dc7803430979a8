"""Model inputs as pure functions: token lookup, and the sum of token, position and type embeddings.

Parameters are plain dicts laid out by `jaxformer.models.spec` (``token_embed_spec``,
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
from jaxformer.ops.model_fields import ModelFields
from jaxformer.ops.norms import normalize
from jaxformer.ops.positions import lookup_positions, sinusoidal

Array = jnp.ndarray


def _no_constraint(x: Array, _names) -> Array:
    return x


def _whole_rows(table: Array, axes: tuple[str, str], constrain: Constrain) -> Array:
    """A `[rows, d_model]` table stored with logical ``axes`` (rows, columns), constrained to
    whole rows (d_model gathered over the FSDP axis); its gradient keeps the stored ``axes``.

    Gathering rows of an FSDP-sharded table would give d_model-sharded activations, which the
    compiler cannot reshard to batch-sharded ones without replicating them first.
    """
    return _gathered(table, axes, constrain)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _gathered(table: Array, axes: tuple[str, str], constrain: Constrain) -> Array:
    """``constrain(table, (axes[0], None))`` whose gradient is constrained to ``axes``, the
    table's own sharding. A plain sharding constraint's transpose pins the cotangent to the
    forward's sharding, whole rows on every FSDP shard: the scatter-add of a batch-sharded
    lookup's gradient is then summed over the batch shards into a full `[rows, d_model]` array
    before each device keeps its columns (on a TPU, a float32 reduce-scatter of the whole table,
    V·D·4 bytes; `tests/test_compile.py`). In the table's sharding, the compiler sends the
    `[B, L, D]` row updates to the devices holding their columns instead (an all-to-all, B·L·D)."""
    return constrain(table, (axes[0], None))


def _gathered_fwd(table: Array, axes: tuple[str, str], constrain: Constrain):
    return constrain(table, (axes[0], None)), None


def _gathered_bwd(axes: tuple[str, str], constrain: Constrain, _, g: Array):
    return (constrain(g, axes),)


_gathered.defvjp(_gathered_fwd, _gathered_bwd)


def embed_tokens(table: Array, ids: Array, *, dtype, constrain: Constrain | None = None,
                 columns: str = "embed") -> Array:
    """Rows of the `[vocab, d_model]` token table at `[B, L]` ids → `[B, L, D]` in ``dtype`` (NaN rows
    for out-of-vocabulary ids, see `jaxformer.ops.embedding.embed`). ``columns``: the logical axis
    of the table's columns (its gradient's sharding, `_gathered`). A float32 table looked up for
    a narrower compute ``dtype`` is cast before it is gathered (`_cast_lookup`)."""
    pin, dtype, axes = constrain or _no_constraint, jnp.dtype(dtype), ("vocab", columns)
    if dtype != table.dtype and jnp.issubdtype(dtype, jnp.floating):
        return pin(_cast_lookup(table, ids, dtype, axes, pin), ACTIVATION_AXES)
    rows = _whole_rows(table, axes, pin)
    return pin(embed(rows, ids, dtype=dtype), ACTIVATION_AXES)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _cast_lookup(table: Array, ids: Array, dtype, axes: tuple[str, str],
                 constrain: Constrain) -> Array:
    """`embed` of ``table`` cast to ``dtype`` first: whole rows of the *cast* table are gathered
    over the FSDP axis, so mixed precision moves the table once, in ``dtype`` — the same cast the
    tied LM head (`jaxformer.ops.embedding.attend`) gathers — not a second time in float32 (a
    GPT-2-small step on 8 H100s gathered its 147 MiB float32 table besides the bfloat16 one).
    Casting commutes with taking rows, so the values are unchanged. The gradient is the
    scatter-add of the row cotangents in the table's own dtype (float32: repeated tokens are not
    summed in bfloat16), in the table's stored sharding ``axes`` (`_gathered`'s reason)."""
    return embed(constrain(table.astype(dtype), (axes[0], None)), ids)


def _cast_lookup_fwd(table: Array, ids: Array, dtype, axes, constrain):
    return _cast_lookup(table, ids, dtype, axes, constrain), (table, ids)


def _cast_lookup_bwd(dtype, axes, constrain, residuals, g: Array):
    table, ids = residuals
    ids = jnp.where(ids < 0, table.shape[0], ids)  # as `take_rows`: no wrap-around, dropped
    grad = jnp.zeros(table.shape, table.dtype).at[ids].add(g.astype(table.dtype), mode="drop")
    return constrain(grad, axes), None


_cast_lookup.defvjp(_cast_lookup_fwd, _cast_lookup_bwd)


def embed_inputs(params: dict, token_embeddings: Array, positions: Array,
                 token_types: Array | None = None, *, cfg: ModelFields,
                 dropout_rng: jax.Array | None = None, constrain: Constrain | None = None,
                 columns: str = "embed") -> Array:
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
      columns: the logical axis of the tables' columns (``embed``, or ALBERT's E axis).
    """
    pin = constrain or _no_constraint
    x = token_embeddings
    if cfg.scale_embeddings:
        x = x * jnp.sqrt(jnp.asarray(cfg.d_model, x.dtype))
    if cfg.position == "learned":
        check_ids(positions, cfg.max_len, "positions", f"the learned table [0, model.max_len="
                  f"{cfg.max_len})", "use shorter rows or a larger model.max_len")
        table = _whole_rows(params["pos_embedding"], ("length", columns), pin)
        x = x + lookup_positions(table, positions + cfg.position_offset).astype(x.dtype)
    elif cfg.position == "sinusoidal":
        x = x + sinusoidal(positions, x.shape[-1], dtype=x.dtype)
    if cfg.type_vocab_size:
        types = jnp.zeros_like(positions) if token_types is None else token_types
        check_ids(types, cfg.type_vocab_size, "token_types",
                  f"[0, model.type_vocab_size={cfg.type_vocab_size})", "segment A is 0, segment B 1")
        x = x + embed(_whole_rows(params["type_embedding"], ("types", columns), pin), types,
                      dtype=x.dtype)
    if cfg.embedding_norm:
        x = normalize(cfg.norm, x, params["norm"], eps=cfg.norm_eps)
    x = dropout(x, cfg.dropout_rate, dropout_rng)
    if "projection" in params:
        x = dense(params["projection"], pin(x, ACTIVATION_AXES))
    return pin(x, ACTIVATION_AXES)
