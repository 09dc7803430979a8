"""`jaxformer.ops.dot_product_attention` against a float64 NumPy softmax(QKᵀ·scale + B + M)V.

Both implementations ("xla" and "chunked") are checked against the reference, against each other
(values and gradients) and for the invariants of attention: causality, zero weight on padding keys,
permutation equivariance without positions, zero output for fully masked rows.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from jaxformer.ops import dot_product_attention

IMPLS = ("xla", "chunked")
CHUNK = dict(q_chunk_size=4, kv_chunk_size=4)


def attn(impl="xla", **static):
    """Jitted attention with static options fixed; arrays (incl. masks, ids) go in as arguments."""
    return jax.jit(functools.partial(dot_product_attention, implementation=impl, **CHUNK, **static))


def both_impls(**static):
    """One jitted function returning the ("xla", "chunked") outputs (one compile for both)."""
    f = functools.partial(dot_product_attention, **CHUNK, **static)
    return jax.jit(lambda *a, **kw: {i: f(*a, implementation=i, **kw) for i in IMPLS})


# ------------------------------------------------------------------------------------------------
# Independent float64 reference (explicit loops over batch, head and query).
def np_attention(q, k, v, *, mask=None, bias=None, scale=None):
    """softmax(q kᵀ · scale + bias, restricted to mask) v; rows with no visible key give zeros."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    b, lq, h, d = q.shape
    lk, kvh = k.shape[1], k.shape[2]
    group = h // kvh  # query head i reads kv head i // group
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    full = (b, h, lq, lk)
    mask = np.ones(full, bool) if mask is None else np.broadcast_to(mask, full)
    bias = np.zeros(full) if bias is None else np.broadcast_to(np.asarray(bias, np.float64), full)
    out = np.zeros((b, lq, h, v.shape[-1]))
    for bi in range(b):
        for hi in range(h):
            kh = hi // group
            for qi in range(lq):
                keys = np.flatnonzero(mask[bi, hi, qi])
                if keys.size == 0:
                    continue
                s = np.array([q[bi, qi, hi] @ k[bi, j, kh] * scale + bias[bi, hi, qi, j]
                              for j in keys])
                w = np.exp(s - s.max())
                w /= w.sum()
                out[bi, qi, hi] = sum(wj * v[bi, j, kh] for wj, j in zip(w, keys))
    return out


def loop_causal(lq, lk):
    return np.array([[j <= i for j in range(lk)] for i in range(lq)])[None, None]


def loop_segment(q_seg, kv_seg):
    b, lq, lk = q_seg.shape[0], q_seg.shape[1], kv_seg.shape[1]
    m = np.zeros((b, 1, lq, lk), bool)
    for bi in range(b):
        for i in range(lq):
            for j in range(lk):
                m[bi, 0, i, j] = q_seg[bi, i] == kv_seg[bi, j] and kv_seg[bi, j] != 0
    return m


def random_qkv(rng, b, lq, lk, h, kvh, d, dtype=np.float32):
    q = rng.normal(size=(b, lq, h, d)).astype(dtype)
    k = rng.normal(size=(b, lk, kvh, d)).astype(dtype)
    v = rng.normal(size=(b, lk, kvh, d)).astype(dtype)
    return q, k, v


def random_segments(rng, b, n, pad_tail=True):
    """Packed rows: increasing segment ids 1..3, trailing padding (0) on some rows."""
    seg = np.sort(rng.integers(1, 4, size=(b, n)), axis=1)
    if pad_tail:
        seg[0, -2:] = 0
    return seg.astype(np.int32)


SHAPES = {  # (batch, q_len, kv_len, heads, kv_heads, head_dim)
    "mha": (2, 8, 8, 4, 4, 8),
    "gqa_cross": (1, 8, 12, 4, 2, 16),
    "mqa": (3, 4, 8, 6, 1, 4),
}
CASES = [("mha", kind) for kind in ("none", "causal", "padding", "segment", "bias_scale",
                                    "per_head_mask")]
CASES += [("gqa_cross", kind) for kind in ("causal", "padding", "segment", "all")]
CASES += [("mqa", kind) for kind in ("causal", "bias_scale", "all")]


