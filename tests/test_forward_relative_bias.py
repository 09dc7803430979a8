"""T5's relative bias shared over the batch (`jaxformer.models.forward.in_row_index`): a non-decoding
call computes one `[1, H, L, L]` bias from the in-row indices instead of a `[B, H, L, L]` bias per
row from the positions. Checked against the per-row definition through an invariant that does not
use the shortcut's assumption: every document of a packed batch — packed after others, left-padded,
at an offset prefix position — gives the logits and (summed) gradients of the same document run
alone at positions ``0..n-1``, where both paths coincide; float32, all parameters including both
bias tables. Decoding with a cache keeps the per-row bias (tests/test_decode.py
``test_cached_steps_match_full_forward`` compares it with this full forward)."""

from __future__ import annotations

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.config import ModelConfig
from jaxformer.models import build_model
from jaxformer.models.forward import relative_bias
from jaxformer.models.presets import preset
from jaxformer.ops.positions import relative_position_bias

VOCAB = 64
# Row 0: two documents then padding; row 1: left padding, then one document whose positions start
# at an offset (a prefix). (start, length, first position) of each document, inputs and targets.
INPUT_DOCS = [[(0, 6, 0), (6, 7, 0)], [(4, 12, 3)]]
TARGET_DOCS = [[(0, 5, 0), (5, 4, 0)], [(2, 9, 5)]]
L_IN, L_TG = 16, 12


def _cfg():
    cfg = ModelConfig.from_dict(preset("t5_tiny", vocab_size=VOCAB, num_layers=1, dropout_rate=0.0,
                                       attention_dropout_rate=0.0, ffn_dropout_rate=0.0))
    assert cfg.position == "relative" and cfg.dtype == "float32"
    return cfg


def _model():
    return build_model(_cfg())


def _layout(docs, length):
    """Segment ids and positions `[B, length]` of ``docs`` (id 0 and position 0 on padding)."""
    seg, pos = np.zeros((len(docs), length), np.int32), np.zeros((len(docs), length), np.int32)
    for r, row in enumerate(docs):
        for s, (start, n, first) in enumerate(row, 1):
            seg[r, start:start + n], pos[r, start:start + n] = s, first + np.arange(n)
    return seg, pos


@pytest.mark.parametrize("causal", [False, True])
def test_shared_bias_is_the_per_row_bias_on_every_visible_pair(causal):
    """The definition, per row from the positions (`relative_position_bias`), against the shared
    `[1, H, L, L]` bias on every pair the masks let through: packed documents restarting at 0, left
    padding, an offset first position; distances up to 15 reach the logarithmic buckets."""
    cfg = _cfg()
    table = jax.random.normal(jax.random.key(0), (cfg.relative_num_buckets, cfg.num_heads))
    seg, pos = _layout(INPUT_DOCS, L_IN)
    shared = relative_bias(cfg, table, jnp.asarray(pos), causal=causal)
    assert shared.shape == (1, cfg.num_heads, L_IN, L_IN)
    per_row = relative_position_bias(table, pos, pos, bidirectional=not causal,
                                     max_distance=cfg.relative_max_distance)
    visible = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] > 0)
    if causal:
        visible &= np.tril(np.ones((L_IN, L_IN), bool))
    diff = np.where(visible[:, None], np.asarray(shared) - np.asarray(per_row), 0.0)
    np.testing.assert_array_equal(diff, 0.0)
    # decoding: queries at their positions against cache slots keep the per-row bias
    kv_pos = np.broadcast_to(np.arange(L_IN), pos.shape)
    np.testing.assert_array_equal(
        relative_bias(cfg, table, jnp.asarray(pos[:, -1:]), jnp.asarray(kv_pos), causal=causal),
        relative_position_bias(table, pos[:, -1:], kv_pos, bidirectional=not causal,
                               max_distance=cfg.relative_max_distance))


def _loss(model, params, inputs, targets, weights, **segments_and_positions):
    """Σ weights · logits over the non-padding targets, and the logits."""
    logits = model.apply(params, inputs, targets, **segments_and_positions)
    keep = segments_and_positions["targets_segment_ids"][..., None] > 0
    return jnp.sum(jnp.where(keep, logits * weights, 0.0)), logits


