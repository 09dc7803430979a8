"""The bytes outside attention (issue 59, item 2): each cheaper path equals today's.

* the blockwise cross-entropy (``objective.vocab_block_size``) gives the loss, accuracy and
  gradients of the full-logits path for every head that has a vocabulary: tied (+ bias), untied
  (+ bias), BERT's MLM head (with NSP), T5, each with and without a padded vocabulary;
* the MLM head reading only the chosen positions (``max_predictions_per_seq``) gives the masks,
  loss and gradients of the all-positions head, and its slot count follows BERT's 20 / 80.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxformer.config import ModelConfig
from jaxformer.models import build_model
from jaxformer.models.presets import preset
from jaxformer.objectives import bind_objective, prepare_mlm
from jaxformer.objectives.mlm import MLMOptions, gather_predictions, max_predictions
from jaxformer.train.step import blockwise_loss, loss_and_metrics, make_train_step
from jaxformer.vocab import SpecialTokens

SMALL = dict(vocab_size=250, d_model=32, num_heads=4, d_ff=64, num_layers=1, max_len=32,
             dropout_rate=0.0, attention_dropout_rate=0.0, ffn_dropout_rate=0.0)
CASES = {
    "gpt_tied_bias_padded": ("gpt_tiny", dict(lm_head_bias=True, vocab_pad_multiple=64)),
    "gpt_untied_bias": ("gpt_tiny", dict(tie_embeddings=False, lm_head_bias=True)),
    "bert_mlm_nsp_padded": ("bert_tiny", dict(nsp_head=True, vocab_pad_multiple=64)),
    "t5": ("t5_tiny", {}),
}


def _model(name: str) -> tuple[ModelConfig, object, dict]:
    base, kw = CASES[name]
    cfg = ModelConfig.from_dict(preset(base, **{**SMALL, **kw}))
    model = build_model(cfg)
    return cfg, model, model.init(jax.random.key(0))


def _prepared(cfg: ModelConfig) -> dict:
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, cfg.vocab_size, (2, 12)).astype(np.int32)
    inputs = ({"inputs": tokens, "targets_in": tokens[:, :7]} if cfg.family == "encoder_decoder"
              else {"tokens": tokens})
    shape = inputs.get("targets_in", tokens).shape
    targets = rng.integers(0, cfg.vocab_size, shape).astype(np.int32)
    targets[0, 0] = cfg.vocab_size - 1
    weights = np.ones(shape, np.float32)
    weights[1, -2:] = 0
    out = {"model_inputs": inputs, "targets": targets, "weights": weights}
    if cfg.nsp_head:
        out.update(nsp_targets=np.array([0, 1], np.int32), nsp_weights=np.ones(2, np.float32))
    return out


def _loss_and_grads(model, params, prepared, block: int):
    def f(p):
        sums = loss_and_metrics(model, p, prepared, deterministic=True, dropout_rng=None,
                                label_smoothing=0.1, z_loss=1e-3, vocab_block_size=block)
        return sums["loss"] + sums.get("nsp_loss", 0.0), sums

    return jax.jit(jax.value_and_grad(f, has_aux=True))(params)


def _assert_grads_close(got, want):
    """Every leaf equal within float32 sums taken in another order."""
    scale = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(want))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * scale),
                 got, want)


@pytest.mark.parametrize("name", sorted(CASES))
def test_blockwise_loss_equals_the_full_logits_loss(name):
    """Loss (label smoothing and z-loss), accuracy, NSP sums and every parameter's gradient of
    the blockwise loss (37 columns a block: no block divides the vocabulary) equal the full
    logits'; no `[B, L, V]` array is left in the blockwise program."""
    cfg, model, params = _model(name)
    prepared = _prepared(cfg)
    (ref, ref_sums), ref_grads = _loss_and_grads(model, params, prepared, 0)
    (got, got_sums), got_grads = _loss_and_grads(model, params, prepared, 37)
    assert np.isfinite(ref)
    np.testing.assert_allclose(got, ref, rtol=2e-6)
    assert set(got_sums) == set(ref_sums)
    for k in ref_sums:
        np.testing.assert_allclose(got_sums[k], ref_sums[k], rtol=2e-6, err_msg=k)
    _assert_grads_close(got_grads, ref_grads)
    b, length = prepared["targets"].shape
    full_logits = (f"tensor<{b}x{length}x{cfg.padded_vocab_size}x",
                   f"tensor<{b * length}x{cfg.padded_vocab_size}x")

    def holds_logits(block):
        hlo = jax.jit(lambda p: _loss_and_grads(model, p, prepared, block)).lower(params).as_text()
        return any(t in hlo for t in full_logits)

    assert holds_logits(0) and not holds_logits(37)


