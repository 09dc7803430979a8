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


def np_blockwise_reference(h, w, bias, labels, weights, eps, z, classes):
    """Σ weights · H(q, p) of logits h·wᵀ + bias over the first ``classes`` columns, and its
    gradients with respect to h, w and bias, in float64 NumPy: ∂/∂logits = weights·(p(1 + 2z log Z) − q)."""
    h, w, bias = (np.asarray(a, np.float64) for a in (h, w, bias))
    logits = (h @ w.T + bias)[:, :classes]
    loss = np_loss(logits, labels, eps, z)
    m = logits.max(-1, keepdims=True)
    log_z = np.log(np.exp(logits - m).sum(-1)) + m[:, 0]
    p = np.exp(logits - log_z[:, None])
    q = np.full(logits.shape, eps / (classes - 1))
    np.put_along_axis(q, labels[:, None], 1.0 - eps, axis=-1)
    d = weights[:, None] * (p * (1 + 2 * z * log_z)[:, None] - q)
    d = np.pad(d, ((0, 0), (0, w.shape[0] - classes)))  # padded columns: probability 0, no gradient
    return (weights * loss).sum(), d @ w, d.T @ h, d.sum(0), logits.argmax(-1)


@pytest.mark.parametrize("eps,z,block,classes", [(0.0, 0.0, 4, 13), (0.1, 1e-2, 5, 13),
                                                 (0.2, 0.0, 16, 11), (0.0, 1e-3, 3, 10)])
def test_blockwise_cross_entropy_matches_float64_reference(rng, eps, z, block, classes):
    """Loss, argmax and every gradient of the blockwise loss equal the float64 formula, with a
    block that does not divide the vocabulary, padded vocabulary columns and zero weights."""
    from jaxformer.ops.losses import weighted_blockwise_cross_entropy

    n, d, v = 7, 6, 13
    h, w, bias = rng.normal(size=(n, d)), rng.normal(size=(v, d)), rng.normal(size=(v,))
    labels = rng.integers(0, classes, size=(n,))
    weights = np.array([1.0, 0.0, 2.0, 1.0, 1.0, 0.0, 0.5])
    want_loss, want_dh, want_dw, want_db, want_arg = np_blockwise_reference(
        h, w, bias, labels, weights, eps, z, classes)

    def f(h, w, bias):
        loss, correct, weight = weighted_blockwise_cross_entropy(
            h, w, bias, labels, weights, block_size=block, label_smoothing=eps, z_loss=z,
            num_classes=classes)
        return loss, (correct, weight)

    with jax.enable_x64(True):
        args = [jnp.asarray(a, jnp.float64) for a in (h, w, bias)]
        (loss, (correct, weight)), grads = jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True)(*args)
        np.testing.assert_allclose(loss, want_loss, rtol=1e-12)
        for got, want in zip(grads, (want_dh, want_dw, want_db)):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
        assert float(correct) == float(((want_arg == labels) * weights).sum())
        assert float(weight) == weights.sum()
    # float32: the same within float32 rounding
    (loss32, _), grads32 = jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True)(
        *(jnp.asarray(a, jnp.float32) for a in (h, w, bias)))
    np.testing.assert_allclose(loss32, want_loss, rtol=1e-5)
    for got, want in zip(grads32, (want_dh, want_dw, want_db)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype,rtol", [(jnp.float32, 1e-6), (jnp.bfloat16, 1e-3)])
def test_blockwise_cross_entropy_equals_full_logits_path(rng, dtype, rtol):
    """The blockwise loss and its gradients equal `weighted_cross_entropy` of the full logits
    computed as the tied head does (`attend`, bias, padded columns masked), and its argmax the full
    logits' argmax (bfloat16: within its rounding; the products are summed in another order);
    labels outside the classes give NaN, as there."""
    from jaxformer.ops.embedding import attend
    from jaxformer.ops.heads import mask_padded_vocab
    from jaxformer.ops.losses import blockwise_cross_entropy, weighted_blockwise_cross_entropy

    h = jnp.asarray(rng.normal(size=(2, 5, 8)), dtype)
    w = jnp.asarray(rng.normal(size=(24, 8)), jnp.float32)
    bias = jnp.asarray(rng.normal(size=(24,)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 21, size=(2, 5)))
    weights = jnp.asarray(rng.integers(0, 2, size=(2, 5)), jnp.float32)

    def full(h, w, bias):
        logits = mask_padded_vocab(attend(w, h) + bias.astype(h.dtype), 21)
        loss, weight = weighted_cross_entropy(logits, labels, weights, label_smoothing=0.1,
                                              z_loss=1e-3, num_classes=21)
        return loss, (weighted_accuracy(logits, labels, weights)[0], weight)

    def blocks(h, w, bias):
        loss, correct, weight = weighted_blockwise_cross_entropy(
            h, w, bias, labels, weights, block_size=7, label_smoothing=0.1, z_loss=1e-3,
            num_classes=21)
        return loss, (correct, weight)

    (lf, (cf, wf)), gf = jax.value_and_grad(full, argnums=(0, 1, 2), has_aux=True)(h, w, bias)
    (lb, (cb, wb)), gb = jax.value_and_grad(blocks, argnums=(0, 1, 2), has_aux=True)(h, w, bias)
    np.testing.assert_allclose(lb, lf, rtol=rtol)
    assert float(cb) == float(cf) and float(wb) == float(wf)
    for a, b in zip(gb, gf):
        assert a.dtype == b.dtype
        scale = float(np.abs(np.asarray(b, np.float32)).max())
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   rtol=10 * rtol, atol=10 * rtol * scale)
    bad, _ = blockwise_cross_entropy(h[0], w, bias, jnp.asarray([0, 21, -1, 3, 4]), block_size=5,
                                     num_classes=21)
    assert np.isnan(bad[1]) and np.isnan(bad[2]) and np.isfinite(bad[0])
