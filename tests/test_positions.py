"""Positions: sinusoidal vs the Vaswani §3.5 formula, RoPE invariants, T5 buckets vs Mesh-TF/HF."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from jaxformer.ops import (
    apply_rope,
    lookup_positions,
    relative_position_bias,
    relative_position_bucket,
    sinusoidal,
    sinusoidal_table,
)


# ------------------------------------------------------------------------------------------------
# Sinusoidal
def formula_pe(length: int, d: int) -> np.ndarray:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)), float64."""
    pe = np.zeros((length, d))
    for pos in range(length):
        for i in range(d // 2):
            pe[pos, 2 * i] = math.sin(pos / 10000 ** (2 * i / d))
            pe[pos, 2 * i + 1] = math.cos(pos / 10000 ** (2 * i / d))
    return pe


@pytest.mark.parametrize("length,d", [(50, 16), (200, 32)])
def test_sinusoidal_matches_formula(length, d):
    want = formula_pe(length, d)
    got = np.asarray(sinusoidal_table(length, d))
    assert got.shape == (length, d) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=5e-5)  # float32 angles up to 200 rad
    with jax.enable_x64(True):  # in float64 the formula holds to rounding
        got64 = sinusoidal(jnp.arange(length, dtype=jnp.float64), d, dtype=jnp.float64)
        np.testing.assert_allclose(np.asarray(got64), want, atol=1e-10)
        # integer positions with a float64 table compute in float64 too (not float32, then cast)
        table64 = sinusoidal_table(length, d, dtype=jnp.float64)
        assert table64.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(table64), want, atol=1e-10)
    # batched positions index the same table
    pos = np.array([[3, 0, 7], [1, 1, 2]])
    np.testing.assert_allclose(sinusoidal(pos, d), got[pos], atol=1e-6)
    assert sinusoidal(pos, d, dtype=jnp.bfloat16).dtype == jnp.bfloat16
    with pytest.raises(ValueError, match="even"):
        sinusoidal(pos, d + 1)


def test_sinusoidal_gradient_wrt_positions():
    with jax.enable_x64(True):
        pos = jnp.asarray([[0.5, 3.0, 7.25]], jnp.float64)
        check_grads(lambda p: sinusoidal(p, 8, dtype=jnp.float64), (pos,), order=1,
                    modes=("fwd", "rev"), atol=1e-6, rtol=1e-6)


def test_lookup_positions_out_of_range_gives_nan():
    table = np.arange(12.0, dtype=np.float32).reshape(4, 3)
    got = np.asarray(lookup_positions(table, np.array([[0, 3, 4, -1]])))
    np.testing.assert_array_equal(got[0, :2], table[[0, 3]])
    assert np.isnan(got[0, 2:]).all(), "positions outside [0, max_len) must not wrap or clamp"
    jitted = np.asarray(jax.jit(lookup_positions)(table, np.array([5, -2])))
    assert np.isnan(jitted).all()


# ------------------------------------------------------------------------------------------------
# RoPE
def np_rope(x: np.ndarray, pos: np.ndarray, theta=10_000.0, rotary_dim=None) -> np.ndarray:
    """Rotate pair (i, i + r/2) by pos · theta^(-2i/r), one 2x2 rotation at a time (float64)."""
    x = np.asarray(x, np.float64)
    out = x.copy()
    r = x.shape[-1] if rotary_dim is None else rotary_dim
    half = r // 2
    b, n, h, _ = x.shape
    for bi in range(b):
        for t in range(n):
            for i in range(half):
                a = pos[bi, t] * theta ** (-2 * i / r)
                rot = np.array([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]])
                for hi in range(h):
                    out[bi, t, hi, [i, i + half]] = rot @ x[bi, t, hi, [i, i + half]]
    return out


def test_rope_matches_explicit_rotation(rng):
    x = rng.normal(size=(2, 5, 3, 8)).astype(np.float32)
    pos = rng.integers(0, 300, size=(2, 5))
    np.testing.assert_allclose(apply_rope(x, pos), np_rope(x, pos), atol=2e-5)
    np.testing.assert_allclose(apply_rope(x, pos, theta=500.0), np_rope(x, pos, 500.0), atol=2e-5)
    part = np.asarray(apply_rope(x, pos, rotary_dim=4))
    np.testing.assert_allclose(part, np_rope(x, pos, rotary_dim=4), atol=2e-5)
    np.testing.assert_array_equal(part[..., 4:], x[..., 4:])
    np.testing.assert_allclose(apply_rope(x, np.zeros((2, 5), int)), x, atol=0)  # position 0


