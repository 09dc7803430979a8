"""Test-suite setup: 8 simulated CPU devices (for the sharding tests), CPU only, shared helpers.

The environment variables must be set before JAX is imported anywhere, hence at the top of this
conftest. Nothing else is global: tests needing float64 JAX use ``jax.enable_x64(True)`` locally and
build their references in float64 NumPy.
"""

import os
import shutil
import tempfile

_DEVICES_FLAG = "--xla_force_host_platform_device_count=8"
# Not --xla_backend_optimization_level=0: it compiles ~1.8x faster but miscompiles (jax 0.10.2,
# XLA:CPU) the chunked-attention gradient with an additive bias into NaNs that the default level
# and op-by-op execution do not produce (tests/test_attention.py::test_chunked_equals_plain_...).
os.environ.setdefault("XLA_FLAGS", _DEVICES_FLAG)
if _DEVICES_FLAG.split("=")[0] not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " " + _DEVICES_FLAG
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One compilation cache per test run, shared by the xdist workers and the train.py subprocesses the
# tests start (they compile the same tiny programs again and again): ~12% off the suite's time. The
# controller process creates it (workers inherit the variable) and removes it at the end.
_OWN_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ and "PYTEST_XDIST_WORKER" not in os.environ
if _OWN_CACHE:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="jaxformer-test-jit-")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.3")

import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture
def rng() -> np.random.Generator:
    """A fresh, seeded NumPy generator per test (fresh random inputs, reproducible failures)."""
    return np.random.default_rng(0)


def pytest_sessionfinish(session):
    if _OWN_CACHE and not hasattr(session.config, "workerinput"):
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