@pytest.mark.parametrize("shape,kind", CASES, ids=[f"{s}-{k}" for s, k in CASES])
def test_matches_numpy_reference(rng, shape, kind):
    b, lq, lk, h, kvh, d = SHAPES[shape]
    q, k, v = random_qkv(rng, b, lq, lk, h, kvh, d)
    kw, static, ref_mask, ref_bias, scale = {}, {}, np.ones((b, h, lq, lk), bool), None, None
    if kind in ("causal", "all"):
        static["causal"] = True
        ref_mask = ref_mask & loop_causal(lq, lk)
    if kind == "padding":
        valid = rng.random((b, lk)) > 0.3
        valid[:, 0] = True
        kw["mask"] = jnp.asarray(valid[:, None, None, :])
        ref_mask = ref_mask & valid[:, None, None, :]
    if kind in ("segment", "all"):
        qs, ks = random_segments(rng, b, lq), random_segments(rng, b, lk)
        kw.update(q_segment_ids=jnp.asarray(qs), kv_segment_ids=jnp.asarray(ks))
        ref_mask = ref_mask & loop_segment(qs, ks)
    if kind in ("bias_scale", "all"):
        ref_bias = rng.normal(size=(1, h, lq, lk)).astype(np.float32)
        scale = 0.37
        kw["bias"] = jnp.asarray(ref_bias)
        static["scale"] = scale
    if kind == "per_head_mask":
        m = rng.random((b, h, lq, lk)) > 0.4
        kw["mask"] = jnp.asarray(m)
        ref_mask = ref_mask & m
    want = np_attention(q, k, v, mask=ref_mask, bias=ref_bias, scale=scale)
    outs = both_impls(**static)(q, k, v, **kw)
    for impl, got in outs.items():
        assert got.shape == (b, lq, h, d) and got.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(got), want, atol=2e-5, rtol=2e-5, err_msg=impl)


@pytest.mark.parametrize("impl", IMPLS)
def test_heads_major_keys_and_values(rng, impl):
    """``kv_layout="bksd"`` (keys/values `[B, K, S, Dh]`, the decoding cache's layout) gives the
    reference result, with a key-padding mask and grouped heads."""
    b, lq, lk, h, kvh, d = SHAPES["gqa_cross"]
    q, k, v = random_qkv(rng, b, lq, lk, h, kvh, d)
    valid = rng.random((b, lk)) > 0.3
    valid[:, 0] = True
    want = np_attention(q, k, v, mask=np.broadcast_to(valid[:, None, None, :], (b, h, lq, lk)))
    got = attn(impl, kv_layout="bksd")(q, jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2),
                                       mask=jnp.asarray(valid[:, None, None, :]))
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-5, rtol=2e-5)


def _packed_case(rng, b=2, n=16, h=4, kvh=2, d=8):
    q, k, v = random_qkv(rng, b, n, n, h, kvh, d)
    seg = random_segments(rng, b, n)
    bias = rng.normal(size=(1, h, n, n)).astype(np.float32)
    return q, k, v, seg, bias


def test_chunked_equals_plain_values_and_gradients(rng):
    q, k, v, seg, bias = _packed_case(rng)
    cot = rng.normal(size=q.shape).astype(np.float32)

    def loss(impl):
        def f(q, k, v, bias):
            out = dot_product_attention(q, k, v, bias=bias, causal=True, q_segment_ids=seg,
                                        kv_segment_ids=seg, implementation=impl,
                                        q_chunk_size=4, kv_chunk_size=8)
            return jnp.sum(out * cot), out
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3), has_aux=True))

    (_, out_x), grads_x = loss("xla")(q, k, v, bias)
    (_, out_c), grads_c = loss("chunked")(q, k, v, bias)
    np.testing.assert_allclose(out_c, out_x, atol=1e-5, rtol=1e-5)
    for gx, gc, name in zip(grads_x, grads_c, "qkvb"):
        assert np.all(np.isfinite(gc)), name
        np.testing.assert_allclose(gc, gx, atol=1e-5, rtol=1e-4, err_msg=name)


@pytest.mark.parametrize("impl", IMPLS)
def test_fully_masked_rows_give_zeros_and_finite_gradients(rng, impl):
    q, k, v = random_qkv(rng, 2, 8, 8, 2, 2, 4)
    seg = np.array([[1, 1, 1, 0, 0, 2, 2, 0], [0, 0, 0, 0, 0, 0, 0, 0]], np.int32)

    def f(q, k, v):
        return attn(impl)(q, k, v, q_segment_ids=seg, kv_segment_ids=seg)

    out = np.asarray(f(q, k, v))
    assert np.all(out[seg == 0] == 0.0)
    assert np.all(np.abs(out[seg != 0]).sum(-1) > 0)
    grads = jax.jit(jax.grad(lambda *a: jnp.sum(f(*a) ** 2), argnums=(0, 1, 2)))(q, k, v)
    assert all(np.all(np.isfinite(g)) for g in grads)
    # an all-False boolean mask behaves the same
    none = attn(impl)(q, k, v, mask=jnp.zeros((1, 1, 8, 8), bool))
    assert np.all(np.asarray(none) == 0.0)


