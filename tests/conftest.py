"""Test-suite setup: 8 simulated CPU devices (for the sharding tests), CPU only, shared helpers.

The environment variables must be set before JAX is imported anywhere, hence at the top of this
conftest. Nothing else is global: tests needing float64 JAX use ``jax.enable_x64(True)`` locally and
build their references in float64 NumPy.
"""

import os

_DEVICES_FLAG = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("XLA_FLAGS", _DEVICES_FLAG)
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " " + _DEVICES_FLAG
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture
def rng() -> np.random.Generator:
    """A fresh, seeded NumPy generator per test (fresh random inputs, reproducible failures)."""
    return np.random.default_rng(0)

