"""Prefix LM (Raffel et al. 2020 §3.2.1 Figs. 3–4, §3.2.3): the "causal with prefix" mask, the
objective's inputs, targets and weights, against references written with explicit Python loops
and float64 NumPy."""

from __future__ import annotations

import math
import re

import jax
import numpy as np
import pytest
from float64_layer import np_layer, np_rms, random_params

from jaxformer.config import ModelConfig
from jaxformer.models import build_model
from jaxformer.objectives.causal import prepare_clm
from jaxformer.objectives.prefix_lm import PrefixLMOptions, check_prefix_lm_model, prepare_prefix_lm
from jaxformer.ops import prefix_lm_mask, segment_mask
from jaxformer.vocab import SpecialTokens

SPECIAL = SpecialTokens(vocab_size=128)
# two packed rows: segments of 10 and 4 tokens (then padding), and of 7, 1 and 3 tokens
SEGMENTS = [[1] * 10 + [2] * 4 + [0] * 2, [1] * 7 + [2] + [3] * 3 + [0] * 5]


def packed_batch(rng: np.random.Generator) -> dict:
    seg = np.array(SEGMENTS, np.int32)
    pos = np.zeros_like(seg)
    for b, row in enumerate(seg):
        for t in range(len(row)):
            pos[b, t] = 0 if t == 0 or row[t] != row[t - 1] else pos[b, t - 1] + 1
    tokens = np.where(seg != 0, rng.integers(5, 64, seg.shape), SPECIAL.pad_id).astype(np.int32)
    return {"inputs": tokens, "inputs_segment_ids": seg, "inputs_positions": np.where(seg != 0, pos, 0)}


def reference(batch: dict, fraction: float) -> dict:
    """Per segment, by hand: the first floor(fraction · n) tokens are the prefix (float64); token
    t predicts t+1 of its segment, counted when t+1 is past the prefix."""
    tokens, seg = batch["inputs"], batch["inputs_segment_ids"]
    out = {k: np.zeros(tokens.shape, d) for k, d in (("prefix", bool), ("weights", np.float64))}
    out["targets"] = np.full(tokens.shape, SPECIAL.pad_id)
    for b in range(tokens.shape[0]):
        for s in set(seg[b]) - {0}:
            where = [t for t in range(tokens.shape[1]) if seg[b, t] == s]
            p = math.floor(fraction * len(where))
            for i, t in enumerate(where):
                out["prefix"][b, t] = i < p
                if i + 1 < len(where):
                    out["targets"][b, t] = tokens[b, where[i + 1]]
                    out["weights"][b, t] = float(i + 1 >= p)
    return out


def test_the_mask_is_causal_but_for_the_prefix_keys(rng):
    batch = packed_batch(rng)
    ref = reference(batch, 0.5)
    pos, seg = batch["inputs_positions"], batch["inputs_segment_ids"]
    got = np.asarray(prefix_lm_mask(pos, pos, ref["prefix"]) & segment_mask(seg))
    want = np.zeros((2, 1, 16, 16), bool)
    for b in range(2):
        for i in range(16):
            for j in range(16):
                same = seg[b, i] == seg[b, j] != 0
                want[b, 0, i, j] = same and (pos[b, j] <= pos[b, i] or ref["prefix"][b, j])
    np.testing.assert_array_equal(got, want)
    # inside the prefix every token sees the whole prefix (bidirectional), after it only the past
    assert want[0, 0, 0, 4] and not want[0, 0, 5, 6] and want[0, 0, 9, 0]


@pytest.mark.parametrize("fraction", [0.5, 0.7, 0.3, 0.99])
def test_prepared_inputs_targets_and_weights_match_the_reference(fraction, rng):
    batch = packed_batch(rng)
    got = prepare_prefix_lm(batch, jax.random.key(0), SPECIAL, PrefixLMOptions(prefix_fraction=fraction))
    ref = reference(batch, fraction)
    np.testing.assert_array_equal(got["model_inputs"]["prefix"], ref["prefix"])
    np.testing.assert_array_equal(got["targets"], ref["targets"])
    np.testing.assert_array_equal(got["weights"], ref["weights"])
    for key, name in (("tokens", "inputs"), ("positions", "inputs_positions"),
                      ("segment_ids", "inputs_segment_ids")):
        np.testing.assert_array_equal(got["model_inputs"][key], batch[name])
    # no prefix token is a target: the prefix's other tokens see it
    target_in_prefix = np.pad(ref["prefix"][:, 1:], ((0, 0), (0, 1)))
    assert not (np.asarray(got["weights"]) * target_in_prefix).any()


