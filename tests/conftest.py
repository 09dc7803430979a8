"""Test-suite setup: simulated CPU devices (8; 1 on `make test`'s one-device worker: see
tests/scheduling.py), CPU only, XLA:CPU optimisation level 1, shared helpers.

The environment variables must be set before JAX is imported anywhere, hence at the top of this
conftest. Nothing else is global: tests needing float64 JAX use ``jax.enable_x64(True)`` locally and
build their references in float64 NumPy.
"""

import os
import shutil
import tempfile

from scheduling import SPLIT_ENV, devices_for_this_process, file_rank, make_device_split_scheduler

_DEVICES_FLAG = f"--xla_force_host_platform_device_count={devices_for_this_process()}"
_flags = os.environ.get("XLA_FLAGS", "").split()
if os.environ.get(SPLIT_ENV) == "1":  # the split decides: drop any count the environment gave
    _flags = [f for f in _flags if not f.startswith(_DEVICES_FLAG.split("=")[0])]
if not any(f.startswith(_DEVICES_FLAG.split("=")[0]) for f in _flags):
    _flags.append(_DEVICES_FLAG)
# XLA:CPU's backend optimisation level 1, not the default 2: the suite's programs are tiny and
# compiled once, so compiling is most of its time, and level 1 compiles ~40% faster
# (tests/test_qa.py: 14.5 s vs 24.7 s of backend compilation for its 217 programs) at the same
# float32 results (LLVM does not reassociate floating point without fast-math at any level).
# Not level 0: it miscompiles the chunked-attention gradient with an additive bias into NaNs
# (jax 0.10.2 and still 0.12, XLA:CPU; tests/test_attention.py::test_chunked_equals_plain_values_
# and_gradients fails there and passes at 1 and 2), and it is no quicker overall: what it saves in
# compiling it loses in running (tests/test_qa.py: 36.8 / 37.4 s of CPU at level 0, 32.7 / 35.1 s at
# level 1, alternated). Neither do --xla_llvm_disable_expensive_passes or
# --xla_cpu_parallel_codegen_split_count=1 help (same file, within the noise). An explicit level in
# XLA_FLAGS wins.
if not any(f.startswith("--xla_backend_optimization_level") for f in _flags):
    _flags.append("--xla_backend_optimization_level=1")
os.environ["XLA_FLAGS"] = " ".join(_flags)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# On a GPU (JAX_PLATFORMS=cuda), XLA computes float32 matmuls in TF32 by default (10-bit mantissa,
# errors ~1e-3): the suite's float32 tolerances are for full float32, as on CPU and TPU tests.
if os.environ["JAX_PLATFORMS"] != "cpu":
    os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
# One compilation cache per test run, shared by the xdist workers and the train.py subprocesses the
# tests start (they compile the same tiny programs again and again): ~12% off the suite's time. The
# controller process creates it (workers inherit the variable) and removes it at the end. Every
# program is kept, however quick to compile: a tiny training process compiles ~80 small ones
# (slices, eval step, RNG), and a rerun reading them from the cache takes 3.6 s of CPU, not 6.0 s.
_OWN_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ and "PYTEST_XDIST_WORKER" not in os.environ
if _OWN_CACHE:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="jaxformer-test-jit-")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import collections  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture
def rng() -> np.random.Generator:
    """A fresh, seeded NumPy generator per test (fresh random inputs, reproducible failures)."""
    return np.random.default_rng(0)


def _torch_installed() -> bool:
    import importlib.util
    return importlib.util.find_spec("torch") is not None


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist >= 3.8: keep the order below
        config.option.loadscopereorder = False


def pytest_xdist_make_scheduler(config, log):
    """`make test`'s device split (tests/scheduling.py): multi-device files on gw0 only."""
    if os.environ.get(SPLIT_ENV) == "1" and config.option.dist == "loadfile":
        return make_device_split_scheduler(config, log)
    return None


def pytest_collection_modifyitems(config, items):
    """Files in `scheduling.LONGEST_FIRST` order, then the others; a file's own tests keep their order.

    Tests marked ``hf`` need live PyTorch models: skipped, saying why, where torch is absent (the
    default install; `make test-hf` installs the [hf] extra and runs them)."""
    items.sort(key=lambda item: file_rank(item.path.name))
    if not _torch_installed():
        skip = pytest.mark.skip(reason="needs torch (the [hf] extra): run `make test-hf`")
        for item in items:
            if "hf" in item.keywords:
                item.add_marker(skip)


_SECONDS = collections.defaultdict(float)  # (worker, file) → setup + call + teardown seconds


def pytest_runtest_logreport(report):
    worker = report.node.gateway.id if hasattr(report, "node") else None  # xdist's controller
    _SECONDS[worker, report.location[0]] += report.duration


def pytest_terminal_summary(terminalreporter, config):
    """Under xdist, each worker's busy seconds and the longest files: how balanced the run was."""
    workers = collections.defaultdict(float)
    files = collections.defaultdict(float)
    for (worker, path), seconds in _SECONDS.items():
        workers[worker] += seconds
        files[path] += seconds
    if len(workers) < 2:
        return
    busy = ", ".join(f"{w} {s:.0f} s" for w, s in sorted(workers.items()))
    longest = ", ".join(f"{p.removeprefix('tests/')} {s:.0f}"
                        for p, s in sorted(files.items(), key=lambda x: -x[1])[:12])
    terminalreporter.write_line(f"busy seconds per worker: {busy}; longest files (s): {longest}")


def pytest_sessionfinish(session):
    if _OWN_CACHE and not hasattr(session.config, "workerinput"):
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
