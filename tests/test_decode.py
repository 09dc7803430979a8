"""Generation against the uncached full forward: cached logits, greedy, sampling filters, CLI.

References are independent of the decode code: the model's uncached full forward (the training
path, no KV cache, no left padding), a slow Python argmax loop over it, and float64 NumPy versions of
the top-k / nucleus filters. All models are tiny, float32, dropout off, with random weights drawn in
NumPy. Tolerances are stated per test.
"""

from __future__ import annotations

import dataclasses
import functools
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.config import ModelConfig
from jaxformer.decode import (
    GenerationConfig,
    apply_temperature,
    generate,
    generate_batches,
    generate_text,
    sample,
    steps,
    top_k_filter,
    top_p_filter,
)
from jaxformer.decode.api import bucket_width
from jaxformer.decode.sampling import top_k_top_p_filter
from jaxformer.models import build_model
from jaxformer.models.presets import preset
from jaxformer.vocab import SpecialTokens

VOCAB = 64
NO_DROPOUT = dict(dropout_rate=0.0, attention_dropout_rate=0.0, ffn_dropout_rate=0.0)
# Prompts/sources of different lengths (ids >= 7 avoid the special ids).
PROMPTS = [[11, 12, 13], [20], [30, 31, 32, 33, 34]]


def random_params(model, std: float = 0.3, seed: int = 0):
    """Parameters drawn in NumPy on the model's abstract shapes (`jax.eval_shape`: no compile):
    norm scales 1, biases 0, every other weight N(0, std²). std 0.3 makes random models
    non-degenerate (with the presets' small inits they just repeat the last input token)."""
    jax.ShapeDtypeStruct((1, 4), jnp.int32)
    shapes = model.abstract()
    rng = np.random.default_rng(seed)

    def draw(path, s):
        name = str(path[-1].key)
        if name == "scale":
            return jnp.ones(s.shape, s.dtype)
        if name == "bias":
            return jnp.zeros(s.shape, s.dtype)
        return jnp.asarray(rng.normal(0.0, std, s.shape), s.dtype)

    return jax.tree_util.tree_map_with_path(draw, shapes)


def tiny(name: str, **overrides):
    """(model, random params) of a preset at vocab 64, dropout off."""
    cfg = ModelConfig.from_dict(preset(name, **{"vocab_size": VOCAB, **NO_DROPOUT, **overrides}))
    model = build_model(cfg)
    return model, random_params(model)


def right_pad(rows):
    lengths = np.array([len(r) for r in rows], np.int32)
    out = np.zeros((len(rows), lengths.max()), np.int32)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return jnp.asarray(out), jnp.asarray(lengths)


@functools.cache
def _forward(model):
    if model.cfg.family == "decoder":
        return jax.jit(lambda p, toks: model.apply(p, toks))
    return jax.jit(lambda p, src, seg, tgt: model.apply(p, src, tgt,
                                                         inputs_segment_ids=seg))


