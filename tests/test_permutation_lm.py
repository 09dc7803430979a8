"""Permutation LM (XLNet, Yang et al. 2019): masks against a brute-force construction from explicit
permutations, the identity order with K=1 against the causal LM, the query stream's blindness to
its own token, partial prediction's counts, refusals, and a tiny run on real text that then
generates as a causal LM."""

from __future__ import annotations

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.checkpoint import load_for_inference, read_metrics
from jaxformer.config import ModelConfig
from jaxformer.convert.hf import load_hf, save_hf
from jaxformer.decode import generate
from jaxformer.models import build_model
from jaxformer.objectives import prepare_clm, prepare_plm
from jaxformer.objectives.plm import PLMOptions
from jaxformer.ops import permutation
from jaxformer.train import config as train_config
from jaxformer.train.loop import train_and_evaluate
from jaxformer.train.step import loss_and_metrics
from jaxformer.vocab import SpecialTokens

ROOT = Path(__file__).resolve().parents[1]
V = 300
SPECIAL = SpecialTokens(V)  # ordinary tokens 107..299
# A row with two packed segments (7 and 6 tokens) and 3 pads, and a row of one 16-token segment.
SEGMENTS = np.array([[1] * 7 + [2] * 6 + [0] * 3, [1] * 16], np.int32)


def _orders(rng: np.random.Generator, segment_ids: np.ndarray) -> list[list[list[int]]]:
    """Per row, per segment: an explicit random permutation ``z`` of the segment's indices."""
    return [[list(rng.permutation(np.flatnonzero(row == s))) for s in np.unique(row[row != 0])]
            for row in segment_ids]


def _rank_of(orders, shape) -> np.ndarray:
    rank = np.zeros(shape, np.int32)
    for b, segs in enumerate(orders):
        for z in segs:
            for t, i in enumerate(z):
                rank[b, i] = t
    return rank


def _brute_force(orders, shape, k):
    """Masks, predecessors and targets by looping over each permutation ``z`` (XLNet §2.3, §2.4)."""
    content, query = np.zeros((shape[0], 1, shape[1], shape[1]), bool), None
    query = content.copy()
    pred = np.tile(np.arange(shape[1]), (shape[0], 1))
    targets = np.zeros(shape, bool)
    for b, segs in enumerate(orders):
        for z in segs:
            n = len(z)
            num_targets = min(math.ceil(n / k), n - 1)
            for t, i in enumerate(z):
                for s in range(t + 1):
                    content[b, 0, i, z[s]] = True
                    query[b, 0, i, z[s]] = s < t
                if t:
                    pred[b, i] = z[t - 1]
                targets[b, i] = t >= n - num_targets
    return content, query, pred, targets


@pytest.mark.parametrize("k", [1.0, 2.0, 3.5, 6.0])
def test_masks_predecessors_and_targets_equal_a_brute_force_construction(k):
    orders = _orders(np.random.default_rng(int(k * 10)), SEGMENTS)
    rank = _rank_of(orders, SEGMENTS.shape)
    content, query, pred, targets = _brute_force(orders, SEGMENTS.shape, k)
    seg = jnp.asarray(SEGMENTS)
    np.testing.assert_array_equal(permutation.content_stream_mask(jnp.asarray(rank), seg), content)
    np.testing.assert_array_equal(permutation.query_stream_mask(jnp.asarray(rank), seg), query)
    np.testing.assert_array_equal(permutation.predecessor_index(jnp.asarray(rank), seg), pred)
    np.testing.assert_array_equal(
        permutation.partial_prediction_targets(jnp.asarray(rank), seg, k), targets)
    assert not content[0, 0, :, 13:].any() and not content[0, 0, 13:].any()  # pads: never


def test_partial_prediction_trains_ceil_n_over_k_of_each_segment():
    """§2.4: the last ceil(n/K) of each order (at most n-1: never the first) are targets."""
    lengths = [1, 2, 3, 5, 6, 7, 12, 13, 64]  # packed in one row, then 4 pads
    seg = jnp.asarray([sum(([i + 1] * n for i, n in enumerate(lengths)), []) + [0] * 4])
    rank = permutation.sample_order(jax.random.key(0), seg)
    r, s = np.asarray(rank)[0], np.asarray(seg)[0]
    for k in [1.0, 2.0, 2.5, 6.0, 7.0]:
        got = np.asarray(permutation.partial_prediction_targets(rank, seg, k))[0]
        assert not got[s == 0].any()
        for i, n in enumerate(lengths):
            mine = got[s == i + 1]
            assert mine.sum() == min(math.ceil(n / k), n - 1), (n, k)
            assert set(r[s == i + 1][mine]) == set(range(n - mine.sum(), n))  # the order's last
    with pytest.raises(ValueError, match="K >= 1"):
        permutation.partial_prediction_targets(rank, seg, 0.5)