def test_floor_is_taken_in_float64():
    """floor(0.7 · 90) in float64 is 62 (0.7 · 90 = 62.99999999999999, as the reference and the
    docs compute it); float32 arithmetic on the device would give 63."""
    batch = {"inputs": np.arange(5, 95, dtype=np.int32)[None]}
    got = prepare_prefix_lm(batch, None, SPECIAL, PrefixLMOptions(prefix_fraction=0.7))
    assert int(got["model_inputs"]["prefix"].sum()) == math.floor(0.7 * 90) == 62


def test_no_prefix_is_the_causal_lm(rng):
    batch = packed_batch(rng)
    got = prepare_prefix_lm(batch, None, SPECIAL, PrefixLMOptions(prefix_fraction=0.0))
    clm = prepare_clm(batch, None, SPECIAL)
    assert not np.asarray(got["model_inputs"].pop("prefix")).any()
    jax.tree.map(np.testing.assert_array_equal, got, clm)


@pytest.mark.parametrize("fields,named", [
    (dict(family="encoder", head="mlm"), "model.family='encoder'"),
    (dict(family="decoder", head="classify", num_classes=2, pooling="last"), "model.head='classify'"),
    (dict(family="decoder", head="lm", permutation_lm=True), "model.permutation_lm=False"),
    (dict(family="decoder", head="lm", attention_impl="splash", attention_dropout_rate=0.0),
     "model.attention_impl='splash'"),
])
def test_a_model_it_cannot_train_is_refused_naming_the_field(fields, named):
    cfg = ModelConfig(**{**dict(vocab_size=64, d_model=32, num_heads=2, d_ff=64, num_layers=1,
                                max_len=16), **fields})
    with pytest.raises(ValueError, match=re.escape(named)):
        check_prefix_lm_model(cfg)
    check_prefix_lm_model(ModelConfig(vocab_size=64, d_model=32, num_heads=2, d_ff=64, num_layers=1,
                                      max_len=16, family="decoder", head="lm", attention_impl="chunked"))


# ------------------------------------------------------------------------------------------------
# The decoder with a prefix: one layer against float64 NumPy.

def one_layer(**kw) -> ModelConfig:
    """A one-layer pre-LN GPT simple enough to write out in NumPy: learned positions, RMSNorm,
    ReLU, no biases, tied embeddings; 6 heads."""
    return ModelConfig(**{**dict(
        family="decoder", head="lm", vocab_size=64, d_model=48, num_heads=6, d_ff=64, num_layers=1,
        max_len=16, position="learned", norm="rms", use_bias=False, activation="relu",
        dropout_rate=0.0, attention_dropout_rate=0.0), **kw})



def np_forward(cfg: ModelConfig, params: dict, tokens, positions, seen) -> np.ndarray:
    """float64: token + position embedding → x + Attn(RMS(x)) over the keys ``seen`` `[B, L, L]`
    allows → x + FFN(RMS(x)) → RMS → tied logits."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    layer, table = p["decoder"]["layer_0"], p["token_embed"]["embedding"]
    x = table[tokens] + p["embed"]["pos_embedding"][positions]
    x = np_layer(cfg, layer, x, seen)
    return np_rms(x, p["decoder_norm"]["scale"], cfg.norm_eps) @ table.T


@pytest.mark.parametrize("impl", ["xla", "chunked"])
def test_the_decoder_reads_the_prefix_bidirectionally(impl, rng):
    """The prepared batch through the model (plain and chunked attention, blocks of 4) against a
    float64 forward whose mask is written with loops: a prefix token sees its whole prefix, the
    rest of the segment its past. Outputs on the non-padding tokens to 2e-5. In one layer the keys
    do not depend on the mask, so the tokens after the prefix get the causal model's outputs."""
    cfg = one_layer(attention_impl=impl, attention_chunk_size=4)
    params = random_params(cfg)
    batch = packed_batch(rng)
    prepared = prepare_prefix_lm(batch, None, SPECIAL, PrefixLMOptions(prefix_fraction=0.5))
    inputs = prepared["model_inputs"]
    got = np.asarray(build_model(cfg).apply(params, **inputs))
    seg, pos, prefix = batch["inputs_segment_ids"], batch["inputs_positions"], reference(batch, 0.5)["prefix"]
    seen = np.zeros((2, 16, 16), bool)
    for b, i, j in np.ndindex(seen.shape):
        seen[b, i, j] = seg[b, i] == seg[b, j] != 0 and (pos[b, j] <= pos[b, i] or prefix[b, j])
    want = np_forward(cfg, params, batch["inputs"], pos, seen)
    real = seg != 0
    np.testing.assert_allclose(got[real], want[real], atol=2e-5, rtol=2e-5)
    causal = np.asarray(build_model(cfg).apply(params, **{**inputs, "prefix": None}))
    after = real & ~prefix
    np.testing.assert_allclose(got[after], causal[after], atol=2e-5, rtol=2e-5)
    assert not np.allclose(got[prefix], causal[prefix], atol=1e-3)  # the prefix did read ahead
