"""`jaxformer.ops.masks` helpers against masks built with explicit Python loops."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.ops import (
    causal_mask,
    combine_masks,
    dot_product_attention,
    key_padding_mask,
    make_attention_mask,
    padding_mask,
    segment_mask,
)
from jaxformer.ops.masks import causal_mask_from_positions


def loop_mask(b, lq, lk, allowed) -> np.ndarray:
    """`[b, 1, lq, lk]` with ``allowed(batch, i, j)`` at each entry."""
    m = np.zeros((b, 1, lq, lk), bool)
    for bi in range(b):
        for i in range(lq):
            for j in range(lk):
                m[bi, 0, i, j] = allowed(bi, i, j)
    return m


@pytest.mark.parametrize("lq,lk,offset", [(5, None, 0), (3, 7, 0), (1, 6, 4), (2, 6, 3)])
def test_causal_mask(lq, lk, offset):
    got = np.asarray(causal_mask(lq, lk, offset=offset))
    want = loop_mask(1, lq, lk or lq, lambda b, i, j: j <= i + offset)
    assert got.shape == want.shape and got.dtype == bool
    np.testing.assert_array_equal(got, want)
    # a traced offset (the decode cache index) gives the same mask
    np.testing.assert_array_equal(causal_mask(lq, lk, offset=jnp.int32(offset)), want)


def test_causal_mask_from_positions():
    qp = np.array([[0, 1, 2, 0, 1], [3, 4, 5, 6, 7]])
    kp = np.array([[0, 1, 2, 0, 1, 2], [0, 1, 2, 3, 4, 5]])
    got = np.asarray(causal_mask_from_positions(qp, kp))
    np.testing.assert_array_equal(got, loop_mask(2, 5, 6, lambda b, i, j: kp[b, j] <= qp[b, i]))


def test_padding_and_key_padding_masks():
    qv = np.array([[1, 1, 0], [1, 0, 0]], bool)
    kv = np.array([[1, 0, 1, 1], [1, 1, 1, 0]], bool)
    np.testing.assert_array_equal(padding_mask(qv, kv),
                                  loop_mask(2, 3, 4, lambda b, i, j: qv[b, i] and kv[b, j]))
    np.testing.assert_array_equal(padding_mask(kv),
                                  loop_mask(2, 4, 4, lambda b, i, j: kv[b, i] and kv[b, j]))
    got = np.asarray(key_padding_mask(kv))
    assert got.shape == (2, 1, 1, 4)
    np.testing.assert_array_equal(np.broadcast_to(got, (2, 1, 3, 4)),
                                  loop_mask(2, 3, 4, lambda b, i, j: kv[b, j]))


def test_segment_mask():
    qs = np.array([[1, 1, 2, 2, 0], [1, 2, 3, 3, 3]])
    ks = np.array([[1, 2, 2, 0], [3, 3, 1, 0]])
    np.testing.assert_array_equal(
        segment_mask(qs, ks),
        loop_mask(2, 5, 4, lambda b, i, j: qs[b, i] == ks[b, j] and ks[b, j] != 0))
    own = np.asarray(segment_mask(qs))
    np.testing.assert_array_equal(
        own, loop_mask(2, 5, 5, lambda b, i, j: qs[b, i] == qs[b, j] and qs[b, j] != 0))
    assert not own[0, 0, 4].any()  # a padding query attends nowhere


def test_combine_masks():
    rng = np.random.default_rng(0)
    a = rng.random((2, 1, 3, 4)) > 0.5
    c = rng.random((1, 1, 3, 4)) > 0.5
    want = loop_mask(2, 3, 4, lambda b, i, j: a[b, 0, i, j] and c[0, 0, i, j])
    np.testing.assert_array_equal(combine_masks(a, None, c), want)
    np.testing.assert_array_equal(combine_masks(None, a), a)
    assert combine_masks(None, None) is None


def test_make_attention_mask_for_packed_rows():
    seg = np.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1]])
    pos = np.array([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]])
    same = lambda b, i, j: seg[b, i] == seg[b, j] and seg[b, j] != 0
    np.testing.assert_array_equal(make_attention_mask(seg), loop_mask(2, 6, 6, same))
    want = loop_mask(2, 6, 6, lambda b, i, j: same(b, i, j) and j <= i)
    np.testing.assert_array_equal(make_attention_mask(seg, causal=True), want)
    np.testing.assert_array_equal(
        make_attention_mask(seg, seg, causal=True, q_positions=pos, kv_positions=pos), want)
    with pytest.raises(ValueError, match="causal"):
        make_attention_mask(causal=True)


def test_mask_argument_equals_built_in_segment_and_causal_options():
    """The explicit mask path and the op's own causal/segment options agree (both impls)."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.normal(size=(2, 8, 2, 4)).astype(np.float32) for _ in range(3))
    seg = np.array([[1, 1, 1, 2, 2, 2, 2, 0], [1, 1, 1, 1, 1, 1, 1, 1]], np.int32)
    mask = make_attention_mask(seg, causal=True)
    for impl in ("xla", "chunked"):
        a = dot_product_attention(q, k, v, mask=mask, implementation=impl, q_chunk_size=4,
                                  kv_chunk_size=4)
        b = dot_product_attention(q, k, v, causal=True, q_segment_ids=seg, kv_segment_ids=seg,
                                  implementation=impl, q_chunk_size=4, kv_chunk_size=4)
        np.testing.assert_allclose(a, b, atol=1e-6)