def _mlm_batch(length: int = 24) -> dict:
    rng = np.random.default_rng(3)
    tokens = rng.integers(10, 250, (4, length)).astype(np.int32)
    tokens[:, 0], tokens[:, -1] = 1, 2  # [CLS] … [SEP]
    tokens[3, length // 2:] = 0  # a padded row
    return {"inputs": tokens, "nsp_label": np.array([0, 1, 1, 0], np.int32)}


def test_mlm_at_the_chosen_positions_equals_every_position():
    """The trainer's MLM objective gathers each row's chosen positions: the same corrupted inputs
    and targets, and the loss, accuracy and gradients of the all-positions head."""
    cfg, model, params = _model("bert_mlm_nsp_padded")
    special = SpecialTokens(cfg.vocab_size)
    batch, key = _mlm_batch(), jax.random.key(5)
    full = prepare_mlm(batch, key, special, MLMOptions(mask_rate=0.15))
    gathered = bind_objective("mlm", MLMOptions(mask_rate=0.15), special)(batch, key)
    slots = gathered["targets"].shape[1]
    assert slots == max_predictions(MLMOptions(mask_rate=0.15), 24) == 4  # ⌈0.15·24⌉ = 4
    np.testing.assert_array_equal(gathered["model_inputs"]["tokens"], full["model_inputs"]["tokens"])
    w_full, w = np.asarray(full["weights"]), np.asarray(gathered["weights"])
    np.testing.assert_array_equal(w.sum(1), w_full.sum(1))  # no target left out
    pos = np.asarray(gathered["model_inputs"]["predict_positions"])
    for b in range(4):
        chosen = np.flatnonzero(w_full[b])
        np.testing.assert_array_equal(pos[b, :len(chosen)], chosen)
        np.testing.assert_array_equal(gathered["targets"][b, :len(chosen)],
                                      np.asarray(full["targets"])[b, chosen])
    # the gathered head keeps its [B, P, V] logits (the measured choice), the full one goes blockwise
    assert blockwise_loss(model, full, 37) and not blockwise_loss(model, gathered, 37)
    for block in (0, 37):
        (ref, ref_sums), ref_grads = _loss_and_grads(model, params, full, block)
        (got, got_sums), got_grads = _loss_and_grads(model, params, gathered, block)
        np.testing.assert_allclose(got, ref, rtol=2e-6)
        for k in ref_sums:
            np.testing.assert_allclose(got_sums[k], ref_sums[k], rtol=2e-6, err_msg=k)
        _assert_grads_close(got_grads, ref_grads)
    logits, _ = model.apply(params, **gathered["model_inputs"])
    assert logits.shape == (4, slots, cfg.padded_vocab_size)


def test_max_predictions_follows_bert_and_refuses_caps_that_drop_targets():
    assert max_predictions(MLMOptions(), 128) == 20 and max_predictions(MLMOptions(), 512) == 80
    assert max_predictions(MLMOptions(max_predictions_per_seq=0), 512) == 0  # above: BERT's
    assert max_predictions(MLMOptions(max_predictions_per_seq=100), 512) == 100
    assert max_predictions(MLMOptions(whole_word_mask=True), 512) == 0  # not bounded by mask_rate
    assert max_predictions(MLMOptions(masking="span"), 512) == 0
    with pytest.raises(ValueError, match="max_predictions_per_seq=70 is less than"):
        max_predictions(MLMOptions(max_predictions_per_seq=70), 512)
    with pytest.raises(ValueError, match="max_predictions_per_seq=80 with whole-word"):
        max_predictions(MLMOptions(max_predictions_per_seq=80, whole_word_mask=True), 512)
    full = {"model_inputs": {}, "targets": np.zeros((1, 8)), "weights": np.zeros((1, 8))}
    assert gather_predictions(full, 0) is full


def test_a_train_step_with_both_equals_the_plain_step():
    """One optimizer step of BERT pretraining (MLM + NSP, dropout on) as the trainer runs it (the
    gathered head, ``vocab_block_size`` set) gives the parameters and metrics of the all-positions,
    full-logits step."""
    import optax

    from jaxformer.train.config.schema import ObjectiveSettings
    from jaxformer.train.state import TrainState

    cfg, model, params = _model("bert_mlm_nsp_padded")
    cfg = cfg.replace(dropout_rate=0.1)
    model = build_model(cfg)
    special = SpecialTokens(cfg.vocab_size)
    tx = optax.sgd(0.1)
    state = TrainState(step=np.int32(0), params=params, opt_state=tx.init(params),
                       rng=np.asarray(jax.random.key_data(jax.random.key(1))))
    batch = _mlm_batch()
    plain = make_train_step(model, tx, lambda b, k: prepare_mlm(b, k, special), lambda s: 0.1)
    fast = make_train_step(model, tx, bind_objective("mlm", None, special), lambda s: 0.1,
                           objective=ObjectiveSettings(vocab_block_size=64))
    s0, m0 = jax.jit(plain)(state, batch)
    s1, m1 = jax.jit(fast)(state, batch)
    for k in m0:
        np.testing.assert_allclose(m1[k], m0[k], rtol=1e-5, err_msg=k)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 s1.params, s0.params)


def test_dropout_key_is_threefry_itself_or_a_key_of_the_chosen_implementation():
    """threefry2x32 leaves the step's key (today's masks); rbg and unsafe_rbg keys are drawn from it
    (the same key each time: a pure function of (seed, step)), and their masks differ."""
    from jaxformer.ops.dropout import dropout, dropout_key

    key = jax.random.key(3)
    assert dropout_key(key, "threefry2x32") is key
    x = np.ones((64, 64), np.float32)
    masks = {}
    for impl in ("rbg", "unsafe_rbg"):
        k = dropout_key(key, impl)
        assert str(jax.random.key_impl(k)) == impl
        np.testing.assert_array_equal(jax.random.key_data(k), jax.random.key_data(dropout_key(key, impl)))
        masks[impl] = np.asarray(dropout(x, 0.5, k)) == 0
        assert 0.4 < masks[impl].mean() < 0.6
    assert (masks["rbg"] != (np.asarray(dropout(x, 0.5, key)) == 0)).any()
    with pytest.raises(ValueError, match="'philox' is not one of"):
        dropout_key(key, "philox")
