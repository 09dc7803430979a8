"""Word dropout on the decoder inputs (`ops.token_dropout`, `target_token_dropout_rate`)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.config import ModelConfig
from jaxformer.models import build_model
from jaxformer.models.presets import preset
from jaxformer.ops import token_dropout


def test_token_dropout_zeroes_whole_vectors_at_the_rate():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 1000, 8)), jnp.float32)
    out = np.asarray(token_dropout(x, 0.3, jax.random.key(1)))
    dropped = np.all(out == 0, axis=-1)
    kept = np.all(out == np.asarray(x), axis=-1)
    assert np.all(dropped ^ kept)  # each vector untouched (no rescaling) or entirely zero
    assert abs(dropped.mean() - 0.3) < 4 * np.sqrt(0.3 * 0.7 / dropped.size)
    np.testing.assert_array_equal(token_dropout(x, 0.3, None), x)
    np.testing.assert_array_equal(token_dropout(x, 0.0, jax.random.key(1)), x)


def test_rate_is_validated():
    with pytest.raises(ValueError, match="target_token_dropout_rate"):
        ModelConfig.from_dict(preset("t5_tiny", target_token_dropout_rate=1.0))


def test_dropped_decoder_tokens_carry_no_information():
    """Training mode: changing a dropped decoder-input token leaves every logit unchanged, changing
    a kept one does not; about half are dropped at rate 0.5. Evaluation mode ignores the option."""
    cfg = ModelConfig.from_dict(preset(
        "t5_tiny", vocab_size=32, d_model=16, num_heads=2, d_ff=32, num_layers=1, max_len=16,
        dropout_rate=0.0, attention_dropout_rate=0.0, target_token_dropout_rate=0.5))
    model = build_model(cfg)
    rng = np.random.default_rng(0)
    inputs = jnp.asarray(rng.integers(1, 32, (2, 6)), jnp.int32)
    targets = rng.integers(1, 32, (2, 8)).astype(np.int32)
    params = model.init(jax.random.key(0))

    @functools.partial(jax.jit, static_argnums=1)
    def logits(t, deterministic):
        return model.apply(params, inputs, t, rng=None if deterministic else jax.random.key(3))

    def changes(deterministic):
        base = logits(jnp.asarray(targets), deterministic)
        out = np.zeros(targets.shape, bool)
        for b, t in np.ndindex(*targets.shape):
            other = targets.copy()
            other[b, t] = other[b, t] % 31 + 1
            out[b, t] = not np.allclose(logits(jnp.asarray(other), deterministic), base)
        return out

    assert changes(True).all()
    matters = changes(False)
    assert 0.2 < 1 - matters.mean() < 0.8, matters