def teacher_forced_logits(model, params, prompts, cont, start_id=0) -> np.ndarray:
    """Uncached full forward (the training path): `[B, m + 1, V]`, entry ``t`` predicting the token
    after ``prompt + cont[:t]`` (decoder-only) or after ``[start] + cont[:t]`` given the source.

    Rows are right-padded to one buffer; causal attention makes trailing padding invisible to
    earlier positions, so each row equals its unpadded forward (sources use the encoder's padding
    mask). ``cont`` `[B, m]`.
    """
    given = np.asarray(cont, np.int32)
    b, m = given.shape
    # Buffers are padded to 4 rows and 16 columns: few distinct shapes, few compiles.
    rows = 4 * -(-b // 4)
    prompts = list(prompts) + [[7]] * (rows - b)
    cont = np.zeros((rows, m), np.int32)
    cont[:b] = given
    if model.cfg.family == "decoder":
        lengths = [len(p) for p in prompts]
        buf = np.zeros((rows, -(-(max(lengths) + m) // 16) * 16), np.int32)
        for i, p in enumerate(prompts):
            buf[i, :len(p) + m] = list(p) + cont[i].tolist()
        logits = np.asarray(_forward(model)(params, jnp.asarray(buf)))
        return np.stack([logits[i, n - 1:n + m] for i, n in enumerate(lengths[:b])])
    lengths = np.array([len(p) for p in prompts])
    src = np.zeros((rows, -(-lengths.max() // 16) * 16), np.int32)
    for i, p in enumerate(prompts):
        src[i, :len(p)] = p
    seg = (np.arange(src.shape[1])[None] < lengths[:, None]).astype(np.int32)
    tgt = np.concatenate([np.full((rows, 1), start_id, np.int32), cont], axis=1)
    return np.asarray(_forward(model)(params, src, seg, tgt))[:b]


def repeating_tokens(seq, n: int) -> set:
    """Tokens that would complete an n-gram already in ``seq`` (a Python list)."""
    if n <= 0 or len(seq) < n - 1:
        return set()
    suffix = tuple(seq[len(seq) - n + 1:])
    return {seq[j + n - 1] for j in range(len(seq) - n + 1) if tuple(seq[j:j + n - 1]) == suffix}


def reference_greedy(model, params, prompts, n, start_id=0, no_repeat=0):
    """Slow reference: argmax of the uncached full forward, one token at a time, no EOS, never
    repeating a ``no_repeat``-gram when that is > 0 (log-probs stay unmasked).

    Returns (tokens `[B, n]`, log-probs `[B, n]` float64)."""
    cont = np.zeros((len(prompts), n - 1), np.int32)
    toks, lps = np.zeros((len(prompts), n), np.int32), np.zeros((len(prompts), n))
    for t in range(n):
        logits = teacher_forced_logits(model, params, prompts, cont, start_id)[:, t]
        masked = np.array(logits, np.float64)
        for b in range(len(prompts)):
            masked[b, list(repeating_tokens(toks[b, :t].tolist(), no_repeat))] = -np.inf
        toks[:, t] = np.argmax(masked, axis=-1)
        lps[:, t] = log_softmax64(logits)[np.arange(len(prompts)), toks[:, t]]
        if t < n - 1:
            cont[:, t] = toks[:, t]
    return toks, lps


def log_softmax64(logits) -> np.ndarray:
    z = np.asarray(logits, np.float64)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


# -------------------------------------------------------------------------------------------------
# KV cache: each decode step's logits equal the full forward on the same prefix.

CACHE_CASES = [
    ("gpt_tiny", {}),                                    # learned positions + left padding
    ("gpt_tiny", {"scan_layers": True}),
    ("gpt_tiny", {"position": "rope", "num_kv_heads": 2}),  # per-row RoPE positions, GQA
    ("t5_tiny", {}),                                     # relative bias, padded sources
    ("t5_tiny", {"scan_layers": True}),
    ("transformer_tiny", {}),                            # post-LN, sinusoidal
    ("gpt_tiny", {"position": "alibi"}),                 # ALiBi: query vs cache-slot positions
    ("t5_tiny", {"position": "alibi"}),                  # ALiBi, |i - j| in the encoder
]


# Slow tier: the scanned GPT and T5 (2.8 and 4.5 s of CPU). A scanned cache ([layers, B, …]) through
# the decoding loop is test_refill_equals_each_prompt_alone's (RoPE GPT, scanned); scanned GPT and T5
# caches against the uncached forward are tests/test_model.py's test_transformer_kv_cache_… [gpt], [t5].
SCANNED = {1, 4}


@pytest.mark.parametrize("name,overrides", [
    pytest.param(*case, marks=pytest.mark.slow) if i in SCANNED else case
    for i, case in enumerate(CACHE_CASES)])
def test_cached_steps_match_full_forward(name, overrides):
    """Prefill (left-padded batch) + teacher-forced steps vs the uncached full forward on the same
    prefixes; tolerance 1e-4 absolute on float32 logits of magnitude ~10."""
    model, params = tiny(name, **overrides)
    n = 6
    cont = np.random.default_rng(0).integers(7, VOCAB, (len(PROMPTS), n - 1)).astype(np.int32)
    inputs, lengths = right_pad(PROMPTS)

    @jax.jit
    def cached(params, inputs, lengths, cont):
        s = steps.start(model, params, inputs, lengths, max_new_tokens=n)

        def one(state, xs):
            tok, t = xs
            logits, state = steps.step(model, params, state, tok, s.positions + t)
            return state, logits

        _, rest = jax.lax.scan(one, s.state, (cont.T, jnp.arange(n - 1)))
        return jnp.concatenate([s.logits[:, None], rest.transpose(1, 0, 2)], axis=1)

    got = np.asarray(cached(params, inputs, lengths, jnp.asarray(cont)))  # [B, n, V]
    want = teacher_forced_logits(model, params, PROMPTS, cont)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-5)


# -------------------------------------------------------------------------------------------------
# Greedy decoding.


@pytest.mark.parametrize("name", ["gpt_tiny", "t5_tiny"])
def test_greedy_matches_reference_loop_and_single_prompts(name):
    """Batched greedy (mixed lengths, EOS) = the slow full-forward argmax loop per prompt, and the
    shortest prompt (most padded in the batch) alone = its row. Tokens exact; log-probs to 1e-4."""
    model, params = tiny(name)
    n = 6
    ref_toks, ref_lps = reference_greedy(model, params, PROMPTS, n)
    # EOS = the token row 0 emits at step 2 (first occurrence), so rows stop at different steps.
    row0 = ref_toks[0].tolist()
    eos = row0[2] if row0[2] not in row0[:2] else row0[0]
    res = generate(model, params, PROMPTS, max_new_tokens=n, eos_id=eos, pad_id=0)
    for b in range(len(PROMPTS)):
        ref, ref_lp = ref_toks[b].tolist(), ref_lps[b]
        k = ref.index(eos) + 1 if eos in ref else n
        assert res.tokens[b, :k].tolist() == ref[:k]
        assert res.tokens[b, k:].tolist() == [0] * (n - k)  # pad after EOS
        assert int(res.lengths[b]) == k
        np.testing.assert_allclose(res.log_probs[b, :k], ref_lp[:k], atol=1e-4)
        np.testing.assert_allclose(res.log_probs[b, k:], 0.0)
        np.testing.assert_allclose(res.scores[b], sum(ref_lp[:k]), atol=1e-3)
    assert int(res.lengths[0]) <= 3
    alone = generate(model, params, [PROMPTS[1]], max_new_tokens=n, eos_id=eos, pad_id=0)
    assert alone.tokens[0].tolist() == res.tokens[1].tolist()
    np.testing.assert_allclose(alone.log_probs[0], res.log_probs[1], atol=1e-5)


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
@pytest.mark.parametrize("name", ["gpt_tiny", "t5_tiny"])
def test_long_generation_across_cache_growth(name, strategy):
    """70 new tokens: the cache grows twice on the way (after 32 and 64 steps,
    `steps.segment_ends`). Each generated token's log-prob equals the uncached forward's on the
    generated prefix (1e-4), so no step lost sight of its history; greedy tokens are its argmax."""
    model, params = tiny(name)
    n = 70
    assert steps.segment_ends(n) == (32, 64, 70)
    res = generate(model, params, PROMPTS, strategy=strategy, beam_size=3, length_penalty=0.0,
                   max_new_tokens=n, eos_id=None)
    tokens = np.asarray(res.tokens)
    logp = log_softmax64(teacher_forced_logits(model, params, PROMPTS, tokens[:, :-1]))
    want = np.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(res.log_probs, want, atol=1e-4)
    if strategy == "greedy":  # the argmax, up to float near-ties
        assert np.all(want >= logp.max(axis=-1) - 1e-4)


# Slow tier: beam (14 s of CPU, a beam program per prompt width alone). The sorting, bucketing and
# filling are the greedy case's (the same code for every strategy); that a left-padded beam row of
# a ragged batch is its own prompt's is test_long_generation_across_cache_growth[gpt_tiny-beam]'s.
@pytest.mark.parametrize("strategy", ["greedy", pytest.param("beam", marks=pytest.mark.slow)])
def test_generate_batches_equals_each_prompt_alone(strategy):
    """Ragged prompts in batches of 2 (sorted by length, each batch padded to its own bucket,
    the last one filled up) give, in input order, what each prompt gives alone."""
    model, params = tiny("gpt_tiny")
    prompts = [[30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40], [20], [11, 12, 13], [5, 6], [9]]
    gen = GenerationConfig(strategy=strategy, beam_size=2, max_new_tokens=5, eos_id=None)
    got = generate_batches(model, params, prompts, gen, batch_size=2)
    for p, g in zip(prompts, got):
        alone = generate(model, params, [p], strategy=strategy, beam_size=2, max_new_tokens=5,
                         eos_id=None)
        assert g == alone.sequences()[0]
    assert [bucket_width(n, 11) for n in (1, 3, 8, 9, 11)] == [8, 8, 8, 11, 11]
    assert bucket_width(9, 40) == 16


@pytest.mark.parametrize("strategy", ["greedy", "sample", "beam"])
def test_loops_stop_when_every_row_has_finished(strategy):
    """The decoding loops stop stepping the model once every row has emitted EOS (beam search: once
    every example is settled), across the cache's segments: a toy step whose row ``b`` predicts
    EOS from its ``L_b``-th token on (every other token but one has log-prob −1e9) is called
    max L_b = 5 times, not ``max_new_tokens`` = 12 (beam: alive beams at −1e9 cannot beat the
    finished, so it settles there too), and each row ends at its ``L_b``."""
    from jaxformer.decode import beam_search, decode_loop

    ends_at, vocab, eos, n = jnp.array([2, 5, 3]), 8, 1, 12
    calls = []

    def logits_for(count):  # [B, V]: EOS from the row's L_b-th token on, else token 3
        tok = jnp.where(count >= ends_at - 1, eos, 3)
        return jnp.where(jnp.arange(vocab) == tok[:, None], 0.0, -1e9)

    def step_fn(state, tokens, positions, mask=None):
        jax.debug.callback(lambda c: calls.append(int(c)), state)
        logits = logits_for(state + 1)
        return (logits if tokens.ndim == 1 else jnp.repeat(logits[:, None], tokens.shape[1], 1),
                state + 1)

    loop = dict(max_new_tokens=n, eos_id=eos, pad_id=0, ends=(2, 4, 8, 12),
                grow=lambda state, end: state)
    positions = jnp.zeros((3,), jnp.int32)
    if strategy == "beam":
        res = beam_search(step_fn, logits_for(0), jnp.int32(0), positions, prefix_slots=1,
                          beam_size=2, alpha=0.0, **loop)
        jax.effects_barrier()
        assert len(calls) <= 5 + 2, calls
    else:
        res = decode_loop(step_fn, logits_for(0), jnp.int32(0), positions,
                          partial(sample, temperature=0.0 if strategy == "greedy" else 1.0),
                          rng=jax.random.key(0), **loop)
    jax.effects_barrier()
    assert len(calls) == 5, calls  # beam: settled when its last hypotheses end
    assert res.lengths.tolist() == [2, 5, 3]


REFILL_CASES = [  # (preset, overrides, distinct output lengths at least)
    ("gpt_tiny", {}, 4),                                        # learned positions
    ("gpt_tiny", {"position": "rope", "scan_layers": True}, 4),  # RoPE keys; cache [layers, B, …]
    ("t5_tiny", {}, 2),  # relative bias, cross K/V per row (random T5s repeat one token: 2)
]


@pytest.mark.parametrize("name,overrides,distinct", REFILL_CASES)
def test_refill_equals_each_prompt_alone(name, overrides, distinct):
    """Continuous batching (`jaxformer.decode.refill`): 7 prompts through 3 rows, refilled every 4
    steps, give what each prompt gives alone, in input order. The EOS is chosen so that outputs
    end at several different steps (many refills and cache compactions): greedy with an EOS
    equals the EOS-free output cut after its first EOS, which the test checks too."""
    model, params = tiny(name, **overrides)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(7, VOCAB, rng.integers(1, 9)).tolist() for _ in range(7)]
    n = 20
    free = [generate(model, params, [p], max_new_tokens=n, eos_id=None, pad_to=8
                     ).tokens[0].tolist() for p in prompts]

    def cut(row, eos):  # the output with this EOS: up to its first occurrence (dropped)
        return row[:row.index(eos)] if eos in row else row

    eos = max(range(7, VOCAB), key=lambda t: len({len(cut(r, t)) for r in free}))
    want = [cut(r, eos) for r in free]
    assert len({len(w) for w in want}) >= distinct, [len(w) for w in want]  # refills, compactions
    gen = GenerationConfig(max_new_tokens=n, eos_id=eos)
    got = generate_batches(model, params, prompts, gen, batch_size=3, refill=True, segment=4)
    assert got == want
    # sampling through the same loop: top_k=1 is the argmax
    sampled = generate_batches(model, params, prompts, dataclasses.replace(
        gen, strategy="sample", top_k=1), batch_size=3, refill=True, segment=4,
        rng=jax.random.key(0))
    assert sampled == want


def test_repeated_ngram_mask_matches_python(rng):
    """Every prefix length of random rows over 4 symbols (repeats are frequent), n = 0..4."""
    from jaxformer.decode import repeated_ngram_mask

    tokens = rng.integers(0, 4, (3, 9)).astype(np.int32)
    for n in range(5):
        for length in range(10):
            got = np.asarray(repeated_ngram_mask(jnp.asarray(tokens), length, n, 6))
            for r in range(3):
                want = repeating_tokens(tokens[r, :length].tolist(), n)
                assert set(np.flatnonzero(got[r]).tolist()) == want, (n, length, r)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt_tiny", "t5_tiny"])
def test_greedy_without_repeated_bigrams_matches_reference(name):
    """no_repeat_ngram_size=2: batched greedy = the reference argmax loop that masks repeating
    tokens (tokens exact, model log-probs to 1e-4), while plain greedy does repeat a bigram."""
    model, params = tiny(name)
    n = 10
    ref_toks, ref_lps = reference_greedy(model, params, PROMPTS, n, no_repeat=2)
    res = generate(model, params, PROMPTS, max_new_tokens=n, eos_id=None, no_repeat_ngram_size=2)
    assert res.tokens.tolist() == ref_toks.tolist()
    np.testing.assert_allclose(res.log_probs, ref_lps, atol=1e-4)
    free = generate(model, params, PROMPTS, max_new_tokens=n, eos_id=None).tokens.tolist()
    assert any(t[i] in repeating_tokens(t[:i], 2) for t in free for i in range(n))


def test_generate_on_sharded_params_matches_unsharded():
    """Params sharded by the logical rules on a (fsdp 2, tensor 4) mesh of 8 CPU devices: same
    tokens as the (unsharded) greedy reference."""
    from jaxformer.parallel.mesh import make_mesh
    from jaxformer.parallel.rules import param_shardings

    model, params = tiny("gpt_tiny")
    mesh = make_mesh({"data": 1, "fsdp": 2, "tensor": 4})
    shardings = param_shardings(model.logical_axes(), model.abstract(), mesh)
    sharded = jax.device_put(params, shardings)
    assert {len(x.sharding.device_set) for x in jax.tree.leaves(sharded)} == {8}
    res = generate(model, sharded, PROMPTS, max_new_tokens=6, eos_id=None)
    ref_toks, ref_lps = reference_greedy(model, params, PROMPTS, 6)
    assert res.tokens.tolist() == ref_toks.tolist()
    np.testing.assert_allclose(res.log_probs, ref_lps, atol=1e-4)


# -------------------------------------------------------------------------------------------------
# Sampling: pure filters against float64 NumPy, then the sampling loop.


def np_top_k(z: np.ndarray, k: int) -> np.ndarray:
    """Boolean mask of the k largest entries of a 1-D array."""
    keep = np.zeros(z.shape, bool)
    keep[np.argsort(-z, kind="stable")[:k]] = True
    return keep


def np_nucleus(z: np.ndarray, p: float) -> np.ndarray:
    """Boolean mask of the smallest most-likely set with softmax mass >= p (float64)."""
    probs = np.exp(z - z[np.isfinite(z)].max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    n_keep = int(np.searchsorted(np.cumsum(probs[order]), p - 1e-6) + 1)
    keep = np.zeros(z.shape, bool)
    keep[order[:n_keep]] = True
    return keep


def test_top_k_filter_keeps_exactly_the_k_largest(rng):
    logits = rng.normal(size=(5, 40)).astype(np.float32)
    for k in (1, 3, 40):
        out = np.asarray(top_k_filter(jnp.asarray(logits), k))
        for row, orow in zip(logits, out):
            np.testing.assert_array_equal(np.isfinite(orow), np_top_k(row, k))
            np.testing.assert_array_equal(orow[np.isfinite(orow)], row[np.isfinite(orow)])


def test_top_p_filter_keeps_the_nucleus(rng):
    logits = rng.normal(size=(6, 30)).astype(np.float32) * 2
    for p in (0.05, 0.5, 0.9, 1.0):
        out = np.asarray(top_p_filter(jnp.asarray(logits), p))
        for row, orow in zip(logits.astype(np.float64), out):
            np.testing.assert_array_equal(np.isfinite(orow), np_nucleus(row, p))


@pytest.mark.parametrize("scale", [2.0, 8.0])
def test_top_p_filter_on_a_large_vocabulary(rng, scale):
    """Vocabulary 1,000 > `NUCLEUS_CANDIDATES` (256), flat (the nucleus reaches past the top 256:
    the vocabulary is sorted) and peaked (it does not: no sort). Against float64 NumPy, leaving
    out tokens whose mass ranked above lies within 1e-4 of p (float32 sums of 1,000 terms)."""
    logits = rng.normal(size=(6, 1000)).astype(np.float32) * scale
    for p in (0.05, 0.5, 0.9):
        out = np.asarray(top_p_filter(jnp.asarray(logits), p))
        for row, orow in zip(logits.astype(np.float64), out):
            probs = np.exp(row - row.max())
            probs /= probs.sum()
            order = np.argsort(-row, kind="stable")
            above = np.empty_like(probs)
            above[order] = np.cumsum(probs[order]) - probs[order]
            sure = np.abs(above - p) > 1e-4
            np.testing.assert_array_equal(np.isfinite(orow)[sure], (above < p)[sure])
            np.testing.assert_array_equal(orow[np.isfinite(orow)], row[np.isfinite(orow)])


def test_top_k_top_p_filter_equals_the_two_filters_in_turn(rng):
    """The fused filter (the nucleus among the top k, no sort of the vocabulary) keeps the same
    tokens with the same logits as top-k then top-p, including ties (lower id first)."""
    logits = rng.normal(size=(6, 300)).astype(np.float32)
    logits[0, :40] = 1.5  # a tie straddling the top-k boundary
    for k, p in ((1, 0.5), (10, 0.3), (50, 0.9), (50, 1.0), (300, 0.7)):
        want = top_p_filter(top_k_filter(jnp.asarray(logits), k), p)
        np.testing.assert_array_equal(top_k_top_p_filter(jnp.asarray(logits), k, p), want)


def test_samples_follow_the_filtered_distribution(rng):
    """10k draws: only allowed tokens appear, frequencies match softmax(z/T) renormalised on the
    kept set within 0.02 (≈ 4 standard errors)."""
    logits = jnp.asarray(rng.normal(size=(1, 12)).astype(np.float32))
    keys = jax.random.split(jax.random.key(0), 10_000)
    for kw in [dict(top_k=3), dict(top_p=0.7), dict(temperature=0.5, top_k=5, top_p=0.9)]:
        draw = jax.vmap(lambda k, kw=kw: sample(k, logits, **kw)[0])(keys)
        z = np.asarray(logits[0], np.float64) / kw.get("temperature", 1.0)
        z = np.where(np_top_k(z, kw.get("top_k", 12)), z, -np.inf)  # temperature, top-k, top-p
        allowed = np_nucleus(z, kw.get("top_p", 1.0))
        want = np.where(allowed, np.exp(z - z.max()), 0.0)
        want /= want.sum()
        freq = np.bincount(np.asarray(draw), minlength=12) / len(keys)
        assert np.all(freq[~allowed] == 0), kw
        np.testing.assert_allclose(freq, want, atol=0.02, err_msg=str(kw))


def test_argmax_equals_jnp_argmax_with_ties_and_nans(rng):
    """`sampling.argmax` (max, then the smallest id reaching it) = `jnp.argmax`: random rows, rows
    of few values (ties: the first), rows with NaNs (the first NaN), -inf rows, any leading shape."""
    from jaxformer.decode import argmax
    x = rng.normal(size=(6, 3, 50)).astype(np.float32)
    x[0] = rng.integers(0, 3, size=(3, 50))       # many ties
    x[1, 0, [7, 20]] = np.nan                      # NaN: the first one
    x[1, 1, :] = -np.inf
    x[2, 2, 49] = np.inf
    want = np.argmax(np.where(np.isnan(x), np.inf, x), axis=-1)  # NumPy argmax, NaN as largest
    got = argmax(jnp.asarray(x))
    assert got.dtype == jnp.int32 and got.tolist() == want.tolist()
    assert got.tolist() == jnp.argmax(jnp.asarray(x), axis=-1).tolist()


def test_temperature_to_zero_is_argmax(rng):
    logits = jnp.asarray(rng.normal(size=(200, 50)).astype(np.float32))
    argmax = np.asarray(jnp.argmax(logits, -1))
    assert np.array_equal(np.asarray(sample(jax.random.key(1), logits, temperature=0)), argmax)
    cold = sample(jax.random.key(1), logits, temperature=1e-3)
    assert np.array_equal(np.asarray(cold), argmax)
    np.testing.assert_allclose(apply_temperature(logits, 0.5), np.asarray(logits) * 2, rtol=1e-6)


def test_sampled_generation_is_reproducible_and_tends_to_greedy():
    model, params = tiny("gpt_tiny")
    kw = dict(max_new_tokens=6, eos_id=None)
    greedy = reference_greedy(model, params, PROMPTS, 6)[0]
    s1 = generate(model, params, PROMPTS, strategy="sample", rng=jax.random.key(7), **kw)
    s2 = generate(model, params, PROMPTS, strategy="sample", rng=jax.random.key(7), **kw)
    s3 = generate(model, params, PROMPTS, strategy="sample", rng=jax.random.key(8), **kw)
    assert s1.tokens.tolist() == s2.tokens.tolist()
    assert s1.tokens.tolist() != s3.tokens.tolist()
    assert s1.tokens.tolist() != greedy.tolist()  # T = 1 samples do differ from argmax
    cold = generate(model, params, PROMPTS, strategy="sample", temperature=1e-4,
                    rng=jax.random.key(7), **kw)
    assert cold.tokens.tolist() == greedy.tolist()


# -------------------------------------------------------------------------------------------------
# Validation, text API, CLI.


def test_sampling_without_rng_draws_from_the_documented_default_key():
    """Issue 60: ``generate_text(strategy="sample")`` as docs/huggingface.md writes it needed ``rng``.
    Without one, sampling draws from ``key(DEFAULT_SEED)``: the same samples as passing that key,
    other samples than another key."""
    from jaxformer.decode.api import DEFAULT_SEED

    model, params = tiny("gpt_tiny")
    prompts, kw = [[5, 6], [7]], dict(strategy="sample", max_new_tokens=6, temperature=2.0)
    default = generate(model, params, prompts, **kw).sequences()
    assert default == generate(model, params, prompts, rng=jax.random.key(DEFAULT_SEED), **kw).sequences()
    assert default != generate(model, params, prompts, rng=jax.random.key(1), **kw).sequences()


def test_bad_inputs_raise_clear_errors():
    model, params = tiny("gpt_tiny")
    with pytest.raises(ValueError, match="strategy"):
        generate(model, params, [[5]], strategy="nucleus")
    with pytest.raises(ValueError, match="empty"):
        generate(model, params, [[5], []])
    with pytest.raises(ValueError, match=r"one prompt is \[\[5, 6\]\], not \[5, 6\]"):
        generate(model, params, [5, 6])
    with pytest.raises(ValueError, match=r"integer token ids, got e.g. \[5.7\]"):
        generate(model, params, [[5.7, 6]])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        generate(model, params, [[5, VOCAB]])
    with pytest.raises(ValueError, match="max_len"):
        generate(model, params, [[5] * 100], max_new_tokens=29)
    with pytest.raises(ValueError, match="top_p"):
        GenerationConfig(top_p=1.5)
    with pytest.raises(ValueError, match="temperature"):
        apply_temperature(jnp.zeros(3), 0.0)
    with pytest.raises(ValueError, match="top_k"):
        top_k_filter(jnp.zeros(3), 0)
    bert = build_model(ModelConfig.from_dict(preset("bert_tiny")))
    with pytest.raises(ValueError, match="cannot generate"):
        generate(bert, {}, [[5]])


class CharTokenizer:
    """Letters a–z ↔ ids 7–32, the interface `generate_text` expects."""

    special = SpecialTokens(VOCAB)

    def encode(self, text: str) -> list[int]:
        return [7 + ord(c) - ord("a") for c in text]

    def decode(self, ids) -> str:
        return "".join(chr(ord("a") + i - 7) if 7 <= i < 33 else f"<{i}>" for i in ids)


def test_generate_text_round_trips_through_the_tokenizer():
    model, params = tiny("t5_tiny")
    tok = CharTokenizer()
    texts = ["abc", "hello"]
    out = generate_text(model, params, tok, texts, max_new_tokens=5)
    ids = [tok.encode(t) + [tok.special.eos_id] for t in texts]  # sources end with EOS
    want = generate(model, params, ids, max_new_tokens=5, eos_id=1, pad_id=0)
    assert out == [tok.decode(s) for s in want.sequences(strip_eos_id=1)]


@pytest.mark.slow
def test_cli_prints_generations_of_a_saved_workdir(tmp_path, capsys):
    """A workdir as the trainer leaves it (config.json, tokenizer.model, Orbax checkpoint)."""
    import optax

    from jaxformer.checkpoint import Checkpointer, save_run_config
    from jaxformer.cli.generate import main
    from jaxformer.data.tokenizer import Tokenizer, train_sentencepiece
    from jaxformer.train.state import TrainState

    texts = ["the cat sat on the mat", "a dog ran in the park", "the sun is hot today"] * 20
    tok = Tokenizer(train_sentencepiece(texts, vocab_size=300, num_sentinels=0))
    tok.save(tmp_path / "tokenizer.model")
    model, params = tiny("gpt_tiny", vocab_size=tok.vocab_size)
    save_run_config(tmp_path, {"model": dataclasses.asdict(model.cfg)})
    ckpt = Checkpointer(tmp_path, async_save=False)
    ckpt.save(3, TrainState(step=jnp.int32(3), params=params, opt_state=optax.sgd(0.1).init(params),
                            rng=jax.random.key_data(jax.random.key(0))))
    ckpt.close()
    main(["--workdir", str(tmp_path), "--prompt", "the cat", "--prompt", "a dog ran",
          "--max_new_tokens", "6", "--strategy", "beam", "--beam_size", "2"])
    captured = capsys.readouterr()
    printed = captured.out
    assert "attention xla (auto); decoding with a cache: xla" in captured.err  # start-up line
    want = generate_text(model, params, tok, ["the cat", "a dog ran"], max_new_tokens=6,
                         strategy="beam", beam_size=2)
    for prompt, text in zip(["the cat", "a dog ran"], want):
        assert f"PROMPT: {prompt}\nOUTPUT: {text}\n" in printed
    # bad input is one line on stderr and exit status 2, not a traceback
    for args, message in [
        (["--workdir", str(tmp_path / "nope"), "--prompt", "x"], "config.json not found"),
        (["--workdir", str(tmp_path), "--prompt", ""], "add --add_bos"),
        (["--workdir", str(tmp_path), "--prompt", "the", "--max_new_tokens", "5000"], "max_len"),
        (["--workdir", str(tmp_path), "--prompt_ids", "5,x"], "comma-separated integers"),
    ]:
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith("python -m jaxformer.cli.generate: error: ") and message in err, err
    assert main(["--workdir", str(tmp_path), "--prompt", "the", "--max_new_tokens", "2",
                 "--top_k", "5"]) == 0  # greedy ignores top_k, and says so
    assert "note: --top_k applies to --strategy sample; ignored with --strategy greedy" in \
        capsys.readouterr().err