def test_packed_padded_and_offset_documents_equal_each_document_alone():
    model = _model()
    rng = np.random.default_rng(0)
    inputs = rng.integers(7, VOCAB, (2, L_IN)).astype(np.int32)
    targets = rng.integers(7, VOCAB, (2, L_TG)).astype(np.int32)
    in_seg, in_pos = _layout(INPUT_DOCS, L_IN)
    tg_seg, tg_pos = _layout(TARGET_DOCS, L_TG)
    weights = rng.normal(size=(2, L_TG, VOCAB)).astype(np.float32)
    params = model.init(jax.random.key(1))
    grad = jax.jit(jax.value_and_grad(lambda p, *a, **k: _loss(model, p, *a, **k), has_aux=True))
    (_, logits), grads = grad(params, inputs, targets, weights, inputs_positions=in_pos,
                              inputs_segment_ids=in_seg, targets_positions=tg_pos,
                              targets_segment_ids=tg_seg)

    # Each document alone in a row of its own, from position 0, right-padded: positions = in-row
    # indices, so the per-row and the shared bias are the same there.
    docs = [(r, d, t) for r in range(2) for d, t in zip(INPUT_DOCS[r], TARGET_DOCS[r])]
    ni, nt = max(d[1] for _, d, _ in docs), max(t[1] for _, _, t in docs)
    x, y = np.zeros((len(docs), ni), np.int32), np.zeros((len(docs), nt), np.int32)
    x_seg, y_seg = np.zeros_like(x), np.zeros_like(y)
    w = np.zeros((len(docs), nt, VOCAB), np.float32)
    for k, (r, (i0, n, _), (t0, m, _)) in enumerate(docs):
        x[k, :n], x_seg[k, :n] = inputs[r, i0:i0 + n], 1
        y[k, :m], y_seg[k, :m], w[k, :m] = targets[r, t0:t0 + m], 1, weights[r, t0:t0 + m]
    (_, want), want_grads = grad(params, x, y, w, inputs_segment_ids=x_seg,
                                 targets_segment_ids=y_seg)
    for k, (r, _, (t0, m, _)) in enumerate(docs):
        np.testing.assert_allclose(logits[r, t0:t0 + m], want[k, :m], rtol=1e-5, atol=1e-5)
    flat = jax.tree_util.tree_leaves_with_path(grads)
    names = [jax.tree_util.keystr(k) for k, _ in flat]
    assert sum("relative_bias" in n for n in names) == 2, names  # encoder's and decoder's tables
    for (path, got), want in zip(flat, jax.tree.leaves(want_grads)):
        scale = float(np.abs(want).max()) or 1.0
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * scale,
                                   err_msg=jax.tree_util.keystr(path))


def _gathers(jaxpr, table_shape):
    """Output shapes of every gather from an operand of ``table_shape`` in ``jaxpr`` (nested)."""
    out = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "gather" and tuple(eqn.invars[0].aval.shape) == table_shape:
            out.append(tuple(eqn.outvars[0].aval.shape))
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            out += _gathers(sub, table_shape)
    return out


def test_training_forward_gathers_the_bias_table_once_for_the_batch():
    """The bucket table `[buckets, H]` is gathered at `[1, L, L]` indices, not `[B, L, L]` (the old
    per-row bias: B times the bias bytes forward, and a B-fold scatter-add in the backward)."""
    model = _model()
    b = 3
    inputs = jnp.ones((b, L_IN), jnp.int32)
    targets = jnp.ones((b, L_TG), jnp.int32)
    params = model.init(jax.random.key(0))
    pos_in = jnp.broadcast_to(jnp.arange(L_IN), (b, L_IN))
    pos_tg = jnp.broadcast_to(jnp.arange(L_TG), (b, L_TG))

    def loss(p):
        return jnp.sum(model.apply(p, inputs, targets, inputs_positions=pos_in,
                                   targets_positions=pos_tg))

    table = params["encoder_relative_bias"]["embedding"]
    jaxpr = jax.make_jaxpr(jax.grad(loss))(params).jaxpr
    shapes = _gathers(jaxpr, tuple(table.shape))
    assert shapes, "no gather from the bias table found"
    assert all(s[0] == 1 for s in shapes), shapes