def test_sampled_orders_are_uniform_permutations_within_each_segment():
    seg = jnp.asarray(np.tile([[1, 1, 1, 2, 2, 2, 2, 0]], (6000, 1)))
    rank = np.asarray(permutation.sample_order(jax.random.key(0), seg))
    assert (rank[:, 7] == 0).all()
    counts: dict[tuple, int] = {}
    for row in rank:
        assert sorted(row[:3]) == [0, 1, 2] and sorted(row[3:7]) == [0, 1, 2, 3]
        counts[tuple(row[3:7])] = counts.get(tuple(row[3:7]), 0) + 1
    assert len(counts) == 24  # every order of 4 appears, each ≈ 6000/24 = 250 ± 5σ
    assert all(abs(c - 250) < 5 * math.sqrt(250 * 23 / 24) for c in counts.values()), counts
    np.testing.assert_array_equal(permutation.identity_order(jnp.asarray(SEGMENTS)),
                                  [[*range(7), *range(6), 0, 0, 0], list(range(16))])


def _model_cfg(**kw) -> ModelConfig:
    cfg = ModelConfig(vocab_size=V, d_model=32, num_heads=4, d_ff=64, num_layers=2, max_len=32,
                      permutation_lm=True, **kw)
    cfg.validate()
    return cfg


def _batch(seed: int = 0) -> dict:
    tokens = np.random.default_rng(seed).integers(107, V, SEGMENTS.shape).astype(np.int32)
    return {"inputs": jnp.asarray(np.where(SEGMENTS == 0, SPECIAL.pad_id, tokens)),
            "inputs_segment_ids": jnp.asarray(SEGMENTS)}


def _init(model, cfg, seed=0):
    return model.init(jax.random.key(seed))


@pytest.mark.parametrize("position,scan", [
    ("learned", False), pytest.param("rope", True, marks=pytest.mark.slow),
    pytest.param("sinusoidal", False, marks=pytest.mark.slow)])
def test_identity_order_with_k1_is_exactly_the_causal_lm_loss(position, scan):
    cfg = _model_cfg(position=position, scan_layers=scan)
    model = build_model(cfg)
    params = _init(model, cfg)
    batch = _batch()
    options = PLMOptions(plm_k=1.0, plm_identity_order=True)
    clm, plm = prepare_clm(batch, None, SPECIAL), prepare_plm(batch, jax.random.key(1), SPECIAL,
                                                             options)

    @jax.jit
    def run(prepared):
        sums = loss_and_metrics(model, params, prepared, deterministic=True, dropout_rng=None)
        return sums, model.apply(params, **prepared["model_inputs"])

    (clm_sums, clm_logits), (plm_sums, plm_logits) = run(clm), run(plm)
    assert float(clm_sums["weight"]) == float(plm_sums["weight"]) == 6 + 5 + 15
    # equal to float32 rounding: the two compiled programs may fuse differently (op by op, eagerly,
    # they are bitwise equal)
    np.testing.assert_allclose(plm_sums["loss"], clm_sums["loss"], rtol=1e-6)
    # row by row: the query stream at i is the causal LM at i - 1
    w = np.asarray(plm["weights"]) > 0
    np.testing.assert_allclose(np.asarray(plm_logits)[:, 1:][w[:, 1:]],
                               np.asarray(clm_logits)[:, :-1][w[:, 1:]], rtol=1e-5, atol=1e-6)


def test_permutation_lm_leaves_the_causal_lm_function_unchanged():
    """model.permutation_lm only adds jump_embed: without a factorisation order the model is the
    plain GPT of the same weights, bit for bit."""
    cfg = _model_cfg()
    plm_model, gpt = build_model(cfg), build_model(cfg.replace(permutation_lm=False))
    params = _init(plm_model, cfg)
    assert params["jump_embed"]["embedding"].shape == (2 * 32 - 1, 32)
    gpt_params = {k: v for k, v in params.items() if k != "jump_embed"}
    assert jax.tree.structure(gpt_params) == jax.tree.structure(_init(gpt, cfg))
    tokens = _batch()["inputs"]
    np.testing.assert_array_equal(plm_model.apply(params, tokens),
                                  gpt.apply(gpt_params, tokens))