def test_rope_inner_products_depend_only_on_offset_and_norms_are_kept(rng):
    d = 16
    q = rng.normal(size=(1, 1, 1, d)).astype(np.float32)
    k = rng.normal(size=(1, 1, 1, d)).astype(np.float32)
    rope = jax.jit(apply_rope)

    def score(m, n):
        rq = rope(q, np.array([[m]]))
        rk = rope(k, np.array([[n]]))
        return float(jnp.sum(rq * rk))

    for offset in (0, 1, 5, -3, 40):
        ref = score(offset + 7, 7)
        for m in (offset, offset + 20, offset + 123):
            if m >= 0 and m - offset >= 0:
                assert score(m, m - offset) == pytest.approx(ref, abs=1e-4)
    assert score(5, 0) != pytest.approx(score(6, 0), abs=1e-3)  # it is position dependent
    x = rng.normal(size=(2, 6, 4, d)).astype(np.float32)
    pos = rng.integers(0, 1000, size=(2, 6))
    np.testing.assert_allclose(np.linalg.norm(rope(x, pos), axis=-1), np.linalg.norm(x, axis=-1),
                               rtol=1e-5)


def test_rope_dtype_gradient_and_errors(rng):
    x = rng.normal(size=(1, 4, 2, 8)).astype(np.float32)
    pos = np.arange(4)[None]
    assert apply_rope(x.astype(jnp.bfloat16), pos).dtype == jnp.bfloat16
    with jax.enable_x64(True):
        check_grads(lambda x: apply_rope(x, pos), (jnp.asarray(x, jnp.float64),), order=2,
                    modes=("fwd", "rev"), atol=1e-7, rtol=1e-7)
    with pytest.raises(ValueError, match="even"):
        apply_rope(x[..., :7], pos)
    with pytest.raises(ValueError, match=r"in \(0, head_dim=8\], got 10"):
        apply_rope(x, pos, rotary_dim=10)
    with pytest.raises(ValueError, match=r"positions \[batch, length\]; got x \(1, 4, 2, 8\), "
                                         r"positions \(1, 3\)"):
        apply_rope(x, pos[:, :3])


# ------------------------------------------------------------------------------------------------
# T5 relative position buckets
def hf_relative_position_bucket(relative_position, bidirectional=True, num_buckets=32,
                                max_distance=128):
    """NumPy transcription of HF `T5Attention._relative_position_bucket` (Mesh-TF), float32 logs."""
    relative_buckets = np.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        relative_buckets += (relative_position > 0).astype(np.int64) * num_buckets
        relative_position = np.abs(relative_position)
    else:
        relative_position = -np.minimum(relative_position, np.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    with np.errstate(divide="ignore", invalid="ignore"):  # log(0): masked by is_small
        large = max_exact + (
            np.log(relative_position.astype(np.float32) / np.float32(max_exact))
            / np.float32(math.log(max_distance / max_exact))
            * np.float32(num_buckets - max_exact)
        ).astype(np.int64)
    large = np.minimum(large, num_buckets - 1)
    return relative_buckets + np.where(is_small, relative_position, large)


@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 64), (8, 20)])
@pytest.mark.parametrize("bidirectional", [True, False])
def test_relative_position_bucket_matches_mesh_tf(bidirectional, num_buckets, max_distance):
    rel = np.arange(-400, 401).reshape(1, -1)
    got = np.asarray(relative_position_bucket(rel, bidirectional=bidirectional,
                                              num_buckets=num_buckets, max_distance=max_distance))
    want = hf_relative_position_bucket(rel.astype(np.int64), bidirectional, num_buckets,
                                       max_distance)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)
    assert got.min() == 0 and got.max() == num_buckets - 1
    if not bidirectional:  # keys after the query (rel > 0) all share bucket 0
        assert (got[rel > 0] == 0).all()


def test_relative_position_bias_gathers_table_by_bucket(rng):
    heads, nb = 3, 8
    table = rng.normal(size=(nb, heads)).astype(np.float32)
    qp = np.array([[0, 1, 2, 3], [5, 6, 7, 8]])
    kp = np.array([[0, 1, 2, 3, 4], [0, 2, 4, 6, 8]])
    got = np.asarray(relative_position_bias(table, qp, kp, bidirectional=False, max_distance=16))
    assert got.shape == (2, heads, 4, 5)
    for b in range(2):
        for i in range(4):
            for j in range(5):
                bucket = hf_relative_position_bucket(np.array(kp[b, j] - qp[b, i]), False, nb, 16)
                np.testing.assert_array_equal(got[b, :, i, j], table[bucket])
    one_d = relative_position_bias(table, qp[0], kp[0], max_distance=16)
    assert one_d.shape == (1, heads, 4, 5)
