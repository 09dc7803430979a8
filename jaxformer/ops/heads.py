"""Output heads as pure functions of their parameter dicts (laid out by `jaxformer.models.spec`).

* `lm_logits`: tied (logits = h·Eᵀ, Press & Wolf 2017; T5 first scales h by d_model^-0.5) or an
  untied `[d_model, vocab]` kernel, plus an optional vocabulary bias; the columns of a padded
  vocabulary masked (`mask_padded_vocab`).
* `mlm_logits`: BERT's masked-LM head (Devlin et al. 2019): dense → activation → norm, then
  `lm_logits` with the parameters under ``"decoder"``.
* `lm_head_inputs` / `mlm_head_inputs`: what those heads' output projection reads (`HeadInputs`),
  for a loss that never forms the `[B, L, V]` logits (`jaxformer.ops.losses.blockwise_cross_entropy`).
* `pool` / `pooled`: one `[B, D]` vector per sequence, BERT's dense+tanh pooler (DistilBERT's
  dense+relu) optional.
* `classify`: dropout → dense, for sequence, token and next-sentence classification;
  ModernBERT's `transform` comes first there too (``cfg.prediction_head``, applied by the model).
* `span_logits`: extractive QA's start/end logits (BERT on SQuAD, Devlin et al. 2019 §4.2).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxformer.ops.activations import get_activation
from jaxformer.ops.dense import dense
from jaxformer.ops.dropout import dropout
from jaxformer.ops.embedding import attend
from jaxformer.ops.model_fields import ModelFields
from jaxformer.ops.norms import normalize

Array = jnp.ndarray


class HeadInputs(NamedTuple):
    """The output projection's operands: logits = ``h`` · ``w``ᵀ + ``bias``, of which the first
    ``cfg.vocab_size`` columns are real (the rest a padded vocabulary).

    Attributes:
      h: `[B, L, D]` compute dtype: the last hidden states after the head's own transform (BERT's
        dense → activation → norm; T5's d_model^-0.5 rescale of tied logits).
      w: `[V', D]` the token table (tied) or the untied kernel's transpose, as stored.
      bias: `[V']` or None.
    """

    h: Array
    w: Array
    bias: Array | None


def lm_head_inputs(params: dict, x: Array, table: Array, *, cfg: ModelFields) -> HeadInputs:
    """`lm_logits`'s operands (`HeadInputs`) for `[B, L, D]` hidden states ``x``."""
    if not cfg.tie_embeddings:
        return HeadInputs(x, params["kernel"].T, params.get("bias"))
    if cfg.rescale_tied_logits:
        x = x * (cfg.d_model ** -0.5)
    return HeadInputs(x, table, params["bias"] if cfg.lm_head_bias else None)


def lm_logits(params: dict, x: Array, table: Array, *, cfg: ModelFields) -> Array:
    """`[B, L, D]` → `[B, L, vocab]`. Tied: the token table ``table`` `[vocab, D]` (``params`` holds
    at most a ``bias`` `[vocab]`); untied: ``params`` is a dense ``kernel`` `[D, vocab]` (+ bias).
    Tables with more rows than ``cfg.vocab_size`` (a padded vocabulary) give logits whose padding
    columns are masked (`mask_padded_vocab`)."""
    if not cfg.tie_embeddings:
        return mask_padded_vocab(dense(params, x), cfg.vocab_size)
    h, w, bias = lm_head_inputs(params, x, table, cfg=cfg)
    logits = attend(w, h)
    if bias is not None:
        logits = logits + bias.astype(logits.dtype)
    return mask_padded_vocab(logits, cfg.vocab_size)


def mask_padded_vocab(logits: Array, vocab_size: int) -> Array:
    """`[..., V']` logits of a vocabulary padded from ``vocab_size`` to V' rows (Megatron's
    make-vocab-size-divisible-by) with the padding columns at the dtype's lowest finite value:
    they get probability exactly 0 (exp underflows), never win an argmax or a top-k, receive zero
    gradient, and stay finite (a product with a zero probability is 0, not NaN). Elementwise, so
    a ``vocab``-sharded array stays sharded. Unchanged (the same program) when V' = vocab_size."""
    padded = logits.shape[-1]
    if padded == vocab_size:
        return logits
    if padded < vocab_size:
        raise ValueError(f"logits have {padded} columns, fewer than vocab_size={vocab_size}")
    real = jnp.arange(padded) < vocab_size
    return jnp.where(real, logits, jnp.finfo(logits.dtype).min)


def mlm_logits(params: dict, x: Array, table: Array, *, cfg: ModelFields) -> Array:
    """BERT's MLM head: ``dense`` → activation → ``norm`` (when ``cfg.mlm_transform``), then
    `lm_logits` with ``params.get("decoder", {})``. `[B, L, D]` → `[B, L, vocab]`."""
    return lm_logits(params.get("decoder", {}), _mlm_transform(params, x, cfg), table, cfg=cfg)


def mlm_head_inputs(params: dict, x: Array, table: Array, *, cfg: ModelFields) -> HeadInputs:
    """`mlm_logits`'s operands (`HeadInputs`) for `[B, L, D]` hidden states ``x``."""
    return lm_head_inputs(params.get("decoder", {}), _mlm_transform(params, x, cfg), table, cfg=cfg)


def _mlm_transform(params: dict, x: Array, cfg: ModelFields) -> Array:
    """BERT's `transform` (when ``cfg.mlm_transform``): `[B, L, D]` → `[B, L, D]`."""
    return transform(params, x, cfg=cfg) if cfg.mlm_transform else x


def transform(params: dict, x: Array, *, cfg: ModelFields) -> Array:
    """dense → activation → norm on `[..., D]`: BERT's MLM transform, ModernBERT's prediction head
    (its MLM head's, and before its classifiers)."""
    x = get_activation(cfg.activation)(dense(params["dense"], x))
    return normalize(cfg.norm, x, params["norm"], eps=cfg.norm_eps)


def pool(x: Array, segment_ids: Array | None, how: str) -> Array:
    """`[B, L, D]` → `[B, D]`: the first token, the last non-padding token, or the masked mean or
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


def pooled(params: dict, x: Array, segment_ids: Array | None, *, cfg: ModelFields) -> Array:
    """`[B, L, D]` → `[B, D]`: `pool` by ``cfg.pooling``, then, if ``cfg.pooler``, BERT's
    tanh(dense) (``cfg.pooler_activation``: DistilBERT's pre_classifier is relu(dense))."""
    h = pool(x, segment_ids, cfg.pooling)
    return get_activation(cfg.pooler_activation)(dense(params, h)) if cfg.pooler else h


def classify(params: dict, h: Array, *, cfg: ModelFields,
             dropout_rng: jax.Array | None = None) -> Array:
    """dropout (``cfg.dropout_rate``, when ``dropout_rng`` is given) → dense:
    `[..., D]` → `[..., classes]`."""
    return dense(params, dropout(h, cfg.dropout_rate, dropout_rng))


def span_logits(params: dict, x: Array) -> Array:
    """Extractive question answering (Devlin et al. 2019 §4.2): a dense ``[D, 2]`` on every token,
    `[B, L, D]` → `[B, L, 2]`, returned as `[B, 2, L]`: row 0 the start logits, row 1 the end
    logits (HF ``BertForQuestionAnswering``'s ``qa_outputs``). Laid out so that a cross-entropy
    over the last axis with targets ``[B, 2] = (start, end)`` is the mean of the start and end
    losses, as in BERT."""
    return jnp.swapaxes(dense(params, x), -1, -2)
