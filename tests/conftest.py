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

# `make test` hands whole files to its 2 workers (--dist loadfile), in collection order, the next
# file to whichever worker runs out first. Longest first (the classic LPT rule) leaves only short
# files for the end, so neither worker idles for minutes while the other finishes a long file
# (xdist's default, files with the most tests first, put these few-test long files last). The
# order comes from the slowest tests of a full run and file totals measured side by side; the
# summary line at the end of a `make test` run ("longest files") gives new figures.
LONGEST_FIRST = (
    "test_train.py",  # three pretraining runs; killed, preempted and resumed subprocesses
    "test_multiprocess.py",  # two-process runs, one process killed or preempted (4.4 min alone,
    # measured beside test_train.py's 4.3 min on a loaded 2-core machine)
    "test_ring_attention.py",  # context-parallel train steps and loss curves (~130 s: 1-layer
    # models, one run per family and mesh for the step and loss-curve tests)
    "test_demo.py",  # the whole demo at tiny settings (~80 s)
    "test_compile.py",  # seven train steps compiled for TPU slices by libtpu (~85 s)
    "test_lora.py",
    "test_nnx.py",
    "test_distill.py",
    "test_evaluate.py",
    "test_llama_sft.py",  # LoRA sft of a local Llama checkpoint, end to end (~70 s)
    "test_own_data.py",  # a train.py subprocess on a headerless TSV, then evaluate (~50 s)
    "test_decode.py",
    "test_hf_finetune.py",  # the worked examples: RoBERTa on a TSV, BART seq2seq (~115 s)
    "test_convert_llama.py",  # five golden Llama-family models, greedy generation (~90 s)
    "test_parallel.py",
    "test_models.py",
    "test_reliability.py",
    "test_scheduled_sampling.py",
    "test_qa.py",
    "test_checkpoint_select.py",
    "test_permutation_lm.py",
    "test_albert.py",
    "test_learning.py",  # one test (~20 s)
    "test_beam.py",
    "test_convert.py",
    "test_nnx_train.py",
)


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


def pytest_collection_modifyitems(config, items):
    """Files in `LONGEST_FIRST` order, then the others; a file's own tests keep their order.

    Tests marked ``hf`` need live PyTorch models: skipped, saying why, where torch is absent (the
    default install; `make test-hf` installs the [hf] extra and runs them)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
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