@pytest.mark.parametrize("impl", IMPLS)
def test_causal_outputs_ignore_the_future(rng, impl):
    q, k, v = random_qkv(rng, 2, 8, 8, 4, 2, 8)
    i = 4
    q2, k2, v2 = (a.copy() for a in (q, k, v))
    for a in (q2, k2, v2):
        a[:, i + 1:] = rng.normal(size=a[:, i + 1:].shape)
    f = lambda *a: np.asarray(attn(impl, causal=True)(*a))
    out, out2 = f(q, k, v), f(q2, k2, v2)
    np.testing.assert_allclose(out2[:, : i + 1], out[:, : i + 1], atol=1e-6)
    assert not np.allclose(out2[:, i + 1:], out[:, i + 1:])


@pytest.mark.parametrize("impl", IMPLS)
def test_padding_keys_get_zero_weight(rng, impl):
    q, k, v = random_qkv(rng, 2, 8, 8, 4, 4, 8)
    valid = np.ones((2, 8), bool)
    valid[0, 5:] = valid[1, 2:4] = False
    k2, v2 = k.copy(), v.copy()
    k2[~valid] = 100 * rng.normal(size=k2[~valid].shape)
    v2[~valid] = 100 * rng.normal(size=v2[~valid].shape)
    seg = valid.astype(np.int32)
    for kw in (dict(mask=valid[:, None, None, :]), dict(q_segment_ids=np.ones_like(seg),
                                                        kv_segment_ids=seg)):
        f = lambda k, v, kw=kw: np.asarray(attn(impl)(q, k, v, **kw))
        np.testing.assert_allclose(f(k2, v2), f(k, v), atol=1e-6)


@pytest.mark.parametrize("impl", IMPLS)
def test_unmasked_attention_is_permutation_equivariant(rng, impl):
    q, k, v = random_qkv(rng, 2, 8, 8, 4, 2, 8)
    perm = rng.permutation(8)
    f = lambda *a: np.asarray(attn(impl)(*a))
    np.testing.assert_allclose(f(q[:, perm], k[:, perm], v[:, perm]), f(q, k, v)[:, perm],
                               atol=1e-6)


