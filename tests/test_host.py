"""The host (`jaxformer.host`): the CPU's name, and a command's start-up output: no failed libtpu
start on a host without TPU chips, no Orbax notice for our deliberate handler override
(`jaxformer.checkpoint.orbax_arrays`)."""

import importlib.util
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxformer.checkpoint import orbax_arrays
from jaxformer.host import cpu_name, other_jax_plugins, platforms_to_start, tpu_host

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("env, configured, libtpu, tpu, plugins, expected", [
    ({}, None, True, False, False, "cpu"),  # the CPU host with `make install`: skip libtpu
    ({"JAX_PLATFORMS": "tpu"}, None, True, False, False, None),  # the user chose
    ({"JAX_PLATFORMS": "cpu"}, None, True, False, False, None),  # already CPU, nothing to do
    ({}, "cuda", True, False, False, None),  # chosen in jax.config
    ({}, None, False, False, False, None),  # no libtpu: nothing to skip
    ({}, None, True, True, False, None),  # a TPU host: start it
    ({}, None, True, False, True, None),  # a CUDA plugin may start: JAX's default
])
def test_platforms_to_start(env, configured, libtpu, tpu, plugins, expected):
    assert platforms_to_start(env, configured, libtpu_installed=libtpu, tpu_present=tpu,
                              other_plugins=plugins) == expected


def test_a_command_starts_without_libtpu_output():
    """What a CPU user of `make install` sees: importing the command lines (every command does
    first) leaves one CPU device and nothing on stderr. Without `skip_absent_tpu`, JAX 0.12 with
    libtpu 0.0.50 printed "Failed to find host bounds …" and an E0000 INVALID_ARGUMENT block."""
    if importlib.util.find_spec("libtpu") is None or tpu_host() or other_jax_plugins():
        pytest.skip("needs libtpu installed on a host with no TPU chip and no other JAX plugin")
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    code = ("import jaxformer.cli, jax; "
            "print(jax.config.jax_platforms, [d.platform for d in jax.devices()])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["cpu", "['cpu']"]
    assert out.stderr == "", out.stderr


def test_orbax_override_notice_dropped_and_filter_removed(caplog):
    caplog.set_level(logging.WARNING, logger="absl")
    orbax_arrays.register_array_handler()
    assert not [r for r in caplog.records if "overriding" in r.getMessage()]
    logging.getLogger("absl").warning("Type handler registry type X overriding Y")  # not ours now
    assert [r for r in caplog.records if "overriding" in r.getMessage()]


def test_cpu_name_is_the_cpuinfo_model_name():
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        pytest.skip("no /proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")]
    assert cpu_name() == (names[0] if names else cpu_name()) and cpu_name()
