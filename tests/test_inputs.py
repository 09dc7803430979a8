"""The token lookup (`jaxformer.ops.inputs.embed_tokens`) against float64 NumPy: rows at the ids,
NaN rows for ids outside the vocabulary, and a gradient that sums each row's cotangents. In mixed
precision the table is cast before the lookup (one bfloat16 gather under FSDP, not a float32 one
besides it); the values must not change, and repeated tokens' gradients must still be summed in
the table's float32."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.ops.inputs import embed_tokens


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_token_lookup_values_and_gradient_equal_float64_numpy(dtype, rng):
    vocab, d = 11, 6
    table = rng.normal(size=(vocab, d)).astype(np.float32)
    ids = np.array([[3, 3, 3, 0, 10, -1], [11, 5, 3, 3, 7, 7]])  # repeats; -1 and 11 are outside
    weights = rng.normal(size=ids.shape + (d,)).astype(np.float32)

    def loss(t):
        x = embed_tokens(t, ids, dtype=dtype)
        return jnp.nansum(x.astype(jnp.float32) * weights), x

    (_, out), grad = jax.value_and_grad(loss, has_aux=True)(jnp.asarray(table))
    assert out.dtype == jnp.dtype(dtype)
    inside = (ids >= 0) & (ids < vocab)
    want = table.astype(np.float64)[np.where(inside, ids, 0)]
    got = np.asarray(out.astype(jnp.float32), np.float64)
    assert np.isnan(got[~inside]).all()
    tol = 0 if dtype == "float32" else 2**-8  # bfloat16's rounding of the rows, nothing else
    np.testing.assert_allclose(got[inside], want[inside], rtol=tol, atol=0)
    # d loss / d table[v] = sum of the row cotangents (the weights, rounded to the lookup's dtype)
    # at the positions holding v (outside ids: none); summed in bfloat16, the 4 rows of id 3 would
    # be off by ~2^-8 relative
    cotangents = np.asarray(jnp.asarray(weights).astype(dtype).astype(jnp.float32), np.float64)
    expected = np.zeros((vocab, d))
    np.add.at(expected, ids[inside], cotangents[inside])
    assert grad.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(grad, np.float64), expected, rtol=1e-6, atol=1e-6)