@pytest.mark.parametrize("impl", IMPLS)
def test_check_grads_float64(rng, impl):
    q, k, v, seg, bias = _packed_case(rng, b=1, n=8, h=2, kvh=1, d=4)

    def f(q, k, v, bias):
        return attn(impl, causal=True)(q, k, v, bias=bias, q_segment_ids=seg, kv_segment_ids=seg)

    with jax.enable_x64(True):
        args = [jnp.asarray(a, jnp.float64) for a in (q, k, v, bias)]
        assert f(*args).dtype == jnp.float64
        # reverse mode is what training uses; forward mode through the chunked scan is slow to
        # compile and the chunked gradients are also compared with the plain ones above
        modes = ("fwd", "rev") if impl == "xla" else ("rev",)
        check_grads(f, args, order=1, modes=modes, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("impl", IMPLS)
def test_jit_equals_eager_and_vmap_equals_loop(rng, impl):
    q, k, v = random_qkv(rng, 3, 8, 8, 4, 2, 8)  # leading axis 3 is vmapped over
    seg = np.stack([random_segments(rng, 1, 8)[0] for _ in range(3)])
    f = lambda q, k, v, s: dot_product_attention(q, k, v, causal=True, q_segment_ids=s,
                                                 kv_segment_ids=s, implementation=impl, **CHUNK)
    eager = f(q, k, v, seg)
    np.testing.assert_allclose(jax.jit(f)(q, k, v, seg), eager, atol=1e-6)
    one = lambda q, k, v, s: f(q[None], k[None], v[None], s[None])[0]
    mapped = jax.vmap(one)(q, k, v, seg)
    np.testing.assert_allclose(mapped, eager, atol=1e-6)


@pytest.mark.parametrize("impl", IMPLS)
def test_bfloat16_in_bfloat16_out(rng, impl):
    q, k, v = (jnp.asarray(a, jnp.bfloat16) for a in random_qkv(rng, 2, 8, 8, 4, 2, 8))
    out = attn(impl, causal=True)(q, k, v)
    assert out.dtype == jnp.bfloat16
    want = np_attention(*(np.asarray(a, np.float32) for a in (q, k, v)), mask=loop_causal(8, 8))
    np.testing.assert_allclose(np.asarray(out, np.float32), want, atol=3e-2)


def test_dropout_on_weights(rng):
    q, k, v = random_qkv(rng, 2, 8, 8, 4, 4, 8)
    base = attn("xla")(q, k, v)
    for impl in IMPLS:
        f = lambda key, impl=impl: attn(impl, dropout_rate=0.5)(q, k, v, dropout_rng=key)
        # rbg keys: same semantics as the default threefry, much faster to compile on CPU
        key = lambda i: jax.random.key(i, impl="rbg")
        a, b, c = f(key(1)), f(key(1)), f(key(2))
        np.testing.assert_array_equal(a, b)
        assert not np.allclose(a, c) and not np.allclose(a, base)


def test_bad_arguments_raise_value_error(rng):
    q, k, v = random_qkv(rng, 1, 8, 8, 4, 3, 8)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        dot_product_attention(q, k, v)
    q, k, v = random_qkv(rng, 1, 8, 8, 4, 2, 8)
    with pytest.raises(ValueError, match="implementation"):
        dot_product_attention(q, k, v, implementation="flash3")
    with pytest.raises(ValueError, match="kv_layout"):
        dot_product_attention(q, k, v, kv_layout="bhsd")
    with pytest.raises(ValueError, match=r"\[batch, length, heads, head_dim\]"):
        dot_product_attention(q[0], k, v)
    with pytest.raises(ValueError, match=r"mask of shape \(1, 3, 8, 8\) does not broadcast to "
                                         r"\[batch, heads, q_len, kv_len\] = \[1, 4, 8, 8\]"):
        dot_product_attention(q, k, v, mask=jnp.ones((1, 3, 8, 8), bool))
    for impl in IMPLS:  # a kv_len-5 mask, and a [batch, kv_len] key-padding mask given as is
        with pytest.raises(ValueError, match="mask of shape"):
            dot_product_attention(q, k, v, mask=jnp.ones((1, 1, 8, 5), bool),
                                  implementation=impl)
    with pytest.raises(ValueError, match=r"mask\[:, None, None, :\]"):
        dot_product_attention(*random_qkv(rng, 2, 8, 8, 4, 2, 8), mask=jnp.ones((2, 8), bool))
    with pytest.raises(ValueError, match="bias of shape"):
        dot_product_attention(q, k, v, bias=jnp.zeros((1, 4, 8, 9)))
    with pytest.raises(ValueError, match="mask must be boolean"):  # 0 = attend would mask all
        dot_product_attention(q, k, v, mask=jnp.zeros((1, 1, 8, 8), jnp.float32))
    with pytest.raises(ValueError, match="same batch size"):
        dot_product_attention(np.concatenate([q, q]), k, v)
    with pytest.raises(ValueError, match=r"q_segment_ids must be \[batch, length\] = \[1, 8\]"):
        dot_product_attention(q, k, v, q_segment_ids=jnp.ones((1, 5), jnp.int32))


def test_chunked_pads_lengths_that_are_no_multiple_of_the_chunk(rng):
    """q_len 8 / kv_len 12 with chunks of 3 / 5: padded queries are dropped and padded keys
    masked, so the result is the float64 reference's (causal, key padding, segments, bias)."""
    b, lq, lk, h, kvh, d = 2, 8, 12, 4, 2, 8
    q, k, v = random_qkv(rng, b, lq, lk, h, kvh, d)
    valid = rng.random((b, lk)) > 0.3
    valid[:, 0] = True
    qs, ks = random_segments(rng, b, lq), random_segments(rng, b, lk)
    bias = rng.normal(size=(b, h, lq, lk)).astype(np.float32)
    kw = dict(mask=jnp.asarray(valid[:, None, None, :]), bias=jnp.asarray(bias), causal=True,
              q_segment_ids=jnp.asarray(qs), kv_segment_ids=jnp.asarray(ks))
    want = np_attention(q, k, v, mask=valid[:, None, None, :] & loop_causal(lq, lk)
                        & loop_segment(qs, ks), bias=bias)
    for chunks in ((3, 5), (5, 7), (8, 12)):
        got = dot_product_attention(q, k, v, implementation="chunked", q_chunk_size=chunks[0],
                                    kv_chunk_size=chunks[1], **kw)
        np.testing.assert_allclose(np.asarray(got), want, atol=2e-5, rtol=2e-5, err_msg=chunks)

    def loss(impl):
        return jax.grad(lambda q, k, v: jnp.sum(dot_product_attention(
            q, k, v, implementation=impl, q_chunk_size=3, kv_chunk_size=5, **kw) ** 2),
            argnums=(0, 1, 2))(q, k, v)

    for gx, gc in zip(loss("xla"), loss("chunked")):
        np.testing.assert_allclose(gc, gx, atol=1e-5, rtol=1e-4)
