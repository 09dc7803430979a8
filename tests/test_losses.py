"""Cross-entropy with label smoothing and z-loss against H(q, p) computed in float64 NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from jaxformer.ops import (
    cross_entropy_with_integer_labels,
    weighted_accuracy,
    weighted_cross_entropy,
)


def np_loss(logits, labels, eps=0.0, z=0.0):
    """H(q, softmax(logits)) with q = 1−ε on the label and ε/(V−1) elsewhere, plus z·log²Z."""
    logits = np.asarray(logits, np.float64)
    v = logits.shape[-1]
    log_z = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    logp = logits - log_z[..., None]
    q = np.full(logits.shape, eps / (v - 1))
    np.put_along_axis(q, labels[..., None], 1.0 - eps, axis=-1)
    assert np.allclose(q.sum(-1), 1.0)
    return -(q * logp).sum(-1) + z * log_z**2


@pytest.mark.parametrize("eps,z", [(0.0, 0.0), (0.1, 0.0), (0.0, 1e-4), (0.2, 1e-2)])
def test_cross_entropy_matches_formula(rng, eps, z):
    logits = (rng.normal(size=(3, 5, 11)) * 4).astype(np.float32)
    labels = rng.integers(0, 11, size=(3, 5))
    got = cross_entropy_with_integer_labels(logits, labels, label_smoothing=eps, z_loss=z)
    assert got.shape == (3, 5) and got.dtype == jnp.float32
    np.testing.assert_allclose(got, np_loss(logits, labels, eps, z), rtol=1e-5, atol=1e-5)
    # bfloat16 logits are upcast: float32 losses of the rounded logits
    lb = jnp.asarray(logits, jnp.bfloat16)
    got_b = cross_entropy_with_integer_labels(lb, labels, label_smoothing=eps, z_loss=z)
    assert got_b.dtype == jnp.float32
    want_b = np_loss(np.asarray(lb, np.float32), labels, eps, z)
    np.testing.assert_allclose(got_b, want_b, rtol=1e-5)


def test_smoothed_loss_is_minimal_at_the_smoothed_target():
    """∇ H(q, softmax(z)) = softmax(z) − q vanishes at z = log q: the minimiser is q itself."""
    v, eps, label = 7, 0.1, 3
    q = np.full(v, eps / (v - 1))
    q[label] = 1 - eps
    g = jax.grad(lambda z: cross_entropy_with_integer_labels(z, jnp.int32(label),
                                                             label_smoothing=eps))(jnp.log(q))
    np.testing.assert_allclose(g, 0.0, atol=1e-6)


def test_weighted_sums_and_accuracy(rng):
    logits = rng.normal(size=(2, 6, 5)).astype(np.float32)
    labels = rng.integers(0, 5, size=(2, 6))
    weights = (rng.random((2, 6)) > 0.4).astype(np.float32) * rng.integers(1, 3, size=(2, 6))
    per = np_loss(logits, labels, 0.1)
    total, wsum = weighted_cross_entropy(logits, labels, weights, label_smoothing=0.1)
    np.testing.assert_allclose(total, (per * weights).sum(), rtol=1e-5)
    np.testing.assert_allclose(wsum, weights.sum())
    total, wsum = weighted_cross_entropy(logits, labels)
    np.testing.assert_allclose(total, np_loss(logits, labels).sum(), rtol=1e-5)
    assert float(wsum) == 12.0
    # a boolean mask works as weights; masked positions do not matter at all
    mask = weights > 0
    garbage = logits.copy()
    garbage[~mask] = 1e4
    t1, _ = weighted_cross_entropy(logits, labels, mask)
    t2, _ = weighted_cross_entropy(garbage, labels, mask)
    np.testing.assert_allclose(t1, t2, rtol=1e-6)
    correct = (logits.argmax(-1) == labels).astype(np.float32)
    acc, accw = weighted_accuracy(logits, labels, weights)
    np.testing.assert_allclose(acc, (correct * weights).sum())
    np.testing.assert_allclose(accw, weights.sum())


def test_loss_gradients_and_jit(rng):
    logits = rng.normal(size=(3, 6)).astype(np.float32)
    labels = np.array([0, 5, 2])
    f = lambda x: cross_entropy_with_integer_labels(x, labels, label_smoothing=0.1, z_loss=1e-2)
    np.testing.assert_allclose(jax.jit(f)(logits), f(logits), rtol=1e-6)
    with jax.enable_x64(True):
        check_grads(f, (jnp.asarray(logits, jnp.float64),), order=2, modes=("rev",))
        w = jnp.asarray([1.0, 0.0, 2.0], jnp.float64)
        check_grads(lambda x: weighted_cross_entropy(x, labels, w, label_smoothing=0.1)[0],
                    (jnp.asarray(logits, jnp.float64),), order=1, modes=("rev",))


def test_bad_label_smoothing_raises():
    with pytest.raises(ValueError, match="label_smoothing"):
        cross_entropy_with_integer_labels(jnp.zeros((2, 3)), jnp.zeros(2, jnp.int32),
                                          label_smoothing=1.0)


def test_out_of_vocabulary_labels_are_nan_unless_weighted_zero(rng):
    """−1 used to wrap to the last class (a finite, wrong loss) and −100 / V gave NaN even at
    weight 0, poisoning the sum: now every label outside [0, V) is NaN, and weight-0 positions
    contribute exactly 0 whatever their label (an ignore index works); the gradient stays finite."""
    logits = rng.normal(size=(2, 3, 7)).astype(np.float32)
    labels = np.array([[1, 2, -100], [3, 7, -1]])
    per = cross_entropy_with_integer_labels(logits, labels)
    assert np.isnan(per[0, 2]) and np.isnan(per[1, 1]) and np.isnan(per[1, 2])
    w = np.array([[1.0, 1, 0], [1, 0, 0]], np.float32)
    total, wsum = weighted_cross_entropy(logits, labels, w, label_smoothing=0.1)
    want = np_loss(logits[w > 0], labels[w > 0], 0.1).sum()
    np.testing.assert_allclose(total, want, rtol=1e-5)
    assert float(wsum) == 3.0
    grad = jax.grad(lambda x: weighted_cross_entropy(x, labels, w)[0])(logits)
    assert np.all(np.isfinite(grad)) and np.all(np.asarray(grad)[w == 0] == 0)
    assert np.isnan(weighted_cross_entropy(logits, labels, np.ones_like(w))[0])


def test_weights_must_have_the_labels_shape():
    """A [length] weight broadcast over [batch, length] labels summed to length, not batch·length,
    against batch·length losses: a silently wrong normaliser."""
    logits, labels = jnp.zeros((3, 4, 5)), jnp.zeros((3, 4), jnp.int32)
    for fn in (weighted_cross_entropy, weighted_accuracy):
        with pytest.raises(ValueError, match=r"weights \(4,\) must have the labels' shape"):
            fn(logits, labels, jnp.ones(4))
