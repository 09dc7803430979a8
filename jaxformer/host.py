"""The host a command runs on: what it has (TPU chips, the CPU's name) and which JAX backends the
command lines start on it (not libtpu's where there is no TPU chip).

`make install` brings libtpu (the ``[tpu]`` extra: tests/test_compile.py compiles for TPU slices
on a CPU host, `jaxformer.parallel.topology`). With ``JAX_PLATFORMS`` unset, JAX starts every
backend it has when a program first asks for devices, libtpu's included. On a host with no TPU
chip libtpu fails, which JAX ignores, but first it prints half a dozen lines to stderr ("Failed to
find host bounds for accelerator type", "E0000 … INVALID_ARGUMENT: Error: unexpected worker
hostname …") that read as if the run had failed. Every ``train.py`` of a CPU user printed them.

`skip_absent_tpu` sets ``jax_platforms`` to ``cpu`` when that is the only backend that could start
anyway: libtpu installed, no TPU chip on the PCI bus, no other JAX plugin (a CUDA one, say)
installed, and neither ``JAX_PLATFORMS`` nor ``jax_platforms`` chosen by the user. The devices a
program gets are the same; only the failed start is gone. Compile-only TPU topologies
(`jaxformer.parallel.topology`) load libtpu on their own, whatever the platforms; there
`quiet_libtpu_start` describes the TPU-less host to libtpu, which then starts without the block.

The command lines call it (``jaxformer.cli``, the demo, the benchmarks); library functions leave
JAX's configuration alone, as `jaxformer.compilation_cache` does.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import platform
from collections.abc import Mapping
from importlib.metadata import entry_points
from pathlib import Path

import jax

# Cloud TPU chips are PCI devices of Google's vendor id (as jax's own TPU detection reads them).
# Other Google devices (a GCE VM's gVNIC) share it: those hosts keep JAX's default, which is safe.
GOOGLE_PCI_VENDOR = "0x1ae0"


def tpu_host() -> bool:
    """Whether this host may have a TPU chip: a Google PCI device, or a TPU device node (/dev/accel*
    on v4 and v5p, /dev/vfio/* on v5e and v6e). Errs toward yes."""
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            if Path(vendor).read_text().strip() == GOOGLE_PCI_VENDOR:
                return True
        except OSError:
            return True
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``'s "model name", else `platform.processor`): what
    the demo's report and the benchmarks' JSON record beside their timings."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def other_jax_plugins() -> bool:
    """Whether a JAX PJRT plugin besides libtpu is installed (jax's CUDA or ROCm plugin, …): found
    by JAX as an entry point of group ``jax_plugins`` or a module of the ``jax_plugins`` package."""
    if list(entry_points(group="jax_plugins")):
        return True
    return importlib.util.find_spec("jax_plugins") is not None


def platforms_to_start(env: Mapping[str, str], configured: str | None, libtpu_installed: bool,
                       tpu_present: bool, other_plugins: bool) -> str | None:
    """The ``jax_platforms`` to set (``"cpu"``), or None to leave JAX's choice alone: the rule of
    `skip_absent_tpu`, on its inputs. ``configured``: ``jax.config.jax_platforms``."""
    if env.get("JAX_PLATFORMS") or configured:
        return None  # the user chose
    if not libtpu_installed or tpu_present or other_plugins:
        return None  # nothing to skip, a TPU to start, or another backend that may start
    return "cpu"


def skip_absent_tpu() -> str | None:
    """Set ``jax_platforms`` to ``cpu`` when libtpu is installed on a host with no TPU chip and CPU
    is the only backend that could start (module docstring). Call before anything asks JAX for
    devices. Returns the platforms it set, or None when it left JAX's choice alone."""
    platforms = platforms_to_start(
        os.environ, jax.config.jax_platforms,
        libtpu_installed=importlib.util.find_spec("libtpu") is not None,
        tpu_present=tpu_host(), other_plugins=other_jax_plugins())
    if platforms is not None:
        jax.config.update("jax_platforms", platforms)
    return platforms
