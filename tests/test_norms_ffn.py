"""Norms, dense and feed-forward ops against float64 NumPy formulas."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from jaxformer.ops import (
    dense,
    dropout,
    ffn,
    get_activation,
    layer_norm,
    normalize,
    rms_norm,
    token_dropout,
)

_erf = np.vectorize(math.erf)
NP_ACT = {
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    "gelu_tanh": lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
}


def np_layer_norm(x, scale=None, bias=None, eps=1e-6):
    x = np.asarray(x, np.float64)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps)
    return y * (1.0 if scale is None else scale) + (0.0 if bias is None else bias)


def np_rms_norm(x, scale=None, eps=1e-6):
    x = np.asarray(x, np.float64)
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * (1.0 if scale is None else scale)


def test_layer_norm_and_rms_norm_match_numpy(rng):
    x = (rng.normal(size=(3, 5, 16)) * 3 + 1).astype(np.float32)
    scale = rng.normal(size=16).astype(np.float32)
    bias = rng.normal(size=16).astype(np.float32)
    for eps in (1e-6, 1e-2):
        np.testing.assert_allclose(layer_norm(x, scale, bias, eps=eps),
                                   np_layer_norm(x, scale, bias, eps), atol=1e-5)
        np.testing.assert_allclose(layer_norm(x, eps=eps), np_layer_norm(x, eps=eps), atol=1e-5)
        np.testing.assert_allclose(rms_norm(x, scale, eps=eps), np_rms_norm(x, scale, eps),
                                   atol=1e-5)
        np.testing.assert_allclose(rms_norm(x, eps=eps), np_rms_norm(x, eps=eps), atol=1e-5)
    np.testing.assert_allclose(normalize("layer", x, {"scale": scale, "bias": bias}, eps=1e-6),
                               np_layer_norm(x, scale, bias), atol=1e-5)
    np.testing.assert_allclose(normalize("rms", x, {"scale": scale}, eps=1e-6),
                               np_rms_norm(x, scale), atol=1e-5)
    with pytest.raises(ValueError, match="norm kind"):
        normalize("batch", x, {}, eps=1e-6)


def test_norms_dtype_gradients_jit_and_vmap(rng):
    x = rng.normal(size=(2, 4, 8)).astype(np.float32)
    scale, bias = rng.normal(size=8).astype(np.float32), rng.normal(size=8).astype(np.float32)
    xb = jnp.asarray(x, jnp.bfloat16)
    assert layer_norm(xb, scale, bias).dtype == jnp.bfloat16
    assert rms_norm(xb, scale).dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(layer_norm(xb, scale, bias), np.float32),
                               np_layer_norm(np.asarray(xb, np.float32), scale, bias), atol=6e-2)
    np.testing.assert_allclose(jax.jit(layer_norm)(x, scale, bias), layer_norm(x, scale, bias),
                               atol=1e-6)
    np.testing.assert_allclose(jax.vmap(rms_norm, in_axes=(0, None))(x, scale), rms_norm(x, scale),
                               atol=1e-6)
    with jax.enable_x64(True):
        args = tuple(jnp.asarray(a, jnp.float64) for a in (x, scale, bias))
        check_grads(lambda x, s, b: layer_norm(x, s, b), args, order=1, modes=("fwd", "rev"))
        check_grads(lambda x, s: rms_norm(x, s), args[:2], order=1, modes=("rev",))


def test_dense_contracts_several_axes(rng):
    x = rng.normal(size=(2, 3, 4, 5)).astype(np.float32)
    kernel = rng.normal(size=(4, 5, 6)).astype(np.float32)
    bias = rng.normal(size=6).astype(np.float32)
    got = dense({"kernel": kernel, "bias": bias}, x, in_axes=2)
    want = np.einsum("bthd,hde->bte", x.astype(np.float64), kernel) + bias
    np.testing.assert_allclose(got, want, atol=1e-4)
    got = dense({"kernel": kernel[0]}, x[..., 0, :])  # [b, t, 5] x [5, 6]
    np.testing.assert_allclose(got, x[..., 0, :].astype(np.float64) @ kernel[0], atol=1e-4)
    # float32 parameters, bfloat16 compute
    xb = jnp.asarray(x[..., 0, :], jnp.bfloat16)
    assert dense({"kernel": kernel[0]}, xb).dtype == jnp.bfloat16


def _ffn_params(rng, d, f, gated, bias):
    p = {"wi": {"kernel": rng.normal(size=(d, f)).astype(np.float32) / np.sqrt(d)},
         "wo": {"kernel": rng.normal(size=(f, d)).astype(np.float32) / np.sqrt(f)}}
    if gated:
        p["wi_gate"] = {"kernel": rng.normal(size=(d, f)).astype(np.float32) / np.sqrt(d)}
    if bias:
        p["wi"]["bias"] = rng.normal(size=f).astype(np.float32)
        p["wo"]["bias"] = rng.normal(size=d).astype(np.float32)
    return p


def np_ffn(p, x, act):
    x = np.asarray(x, np.float64)
    lin = lambda q, h: h @ q["kernel"] + q.get("bias", 0.0)
    h = NP_ACT[act](lin(p["wi"], x))
    if "wi_gate" in p:
        h = h * lin(p["wi_gate"], x)
    return lin(p["wo"], h)


@pytest.mark.parametrize("act,gated,bias", [("relu", False, True), ("gelu", False, True),
                                            ("gelu_tanh", False, False), ("silu", True, False),
                                            ("gelu", True, True)])
def test_ffn_matches_numpy(rng, act, gated, bias):
    p = _ffn_params(rng, 8, 16, gated, bias)
    x = rng.normal(size=(2, 3, 8)).astype(np.float32)
    np.testing.assert_allclose(ffn(p, x, activation=act), np_ffn(p, x, act), atol=1e-5, rtol=1e-5)


def test_ffn_gradients_dropout_and_dtype(rng):
    p = _ffn_params(rng, 4, 8, True, True)
    x = rng.normal(size=(2, 4)).astype(np.float32)
    with jax.enable_x64(True):
        p64 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), p)
        check_grads(lambda p, x: ffn(p, x, activation="silu"), (p64, jnp.asarray(x, jnp.float64)),
                    order=1, modes=("fwd", "rev"))
    key = jax.random.key(0, impl="rbg")  # same semantics as threefry, faster to compile on CPU
    a = ffn(p, x, activation="relu", dropout_rate=0.5, dropout_rng=key)
    again = ffn(p, x, activation="relu", dropout_rate=0.5, dropout_rng=key)
    np.testing.assert_array_equal(a, again)
    assert not np.allclose(a, ffn(p, x, activation="relu"))
    np.testing.assert_array_equal(ffn(p, x, activation="relu", dropout_rate=0.5),
                                  ffn(p, x, activation="relu"))  # no rng: deterministic
    assert ffn(p, jnp.asarray(x, jnp.bfloat16), activation="gelu").dtype == jnp.bfloat16
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        get_activation("swish")


def test_dropout_rate_may_be_traced():
    """A rate passed through `jit` (traced) drops the same elements as the same Python float, with
    the same scaling; traced 0 is the identity and traced 1 gives zeros with finite gradients."""
    x = jnp.asarray(np.random.default_rng(0).standard_normal((64, 32)), jnp.float32)
    key = jax.random.key(3)
    traced = jax.jit(dropout)
    np.testing.assert_allclose(traced(x, 0.3, key), dropout(x, 0.3, key), rtol=1e-6)
    dropped = np.asarray(traced(x, 0.3, key)) == 0
    assert abs(dropped.mean() - 0.3) < 4 * np.sqrt(0.3 * 0.7 / dropped.size)
    np.testing.assert_array_equal(traced(x, 0.0, key), x)
    np.testing.assert_array_equal(traced(x, 1.0, key), np.zeros_like(x))
    grad = jax.grad(lambda r: jnp.sum(traced(x, r, key) ** 2))(1.0)
    assert np.isfinite(grad)
    tokens = jax.jit(token_dropout)(x[None], 0.5, key)
    np.testing.assert_array_equal(tokens, token_dropout(x[None], 0.5, key))
