"""ALiBi (Press et al. 2022, "Train Short, Test Long"): `position="alibi"`.

References: the paper's slopes written as its authors' recursive rule, float64 NumPy biases and a
float64 NumPy forward of a one-layer model (decoder: causal bias, encoder: |i − j|), HF BLOOM's
``build_alibi_tensor`` (live, `hf` tier). Cached decoding against the uncached forward is
`tests/test_decode.py::CACHE_CASES`, beam search's shared cache is below; the config's refusals
are in `tests/test_config.py`.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from float64_layer import np_layer, np_rms, random_params
from test_beam import reference_beam
from test_decode import PROMPTS, reference_greedy, tiny

from jaxformer.config import ModelConfig
from jaxformer.convert import save_hf
from jaxformer.decode import generate
from jaxformer.models import Transformer, build_model
from jaxformer.models.presets import preset
from jaxformer.ops import alibi_bias, alibi_slopes


def paper_slopes(n: int) -> list[float]:
    """The slopes as the paper's authors wrote them (recursively): n a power of two, the geometric
    sequence from 2^(-8/n) with that ratio; else those of the power of two below, then every other
    slope of twice that many heads."""
    if math.log2(n).is_integer():
        start = 2.0 ** (-8.0 / n)
        return [start * start ** i for i in range(n)]
    c = 2 ** math.floor(math.log2(n))
    return paper_slopes(c) + paper_slopes(2 * c)[0::2][:n - c]


def test_slopes_of_8_and_16_heads_are_the_papers():
    """§3: 8 heads 1/2, 1/4, …, 1/256 (exact powers of two); 16 heads 1/2^0.5, 1/2, …, 1/2^8."""
    np.testing.assert_array_equal(alibi_slopes(8), [2.0 ** -h for h in range(1, 9)])
    np.testing.assert_allclose(alibi_slopes(16), [2.0 ** (-h / 2) for h in range(1, 17)], rtol=1e-7)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6, 7, 12, 20, 32, 40])
def test_slopes_follow_the_authors_rule_for_any_head_count(n):
    np.testing.assert_allclose(alibi_slopes(n), paper_slopes(n), rtol=1e-7)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_bias_matches_float64_reference(bidirectional):
    """bias[b, h, i, j] = −m_h (q_i − k_j), or −m_h |q_i − k_j|, by positions (packed rows restart
    them; keys may be cache slots at other positions than the queries)."""
    r = np.random.default_rng(0)
    q_pos = np.array([[0, 1, 2, 0, 1], [7, 8, 9, 10, 11]], np.int32)
    kv_pos = r.integers(0, 12, (2, 9)).astype(np.int32)
    slopes = np.array(paper_slopes(6))
    want = np.zeros((2, 6, 5, 9))
    for b, h, i, j in np.ndindex(want.shape):
        d = float(q_pos[b, i] - kv_pos[b, j])
        want[b, h, i, j] = -slopes[h] * (abs(d) if bidirectional else d)
    got = alibi_bias(q_pos, kv_pos, 6, bidirectional=bidirectional)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_array_equal(alibi_bias(q_pos[0], kv_pos[0], 6,  # 1-D positions: batch 1
                                             bidirectional=bidirectional), got[:1])


# ------------------------------------------------------------------------------------------------
# The model: one layer against float64 NumPy.

def one_layer(family: str, **kw) -> ModelConfig:
    """A one-layer pre-LN model simple enough to write out in NumPy: RMSNorm, ReLU, no biases,
    tied embeddings; 6 heads (not a power of two)."""
    head = dict(head="lm") if family == "decoder" else dict(head="none", pooler=False)
    return ModelConfig(**{**dict(
        family=family, vocab_size=64, d_model=48, num_heads=6, d_ff=64, num_layers=1, max_len=16,
        position="alibi", norm="rms", use_bias=False, activation="relu", dropout_rate=0.0,
        attention_dropout_rate=0.0, **head), **kw})



def np_forward(cfg: ModelConfig, params: dict, tokens, positions, segment_ids) -> np.ndarray:
    """float64: token embedding (no position embedding) → x + Attn(RMS(x)) with the ALiBi bias →
    x + FFN(RMS(x)) → RMS → tied logits (decoder) or hidden states (encoder)."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    stack = "decoder" if cfg.causal else "encoder"
    layer, table = p[stack]["layer_0"], p["token_embed"]["embedding"]
    x = table[tokens]
    distance = positions[:, :, None] - positions[:, None, :]
    distance = distance if cfg.causal else np.abs(distance)
    bias = -np.array(paper_slopes(cfg.num_heads))[None, :, None, None] * distance[:, None]
    seen = (segment_ids[:, :, None] == segment_ids[:, None, :]) & (segment_ids[:, None, :] != 0)
    if cfg.causal:
        seen &= np.tril(np.ones(seen.shape[1:], bool))
    x = np_layer(cfg, layer, x, seen, bias)
    x = np_rms(x, p[f"{stack}_norm"]["scale"], cfg.norm_eps)
    return x @ table.T if cfg.causal else x


FRONT_ENDS = {  # the NNX class, and the pure model it calls
    "transformer": lambda cfg, params, *a, **kw: Transformer(cfg, params=params)(*a, **kw),
    "model": lambda cfg, params, *a, **kw: build_model(cfg).apply(params, *a, **kw),
}


