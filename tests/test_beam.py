"""Beam search against a plain-Python beam search over the uncached full forward, greedy, and a
trained model. Tiny float32 models, dropout off; tolerances stated per test."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_decode import (
    NO_DROPOUT,
    PROMPTS,
    log_softmax64,
    random_params,
    reference_greedy,
    repeating_tokens,
    teacher_forced_logits,
    tiny,
)

from jaxformer.config import ModelConfig
from jaxformer.decode import generate, length_penalty
from jaxformer.decode.beam import path_mask
from jaxformer.models import build_model
from jaxformer.models.presets import preset
from jaxformer.ops.losses import cross_entropy_with_integer_labels


def gnmt(length: int, alpha: float) -> float:
    return ((5 + length) / 6) ** alpha


def test_length_penalty_is_gnmt():
    for n in (1, 4, 17):
        for alpha in (0.0, 0.6, 1.0):
            np.testing.assert_allclose(length_penalty(n, alpha), gnmt(n, alpha), rtol=1e-6)


def test_path_mask_follows_each_beams_ancestry():
    """Slot P + t·k + c is visible to beam j at step i iff t <= i and beam j's token of step t
    was appended in column c; the P prompt slots always are (checked by loops)."""
    rng = np.random.default_rng(0)
    b, k, n, p, i = 2, 3, 5, 4, 2
    ancestry = rng.integers(0, k, (b, k, n)).astype(np.int32)
    got = np.asarray(path_mask(jnp.asarray(ancestry), jnp.int32(i), p))
    want = np.zeros((b, k, p + n * k), bool)
    want[:, :, :p] = True
    for bb in range(b):
        for j in range(k):
            for t in range(i + 1):
                want[bb, j, p + t * k + ancestry[bb, j, t]] = True
    np.testing.assert_array_equal(got, want)


def reference_beam(model, params, prompt, k, n, alpha, eos, no_repeat=0):
    """Beam search written out over Python lists, scoring with the uncached full forward in float64.

    Same rules as the jitted version: keep the best 2k expansions; those ending in EOS (all of them
    at step n) join the finished pool scored logp / lp(len); the best k others stay alive. No early
    stopping: it runs all n steps, so agreement also checks that early stopping loses nothing.
    Returns the finished pool [(score, tokens, logp)] best first.
    """
    alive = [([], 0.0)]
    finished = []
    for i in range(n):
        cont = np.zeros((k, n), np.int32)  # always k rows: one shape, one compile
        for j, (toks, _) in enumerate(alive):
            cont[j, :len(toks)] = toks
        logits = teacher_forced_logits(model, params, [prompt] * k, cont)[:len(alive), i]
        logp = log_softmax64(logits)
        cands = [(lp + logp[j, v], toks + [v]) for j, (toks, lp) in enumerate(alive)
                 for v in range(logp.shape[1]) if v not in repeating_tokens(toks, no_repeat)]
        cands.sort(key=lambda c: -c[0])
        top = cands[:2 * k]
        finished += [(s / gnmt(i + 1, alpha), t, s) for s, t in top if t[-1] == eos or i == n - 1]
        finished = sorted(finished, key=lambda f: -f[0])[:k]
        alive = [(t, s) for s, t in top if t[-1] != eos][:k]
    return finished


@pytest.mark.slow
@pytest.mark.parametrize("name,scan,batch,k", [("gpt_tiny", True, 1, 2), ("t5_tiny", False, 2, 2)])
def test_beam_matches_python_reference(name, scan, batch, k):
    """EOS and length penalty 0.6; the beams' shared cache (each beam a path of slots,
    `beam.path_mask`) on scanned layers (leaves `[layers, B, ...]`) and unrolled ones, for a
    decoder-only and an encoder-decoder model. Pools equal: tokens exact, scores to 1e-4."""
    model, params = tiny(name, scan_layers=scan)
    n, alpha = 5, 0.6
    prompts = PROMPTS[:batch]
    # EOS = a token greedy emits early, so hypotheses do finish before n.
    eos = int(reference_greedy(model, params, prompts, 2)[0][0, 1])
    res = generate(model, params, prompts, strategy="beam", beam_size=k, max_new_tokens=n,
                   length_penalty=alpha, eos_id=eos, pad_id=0)
    for b, prompt in enumerate(prompts):
        ref = reference_beam(model, params, prompt, k, n, alpha, eos)
        assert len(ref) == k
        for j, (score, toks, logp) in enumerate(ref):
            assert res.beam_tokens[b, j].tolist() == toks + [0] * (n - len(toks))
            assert int(res.beam_lengths[b, j]) == len(toks)
            np.testing.assert_allclose(res.beam_scores[b, j], score, atol=1e-4)
            np.testing.assert_allclose(res.beam_log_probs[b, j].sum(), logp, atol=1e-4)
        assert res.tokens[b].tolist() == res.beam_tokens[b, 0].tolist()
    assert any(eos in t for t in res.beam_tokens.tolist()[0])  # EOS handling was exercised


@pytest.mark.slow
@pytest.mark.parametrize("name,k", [("gpt_tiny", 2), ("t5_tiny", 3)])
def test_beam_without_repeated_ngrams_matches_python_reference(name, k):
    """no_repeat_ngram_size=2 over 8 steps: the pools equal the Python beam search that skips
    expansions repeating a bigram of their own beam, and the unconstrained search did repeat one
    (so the constraint changed the result)."""
    model, params = tiny(name)
    n, alpha, prompt = 8, 0.6, PROMPTS[0]
    res = generate(model, params, [prompt], strategy="beam", beam_size=k, max_new_tokens=n,
                   length_penalty=alpha, eos_id=None, no_repeat_ngram_size=2)
    ref = reference_beam(model, params, prompt, k, n, alpha, None, no_repeat=2)
    for j, (score, toks, logp) in enumerate(ref):
        assert res.beam_tokens[0, j].tolist() == toks
        assert all(repeating_tokens(toks[:i], 2).isdisjoint({toks[i]}) for i in range(n))
        np.testing.assert_allclose(res.beam_scores[0, j], score, atol=1e-4)
        np.testing.assert_allclose(res.beam_log_probs[0, j].sum(), logp, atol=1e-4)
    free = generate(model, params, [prompt], strategy="beam", beam_size=k, max_new_tokens=n,
                    length_penalty=alpha, eos_id=None).beam_tokens[0].tolist()
    assert any(t[i] in repeating_tokens(t[:i], 2) for t in free for i in range(n))


@pytest.mark.parametrize("name", ["gpt_tiny", "t5_tiny"])
def test_beam_width_one_is_greedy(name):
    """k = 1, no length penalty: the slow greedy reference (tokens exact, log-probs to 1e-4)."""
    model, params = tiny(name)
    n = 6
    ref_toks, ref_lps = reference_greedy(model, params, PROMPTS, n)
    res = generate(model, params, PROMPTS, strategy="beam", beam_size=1, max_new_tokens=n,
                   length_penalty=0.0, eos_id=None)
    assert res.tokens.tolist() == ref_toks.tolist()
    np.testing.assert_allclose(res.log_probs, ref_lps, atol=1e-4)
    np.testing.assert_allclose(res.scores, ref_lps.sum(-1), atol=1e-3)


# A Markov chain with a garden path: from A, B is likelier (0.6) than C (0.4), but B is followed by
# one of 8 tokens uniformly while C is always followed by E. Greedy takes B (log p per 3 tokens
# ≈ ln .6 + ln 1/8 = -2.59); beam search finds C E (ln .4 = -0.92).
A, B, C, E = 3, 4, 5, 6
D = list(range(7, 15))


def toy_corpus(rng, rows: int, length: int) -> np.ndarray:
    out = np.zeros((rows, length), np.int32)
    for r in range(rows):
        seq = []
        while len(seq) < length:
            seq += [A] + ([B, int(rng.choice(D))] if rng.random() < 0.6 else [C, E])
        out[r] = seq[:length]
    return out


@pytest.mark.slow
def test_beam_beats_greedy_on_a_trained_model():
    """Train a tiny GPT (100 Adam steps) on the chain; beam log-prob >= greedy's for every prompt
    (and > 0.5 nats better on one: the garden path is avoided), and the returned log-probs equal the
    full forward's scoring (1e-4)."""
    cfg = ModelConfig.from_dict(preset("gpt_tiny", vocab_size=16, max_len=64, **NO_DROPOUT))
    model = build_model(cfg)
    data = jnp.asarray(toy_corpus(np.random.default_rng(0), 64, 25))
    params = random_params(model, std=0.02)
    tx = optax.adam(3e-3)

    @jax.jit
    def train_step(params, opt, batch):
        def loss(p):
            logits = model.apply(p, batch[:, :-1])
            return cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, value

    opt = tx.init(params)
    for step in range(100):
        params, opt, loss = train_step(params, opt, data[(step % 4) * 16:(step % 4 + 1) * 16])
    assert float(loss) < 0.9  # entropy of the chain ≈ 0.64 nats/token
    prompts = [[A, B, D[0], A], [A, C, E, A, B, D[3], A]]
    greedy_lps = reference_greedy(model, params, prompts, 6)[1]  # = greedy decoding (test_decode)
    beam = generate(model, params, prompts, strategy="beam", beam_size=4, max_new_tokens=6,
                    eos_id=None, length_penalty=0.0)
    gain = np.asarray(beam.scores) - greedy_lps.sum(-1)
    assert np.all(gain >= -1e-4) and gain.max() > 0.5, gain
    tokens = np.asarray(beam.tokens)
    logits = teacher_forced_logits(model, params, prompts, tokens[:, :-1])
    want = np.take_along_axis(log_softmax64(logits), tokens[..., None], -1)[..., 0]
    np.testing.assert_allclose(beam.log_probs, want, atol=1e-4)
