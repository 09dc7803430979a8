"""jaxformer.ops.moe against a float64 NumPy reference written from the papers' definitions:
capacity and in-order dropping (GShard §2.2, Switch eq. 3), dropless = capacity ∞, the
load-balancing loss (Switch eq. 4) and the router z-loss (ST-MoE eq. 5)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.ops import moe

E, D, F = 4, 8, 12


def _params(seed=0, gated=False, bias=True):
    k = jax.random.split(jax.random.key(seed), 8)
    p = {"router": {"kernel": jax.random.normal(k[0], (D, E))},
         "wi": {"kernel": 0.3 * jax.random.normal(k[1], (E, D, F))},
         "wo": {"kernel": 0.3 * jax.random.normal(k[2], (E, F, D))}}
    if gated:
        p["wi_gate"] = {"kernel": 0.3 * jax.random.normal(k[3], (E, D, F))}
    if bias:
        p["wi"]["bias"] = 0.1 * jax.random.normal(k[4], (E, F))
        p["wo"]["bias"] = 0.1 * jax.random.normal(k[5], (E, D))
    return p


def _np(tree):
    return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def _gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / np.sqrt(2)))


def ref_moe(p, x, k, cf, *, norm_topk, act, mask=None, dropless=False):
    """Loops over groups, choices and tokens in the documented order (float64)."""
    p, x = _np(p), np.asarray(x, np.float64)
    g_, t_, _ = x.shape
    mask = np.ones((g_, t_), bool) if mask is None else np.asarray(mask)
    logits = x @ p["router"]["kernel"]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    order = np.argsort(-probs, axis=-1, kind="stable")[..., :k]
    gates = np.take_along_axis(probs, order, -1)
    if norm_topk:
        gates = gates / gates.sum(-1, keepdims=True)
    cap = math.inf if dropless else max(1, math.ceil(cf * t_ * k / E))
    y = np.zeros_like(x)
    kept = np.zeros((g_, t_, k), bool)
    for g in range(g_):
        used = [0] * E
        for c in range(k):  # first choices of every token, then second choices, ...
            for t in range(t_):
                if not mask[g, t]:
                    continue
                e = order[g, t, c]
                if used[e] < cap:
                    used[e] += 1
                    kept[g, t, c] = True
                    h = x[g, t] @ p["wi"]["kernel"][e] + p["wi"].get("bias", np.zeros((E, F)))[e]
                    h = act(h)
                    if "wi_gate" in p:
                        h = h * (x[g, t] @ p["wi_gate"]["kernel"][e])
                    out = h @ p["wo"]["kernel"][e] + p["wo"].get("bias", np.zeros((E, D)))[e]
                    y[g, t] += gates[g, t, c] * out
    m = mask.astype(np.float64)
    n = m.sum()
    f = np.zeros(E)
    for c in range(k):
        f += np.einsum("gte,gt->e", np.eye(E)[order[..., c]], m) / n
    pbar = np.einsum("gte,gt->e", probs, m) / n
    aux = E * np.sum(f * pbar)
    lse = np.log(np.exp(logits).sum(-1))
    z = np.sum(m * lse ** 2) / n
    dropped = 1.0 - (kept * m[..., None]).sum() / (n * k)
    return y, aux, z, dropped, kept


def _run(p, x, k, cf, *, dropless=False, mask=None, act="gelu"):
    return moe.moe_ffn(p, x, experts_per_token=k, capacity_factor=cf, dropless=dropless,
                       activation=act, norm_topk_prob=k > 1, token_mask=mask)


@pytest.mark.parametrize("tokens,k,cf", [(6, 1, 1.0), (6, 2, 1.25), (7, 2, 0.5), (1, 2, 1.0),
                                         (5, 1, 0.1)])
def test_capacity_is_ceil_of_cf_tokens_k_over_experts(tokens, k, cf):
    assert moe.expert_capacity(tokens, k, E, cf) == max(1, math.ceil(cf * tokens * k / E))


@pytest.mark.parametrize("k,cf,gated", [(1, 1.0, False), (2, 1.0, True), (2, 0.5, False),
                                        (1, 0.5, True)])
def test_capacity_path_drops_in_order_like_the_reference(k, cf, gated):
    p = _params(1, gated=gated)
    x = jax.random.normal(jax.random.key(2), (3, 10, D))
    mask = jnp.arange(10)[None, :] < jnp.array([[10], [7], [3]])  # padded rows take no capacity
    y, stats = _run(p, x, k, cf, mask=mask)
    ref_y, aux, z, dropped, _ = ref_moe(p, x, k, cf, norm_topk=k > 1, act=_gelu, mask=mask)
    assert 0 < dropped < 1 or cf >= 1.0  # the small capacities drop something
    np.testing.assert_allclose(y, ref_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(stats.aux_loss, aux, rtol=1e-6)
    np.testing.assert_allclose(stats.z_loss, z, rtol=1e-6)
    np.testing.assert_allclose(stats.dropped, dropped, atol=1e-7)


def test_positions_count_first_choices_before_second_choices():
    experts = jnp.array([[[0, 1], [0, 2], [1, 0]]])  # [G=1, T=3, k=2]
    # expert 0: t0 (1st), t1 (1st), then t2's second choice -> 2; expert 1: t2 (1st) 0, t0 (2nd) 1
    np.testing.assert_array_equal(moe.positions_in_expert(experts, 3)[0], [[0, 1], [1, 0], [0, 2]])


@pytest.mark.parametrize("k,gated", [(1, False), (2, True)])
def test_dropless_equals_unlimited_capacity(k, gated):
    p = _params(3, gated=gated)
    x = jax.random.normal(jax.random.key(4), (2, 9, D))
    y_dropless, s_dropless = _run(p, x, k, 1.0, dropless=True)
    y_unlimited, s_unlimited = _run(p, x, k, E / k)  # C = T: no expert can overflow
    ref_y = ref_moe(p, x, k, 1.0, norm_topk=k > 1, act=_gelu, dropless=True)[0]
    assert float(s_unlimited.dropped) == 0.0
    np.testing.assert_allclose(y_dropless, y_unlimited, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y_dropless, ref_y, rtol=1e-5, atol=1e-5)
    gd = jax.grad(lambda q: jnp.sum(_run(q, x, k, 1.0, dropless=True)[0] ** 2))(p)
    gu = jax.grad(lambda q: jnp.sum(_run(q, x, k, E / k)[0] ** 2))(p)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), gd, gu)


@pytest.mark.parametrize("k", [1, 2])
def test_uniform_router_gives_the_minimum_aux_loss(k):
    """P_i = 1/E for every expert, so E·Σ f_i P_i = Σ f_i = k whatever the choices (k = 1: Switch's
    minimum; the weighted loss is α·k)."""
    p = _params(5)
    p["router"]["kernel"] = jnp.zeros((D, E))
    x = jax.random.normal(jax.random.key(6), (2, 8, D))
    _, stats = _run(p, x, k, 1.0)
    np.testing.assert_allclose(stats.aux_loss, float(k), rtol=1e-6)
    np.testing.assert_allclose(stats.z_loss, np.log(E) ** 2, rtol=1e-6)


def test_aux_loss_is_switch_eq4_on_a_skewed_router():
    probs = jnp.array([[[0.7, 0.1, 0.1, 0.1], [0.6, 0.2, 0.1, 0.1], [0.1, 0.1, 0.1, 0.7]]])
    experts = jnp.argmax(probs, -1)[..., None]
    f = np.array([2, 0, 0, 1]) / 3
    pbar = np.asarray(probs[0]).mean(0)
    np.testing.assert_allclose(moe.load_balancing_loss(probs, experts), E * np.sum(f * pbar),
                               rtol=1e-6)


def test_router_runs_in_float32_and_output_keeps_the_compute_dtype():
    p = _params(7)
    x = jax.random.normal(jax.random.key(8), (2, 5, D)).astype(jnp.bfloat16)
    logits = moe.router_logits(p["router"]["kernel"], x)
    y, stats = _run(p, x, 2, 1.0)
    assert logits.dtype == jnp.float32 and stats.aux_loss.dtype == jnp.float32
    assert y.dtype == jnp.bfloat16


def test_jitter_multiplies_router_inputs_within_its_band():
    p = _params(9)
    x = jax.random.normal(jax.random.key(10), (1, 4, D))
    plain = moe.router_logits(p["router"]["kernel"], x)
    noisy = moe.router_logits(p["router"]["kernel"], x, jitter=0.1, rng=jax.random.key(0))
    assert not np.allclose(plain, noisy)
    assert np.allclose(moe.router_logits(p["router"]["kernel"], x, jitter=0.1), plain)  # no key


def test_load_sums_to_one_and_counts_assignments():
    p = _params(11)
    x = jax.random.normal(jax.random.key(12), (2, 6, D))
    _, stats = _run(p, x, 2, 1.0)
    experts = moe.top_k_gates(moe.router_logits(p["router"]["kernel"], x), 2, norm_topk_prob=True)[1]
    want = np.bincount(np.asarray(experts).ravel(), minlength=E) / experts.size
    np.testing.assert_allclose(stats.load, want, rtol=1e-6)