@pytest.mark.parametrize("front_end,impl", [("transformer", "xla"), ("transformer", "chunked"),
                                            ("model", "xla")])
@pytest.mark.parametrize("family", ["decoder", "encoder"])
def test_model_matches_float64_numpy(family, front_end, impl):
    """Packed rows (positions restart per segment) and padding; plain and chunked attention (blocks
    of 4: the bias sliced per block); outputs on the non-padding tokens to 2e-5 (float32 model,
    values ~1). No position parameters exist."""
    cfg = one_layer(family, attention_impl=impl, attention_chunk_size=4)
    params = random_params(cfg)
    assert "embed" not in params and not any("relative" in k for k in params)
    toks = np.random.default_rng(1).integers(7, 64, (2, 10)).astype(np.int32)
    seg = np.array([[1] * 6 + [2] * 4, [1] * 8 + [0] * 2], np.int32)
    pos = np.array([list(range(6)) + list(range(4)), list(range(10))], np.int32)
    got = np.asarray(FRONT_ENDS[front_end](cfg, params, toks, positions=pos, segment_ids=seg))
    want = np_forward(cfg, params, toks, pos, seg)
    real = seg != 0
    np.testing.assert_allclose(got[real], want[real], atol=2e-5, rtol=2e-5)


def test_decoder_runs_past_max_len_and_is_causal():
    """No table, so ``max_len`` bounds nothing (the learned model refuses the same row): a row 3×
    max_len long is finite, its first max_len logits are those of the max_len-long row, and
    changing tokens after position i leaves logits up to i unchanged."""
    cfg = one_layer("decoder")
    model = Transformer(cfg, params=random_params(cfg))
    toks = np.random.default_rng(2).integers(7, 64, (2, 3 * cfg.max_len)).astype(np.int32)
    long = np.asarray(model(toks))
    assert np.isfinite(long).all()
    np.testing.assert_allclose(long[:, :cfg.max_len], model(toks[:, :cfg.max_len]), atol=1e-5)
    changed = toks.copy()
    changed[:, 21:] = (toks[:, 21:] + 1) % 64
    out = np.asarray(model(changed))
    np.testing.assert_allclose(out[:, :21], long[:, :21], atol=1e-5)
    assert not np.allclose(out[:, 21:], long[:, 21:])
    learned = one_layer("decoder", position="learned")
    with pytest.raises(ValueError, match="exceed model.max_len=16"):
        Transformer(learned, 0)(toks)


def test_beams_sharing_one_cache_match_the_python_reference():
    """Beam search keeps its hypotheses in one cache (`jaxformer.decode.beam`): a hypothesis' slots
    are not contiguous, so only cache-slot positions (not slot indices) give ALiBi's distances. The
    pool equals the plain-Python beam search over the uncached forward (tests/test_beam.py):
    tokens exact, scores to 1e-4."""
    model, params = tiny("gpt_tiny", position="alibi")
    k, n, alpha = 2, 4, 0.6
    eos = int(reference_greedy(model, params, PROMPTS[:1], 2)[0][0, 1])
    res = generate(model, params, PROMPTS[:1], strategy="beam", beam_size=k, max_new_tokens=n,
                   length_penalty=alpha, eos_id=eos, pad_id=0)
    for j, (score, toks, _) in enumerate(reference_beam(model, params, PROMPTS[0], k, n, alpha, eos)):
        assert res.beam_tokens[0, j].tolist() == toks + [0] * (n - len(toks))
        np.testing.assert_allclose(res.beam_scores[0, j], score, atol=1e-4)


def test_hf_export_is_refused_naming_the_position(tmp_path):
    """No HF architecture we export has ALiBi (BLOOM is not converted): export says so."""
    cfg = ModelConfig.from_dict(preset("gpt_tiny", position="alibi"))
    with pytest.raises(ValueError, match="position='alibi' \\(needs 'learned'\\)"):
        save_hf(cfg, random_params(cfg), tmp_path)


@pytest.mark.hf
@pytest.mark.parametrize("num_heads", [8, 6, 12, 16])
def test_slopes_and_bias_equal_blooms(num_heads):
    """HF BLOOM's ``build_alibi_tensor`` gives m_h · k_j (its key positions: the mask's cumulative
    sum), ours −m_h (q_i − k_j): the same up to −m_h q_i, a constant per query row that softmax
    ignores. Left padding as BLOOM sees it."""
    import torch
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    mask = np.array([[1, 1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1, 1]], np.int64)
    hf = build_alibi_tensor(torch.tensor(mask), num_heads, torch.float32).numpy()
    hf = hf.reshape(2, num_heads, 1, 7)
    pos = ((np.cumsum(mask, -1) - 1) * mask).astype(np.int32)
    slopes = np.asarray(alibi_slopes(num_heads))
    # key position 1 holds the slopes. HF raises a float32-rounded base to the h-th power: a few
    # ulps off (3e-7 relative at 16 heads, where ours, from float64, give 2^-8 exactly)
    np.testing.assert_allclose(slopes, hf[0, :, 0, 1], rtol=1e-6, atol=0)
    ours = np.asarray(alibi_bias(pos, pos, num_heads))
    np.testing.assert_allclose(ours + slopes[None, :, None, None] * pos[:, None, :, None],
                               np.broadcast_to(hf, ours.shape), atol=1e-6)