@pytest.mark.parametrize("position", [pytest.param("learned", marks=pytest.mark.slow), "rope"])
def test_a_predicted_position_does_not_see_its_own_token(position):
    """The query stream's logit at i has exactly zero gradient w.r.t. the embedding of x_i (and of
    every token at or after i in the order), and a nonzero one w.r.t. its predecessors'."""
    cfg = _model_cfg(position=position)
    model = build_model(cfg)
    params = _init(model, cfg)
    seg = jnp.asarray([[1] * 9 + [2] * 7])
    tokens = jnp.asarray([np.arange(107, 123)], jnp.int32)  # distinct ids: one table row each
    rank = permutation.sample_order(jax.random.key(3), seg)
    unused = 200  # a vocabulary id not in the row, so the tied output row is not a token's

    def logit(table, i):
        p = {**params, "token_embed": {"embedding": table}}
        out = model.apply(p, tokens, segment_ids=seg, factorization_rank=rank)
        return out[0, i, unused]

    r, s = np.asarray(rank)[0], np.asarray(seg)[0]
    grads = jax.jit(jax.vmap(jax.grad(logit), in_axes=(None, 0)))(
        params["token_embed"]["embedding"], jnp.arange(16))
    for i in range(16):
        row_norm = np.abs(np.asarray(grads[i])[np.asarray(tokens)[0]]).sum(-1)  # per position
        before = (s == s[i]) & (r < r[i])
        assert (row_norm[~before] == 0).all(), (i, row_norm)
        assert (row_norm[before] > 0).all(), (i, row_norm)


def test_bad_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="model.permutation_lm"):
        ModelConfig(family="encoder", head="mlm", permutation_lm=True).validate()
    with pytest.raises(ValueError, match="model.permutation_lm"):
        ModelConfig(position="relative", permutation_lm=True).validate()
    config = train_config.load_config(ROOT / "configs" / "gpt_plm_tiny.py",
                                      {"model.permutation_lm": False})
    with pytest.raises(ValueError, match="model.permutation_lm=True"):
        train_config.validate_config(config)
    config = train_config.load_config(ROOT / "configs" / "gpt_plm_tiny.py", {"objective.plm_k": 0.5})
    with pytest.raises(ValueError, match="objective.plm_k"):
        train_config.validate_config(config)
    model = build_model(ModelConfig(vocab_size=V, d_model=32, num_heads=4, d_ff=64, num_layers=1))
    params = model.init(jax.random.key(0))
    with pytest.raises(ValueError, match="model.permutation_lm=True"):
        model.apply(params, jnp.ones((1, 4), jnp.int32),
                    factorization_rank=jnp.zeros((1, 4), jnp.int32))


@pytest.fixture(scope="module")
def plm_run(tmp_path_factory):
    """30 steps of a 1-layer GPT (as tests/test_train.py): the loss drops 0.76-0.85 (seeds 0-2)."""
    c = train_config.load_config(ROOT / "configs" / "gpt_plm_tiny.py")
    c.model.update(dict(d_model=32, num_heads=2, d_ff=64, num_layers=1, max_len=64,
                        vocab_size=512))
    c.data.tokenizer.vocab_size, c.data.tokenizer.max_train_texts = 512, 1500
    c.data.seq_len, c.data.batch_size, c.num_train_steps = 32, 8, 30
    c.log_every_steps, c.eval.every_steps, c.eval.num_batches = 5, 30, 2
    c.checkpoint.every_steps, c.progress_bar = 30, False
    c.optimizer.warmup_steps, c.optimizer.peak_lr = 5, 3e-3
    wd = tmp_path_factory.mktemp("gpt_plm")
    train_and_evaluate(c, wd)
    return wd


@pytest.mark.slow
def test_a_tiny_plm_run_lowers_its_loss_and_generates_as_a_causal_lm(plm_run, tmp_path):
    losses = [r["loss"] for r in read_metrics(plm_run) if "loss" in r]
    first, last = np.mean(losses[:2]), np.mean(losses[-2:])
    assert last < first - 0.5, losses
    cfg, params, tokenizer = load_for_inference(plm_run)
    assert cfg.permutation_lm and "jump_embed" in params
    model = build_model(cfg)
    prompt = tokenizer.encode("the king")
    new = list(np.asarray(generate(model, params, [prompt], max_new_tokens=5, eos_id=None).tokens)[0])
    # greedy decoding (KV cache) = the argmax of the plain causal forward over the whole sequence
    logits = model.apply(params, jnp.asarray([prompt + new], jnp.int32))
    np.testing.assert_array_equal(np.argmax(logits[0, len(prompt) - 1:-1], axis=-1), new)
    # the Hugging Face export is that GPT (the jump table is training-only)
    save_hf(cfg, params, tmp_path / "hf")
    hf_fields, hf_params, _ = load_hf(tmp_path / "hf")
    assert not ModelConfig.from_dict(hf_fields).permutation_lm and "jump_embed" not in hf_params
    hf_logits = build_model(ModelConfig.from_dict(hf_fields)).apply(
        hf_params, jnp.asarray([prompt + new], jnp.int32))
    np.testing.assert_allclose(hf_logits, logits, rtol=1e-5, atol=1e-5)
