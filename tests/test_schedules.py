"""Learning-rate schedules against their formulas in float64 NumPy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.train.optim import default_optimizer_config
from jaxformer.train.schedules import (
    constant,
    inverse_sqrt,
    make_schedule,
    warmup_cosine,
    warmup_linear,
    warmup_rsqrt,
)

WARMUP, TOTAL = 400, 3000


def steps_to_check(warmup: int, total: int) -> np.ndarray:
    special = [0, 1, 2, warmup - 1, warmup, warmup + 1, 2 * warmup, total - 1, total, total + 1,
               10 * total]
    return np.unique(np.concatenate([special, np.linspace(0, 2 * total, 97).astype(int)]))


def evaluate(schedule, steps) -> np.ndarray:
    eager = np.array([float(schedule(int(s))) for s in steps])
    jitted = np.asarray(jax.jit(jax.vmap(schedule))(jnp.asarray(steps, jnp.int32)))
    np.testing.assert_allclose(jitted, eager, rtol=2e-5, atol=1e-10)  # float32 rounding
    return eager


def ref_vaswani(s, d_model, warmup, scale):
    """Vaswani et al. 2017 eq. (3); 0 at step 0 (the limit of the warmup branch)."""
    s = np.asarray(s, np.float64)
    safe = np.maximum(s, 1.0)
    return np.where(s == 0, 0.0, scale * d_model ** -0.5 * np.minimum(safe ** -0.5,
                                                                       s * warmup ** -1.5))


@pytest.mark.parametrize("d_model,warmup,scale", [(512, 4000, 1.0), (64, WARMUP, 2.0), (8, 1, 0.5)])
def test_inverse_sqrt(d_model, warmup, scale):
    steps = steps_to_check(warmup, TOTAL)
    got = evaluate(inverse_sqrt(d_model, warmup, scale), steps)
    np.testing.assert_allclose(got, ref_vaswani(steps, d_model, warmup, scale), rtol=2e-6)
    assert got[0] == 0.0
    peak = scale * (d_model * warmup) ** -0.5
    np.testing.assert_allclose(got.max(), peak, rtol=1e-6)
    np.testing.assert_allclose(float(inverse_sqrt(d_model, warmup, scale)(warmup)), peak, rtol=1e-6)


def test_warmup_rsqrt():
    steps = steps_to_check(WARMUP, TOTAL)
    s = steps.astype(np.float64)
    ref = 3e-3 * np.where(s <= WARMUP, s / WARMUP, np.sqrt(WARMUP / np.maximum(s, 1)))
    np.testing.assert_allclose(evaluate(warmup_rsqrt(3e-3, WARMUP), steps), ref, rtol=2e-6)
    np.testing.assert_allclose(evaluate(inverse_sqrt(256, WARMUP, 1.5), steps),
                               evaluate(warmup_rsqrt(1.5 * (256 * WARMUP) ** -0.5, WARMUP), steps),
                               rtol=1e-6)


@pytest.mark.parametrize("warmup", [0, 1, WARMUP])
def test_warmup_cosine(warmup):
    steps = steps_to_check(max(warmup, 1), TOTAL)
    s = steps.astype(np.float64)
    peak, end = 1e-3, 1e-4
    frac = np.clip((s - warmup) / (TOTAL - warmup), 0.0, 1.0)
    ref = np.where(s < warmup, peak * s / max(warmup, 1),
                   end + (peak - end) * 0.5 * (1 + np.cos(np.pi * frac)))
    np.testing.assert_allclose(evaluate(warmup_cosine(peak, warmup, TOTAL, end), steps), ref,
                               rtol=2e-5, atol=1e-10)


@pytest.mark.parametrize("warmup", [0, WARMUP])
def test_warmup_linear(warmup):
    steps = steps_to_check(max(warmup, 1), TOTAL)
    s = steps.astype(np.float64)
    peak, end = 5e-4, 0.0
    frac = np.clip((s - warmup) / (TOTAL - warmup), 0.0, 1.0)
    ref = np.where(s < warmup, peak * s / max(warmup, 1), peak + (end - peak) * frac)
    np.testing.assert_allclose(evaluate(warmup_linear(peak, warmup, TOTAL, end), steps), ref,
                               rtol=2e-5, atol=1e-10)


def test_constant():
    steps = steps_to_check(WARMUP, TOTAL)
    np.testing.assert_allclose(evaluate(constant(2e-4), steps), np.full(steps.shape, 2e-4),
                               rtol=1e-7)


def test_make_schedule_dispatch_and_errors():
    steps = steps_to_check(WARMUP, TOTAL)
    cases = {
        "inverse_sqrt": inverse_sqrt(128, WARMUP, 2.0),
        "warmup_rsqrt": warmup_rsqrt(1e-3, WARMUP),
        "warmup_cosine": warmup_cosine(1e-3, WARMUP, TOTAL, 1e-5),
        "warmup_linear": warmup_linear(1e-3, WARMUP, TOTAL, 1e-5),
        "constant": constant(1e-3),
    }
    for name, direct in cases.items():
        cfg = default_optimizer_config(schedule=name, peak_lr=1e-3, scale=2.0,
                                       warmup_steps=WARMUP, end_lr=1e-5)
        np.testing.assert_allclose(evaluate(make_schedule(cfg, 128, TOTAL), steps),
                                   evaluate(direct, steps), rtol=1e-7)
    with pytest.raises(ValueError, match="unknown optimizer.schedule 'cosine'"):
        make_schedule(default_optimizer_config(schedule="cosine"), 128, TOTAL)
    with pytest.raises(ValueError, match="must exceed"):
        warmup_cosine(1e-3, 100, 100)
    with pytest.raises(ValueError, match="warmup_steps=0"):
        inverse_sqrt(512, 0)


@pytest.mark.parametrize("name", ["warmup_cosine", "warmup_linear"])
def test_a_warmup_longer_than_the_run_is_clipped_with_a_warning(name, caplog):
    """A decaying schedule needs ``total > warmup``; a config's warmup that is not shorter than the
    run (a 20-step smoke run of a long config) becomes ``total - 1``: the same schedule as asking
    for that warmup, and one warning line naming both numbers."""
    cfg = default_optimizer_config(schedule=name, peak_lr=1e-3, warmup_steps=160, end_lr=1e-5)
    with caplog.at_level("WARNING"):
        clipped = make_schedule(cfg, 128, 20)
    direct = (warmup_cosine if name == "warmup_cosine" else warmup_linear)(1e-3, 19, 20, 1e-5)
    steps = np.arange(0, 25)
    np.testing.assert_allclose(evaluate(clipped, steps), evaluate(direct, steps), rtol=1e-7)
    assert [r.getMessage() for r in caplog.records] == [
        "optimizer.warmup_steps=160 is not shorter than the run (20 steps): clipped to 19"]
    caplog.clear()
    make_schedule(default_optimizer_config(schedule=name, warmup_steps=19), 128, 20)
    assert not caplog.records  # a warmup that fits is left alone, silently
