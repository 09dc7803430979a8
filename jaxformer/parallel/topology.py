"""Accelerator topologies without the hardware: compile-only devices for TPU slices and GPU hosts.

``jax.experimental.topologies.get_topology_desc`` describes the chips of a slice that this machine
does not have (libtpu, from the package registry, compiles for them on a CPU host, as MaxText's
``train_compile`` does); a `jax.sharding.Mesh` over those devices lowers and compiles the trainer's
real step, and nothing is allocated. Names follow Cloud TPU's accelerator types:

    v5e:2x2   v5e:16x16   v5p:4x4x4   v5p:8x8x4   v6e:16x16   v4:2x2x1   (TPU slices)
    h100:8    h200:8    h100:2x8                      (GPU hosts: <gpus> or <hosts>x<gpus per host>)

A v5p / v4 name counts chips (Cloud TPU's ``v5p-128`` is 64 chips, ``v5p:4x4x4``). GPUs need jax's
CUDA plugin (the ``[cuda-aot]`` extra) and a description of the GPU for XLA's compiler, a
``GpuTargetConfigProto`` in text form: ours are in ``gpu_targets/`` (`GPU_TARGETS`), written from
NVIDIA's published figures.

`CHIPS` holds each chip's published peak bf16 rate, HBM capacity and bandwidth, and ICI bandwidth,
with its source: the roofline of `jaxformer.compile` divides by these, not by measurements.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

import jax

from jaxformer.host import tpu_host


@dataclasses.dataclass(frozen=True)
class Chip:
    """Published figures of one accelerator chip."""

    name: str
    platform: str  # "tpu" or "cuda"
    bf16_flops: float  # peak dense bf16 FLOP/s
    hbm_bytes: float  # HBM capacity
    hbm_bytes_per_s: float  # HBM bandwidth
    ici_bytes_per_s: float  # bidirectional inter-chip bandwidth per chip (NVLink for GPUs)
    source: str
    # Bidirectional bandwidth per chip between hosts (GPUs: InfiniBand), where the roofline prices
    # what crosses hosts separately; None: not modelled (TPU slices: the DCN is in the ICI term).
    network_bytes_per_s: float | None = None


_GB = 1e9
# HBM is binary on every chip (Cloud TPU's "16 GiB", "95 GiB", "32 GiB"): libtpu's own refusal of a
# program too large says so, e.g. "exceeds available HBM (15.75G)" on a v5e, 31.24G on a v6e and
# 30.75G on a v4 (their capacity less what the runtime keeps), and a v5p compiled 89.8 GiB of one
# program (tests/test_compile.py). Decimal 16e9 understated the TPUs by 7%.
CHIPS = {
    "v4": Chip("TPU v4", "tpu", 275e12, 32 * 2**30, 1228 * _GB, 300 * _GB,
               "https://cloud.google.com/tpu/docs/v4"),
    "v5e": Chip("TPU v5e", "tpu", 197e12, 16 * 2**30, 819 * _GB, 400 * _GB,
                "https://cloud.google.com/tpu/docs/v5e"),
    "v5p": Chip("TPU v5p", "tpu", 459e12, 95 * 2**30, 2765 * _GB, 1200 * _GB,
                "https://cloud.google.com/tpu/docs/v5p"),
    "v6e": Chip("TPU v6e (Trillium)", "tpu", 918e12, 32 * 2**30, 1638 * _GB, 800 * _GB,
                "https://cloud.google.com/tpu/docs/v6e"),
    # GPUs: NVLink 4 is 900 GB/s per GPU, 450 each way; "80 GB" is 80 GiB (gpu_targets/); between
    # hosts, a DGX's one 400 Gb/s ConnectX-7 InfiniBand port per GPU: 50 GB/s each way.
    "h100": Chip("NVIDIA H100 SXM", "cuda", 989e12, 80 * 2**30, 3350 * _GB, 900 * _GB,
                 "NVIDIA H100 Tensor Core GPU datasheet (SXM: dense bf16, HBM3, NVLink); "
                 "DGX H100 datasheet (InfiniBand)", 100 * _GB),
    "h200": Chip("NVIDIA H200 SXM", "cuda", 989e12, 141 * 2**30, 4800 * _GB, 900 * _GB,
                 "NVIDIA H200 Tensor Core GPU datasheet (SXM: dense bf16, HBM3e, NVLink); "
                 "DGX H200 datasheet (InfiniBand)", 100 * _GB),
}
# XLA GPU target descriptions (text `stream_executor.GpuTargetConfigProto`) in gpu_targets/.
GPU_TARGETS = {"h100": "h100_sxm.txtpb", "h200": "h200_sxm.txtpb"}
# jax's CUDA plugin for compiling without a GPU: the plugin matching jaxlib, without the CUDA
# runtime wheels, plus what XLA's GPU compiler itself loads — libdevice (nvidia-nvvm) and a PTX
# assembler (nvJitLink; or ptxas from nvidia-cuda-nvcc / a CUDA toolkit).
CUDA_AOT_INSTALL = "pip install -e '.[cuda-aot]'"
# libtpu's topology names: the chip generation as its compiler knows it.
_TPU_NAMES = {"v4": "v4", "v5e": "v5e", "v5p": "v5p", "v6e": "v6e"}
# Cloud TPU's accelerator types (``v5litepod-4``, ``v5p-8``): the name, and TensorCores per chip
# (v4 and v5p count cores, so ``v5p-8`` is 4 chips).
_ACCELERATOR_TYPES = {"v4": ("v4", 2), "v5e": ("v5litepod", 1), "v5p": ("v5p", 2), "v6e": ("v6e", 1)}


@dataclasses.dataclass(frozen=True)
class Topology:
    """A parsed ``--topology`` name: the chip, the slice shape and the number of slices."""

    name: str
    chip: Chip
    shape: tuple[int, ...]
    num_slices: int = 1

    @property
    def chips_per_slice(self) -> int:
        return math.prod(self.shape)

    @property
    def num_chips(self) -> int:
        return self.chips_per_slice * self.num_slices


def parse_topology(name: str, num_slices: int = 1) -> Topology:
    """``"v5p:4x4x4"`` → `Topology`; ValueError naming the accepted forms otherwise."""
    m = re.fullmatch(r"\s*([a-z0-9]+)\s*:\s*(\d+(?:x\d+)*)\s*", name.lower())
    kinds = ", ".join(sorted(CHIPS))
    if not m or m.group(1) not in CHIPS:
        raise ValueError(f"--topology {name!r}: expected <chip>:<shape> with chip one of {kinds}, "
                         "e.g. v5e:2x2, v5p:4x4x4, h100:8")
    chip = CHIPS[m.group(1)]
    shape = tuple(int(s) for s in m.group(2).split("x"))
    if chip.platform == "cuda" and (len(shape) > 2 or num_slices != 1):
        raise ValueError(f"--topology {name!r} with {num_slices} slices: GPUs are <gpu>:<gpus> "
                         "(one host) or <gpu>:<hosts>x<gpus per host>, e.g. h100:8 or h100:2x8; "
                         "--num_slices is for TPUs")
    if num_slices < 1 or min(shape) < 1:
        raise ValueError(f"--topology {name!r} with {num_slices} slices: sizes must be positive")
    return Topology(name, chip, shape, num_slices)


def topology_devices(topo: Topology) -> list:
    """Compile-only devices of every chip of ``topo`` (all slices), in the order jax gives them.

    TPU: needs libtpu (``pip install -e '.[tpu]'``). libtpu takes a machine-wide lock file on
    start-up; compile-only use allocates nothing, so the lock is waived for this process
    (``ALLOW_MULTIPLE_LIBTPU_LOAD``), and other jax processes on the machine are not blocked.
    GPU: `gpu_devices`.
    """
    from jax.experimental import topologies

    if topo.chip.platform == "cuda":
        return gpu_devices(topo)
    if topo.chip.platform == "tpu":
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        key = next(k for k, c in CHIPS.items() if c is topo.chip)
        if not tpu_host():
            quiet_libtpu_start(key, topo.chips_per_slice)
        shape = "x".join(map(str, topo.shape))
        try:
            # v4 runs in "megacore" mode (one device per chip, as jax uses it); libtpu's default
            # description would list each of its two TensorCores.
            extra = {"chip_config_name": "megacore"} if key == "v4" else {}
            desc = topologies.get_topology_desc(
                platform="tpu", topology_name=f"{_TPU_NAMES[key]}:{shape}",
                num_slices=topo.num_slices, **extra)
        except (RuntimeError, ValueError, jax.errors.JaxRuntimeError) as e:
            raise ValueError(f"--topology {topo.name}: libtpu could not describe it ({e}); "
                             "is libtpu installed (pip install -e '.[tpu]') and the shape one "
                             "Cloud TPU offers?") from e
        return list(desc.devices)
    raise ValueError(f"--topology {topo.name}: no compile-only devices for {topo.chip.platform}")


def quiet_libtpu_start(key: str, chips: int) -> None:
    """Describe this TPU-less host to libtpu as one worker of a ``key`` slice of ``chips`` chips.

    On a host without a TPU, libtpu's start-up looks for the host's accelerator type (asking the
    Cloud TPU metadata server) and its workers' hostnames, fails, and prints a block that reads as
    an error ("Failed to find host bounds for accelerator type", "E0000 … unexpected worker
    hostname", a source trace) before the compile-only topology works anyway. The environment
    variables it reads instead (``TPU_SKIP_MDS_QUERY``, ``TPU_WORKER_HOSTNAMES``,
    ``TPU_ACCELERATOR_TYPE``; a user's own values win) silence it. They describe only the local
    host, which compiles nothing for itself: a step compiled for ``v5p:2x2x2`` gave the same report,
    line for line, with and without them, also with another chip's type."""
    name, cores_per_chip = _ACCELERATOR_TYPES[key]
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", f"{name}-{chips * cores_per_chip}")


def gpu_target(key: str) -> str:
    """The text `GpuTargetConfigProto` of GPU ``key`` (`GPU_TARGETS`), from the package data."""
    from importlib import resources

    return resources.files(__package__).joinpath("gpu_targets", GPU_TARGETS[key]).read_text()


def cuda_plugin_installed() -> bool:
    """Whether jax's CUDA PJRT plugin (CUDA 13 or 12) is importable in this environment."""
    from importlib.util import find_spec

    return find_spec("jax_plugins") is not None and any(
        find_spec(f"jax_plugins.{name}") is not None for name in ("xla_cuda13", "xla_cuda12"))


def gpu_devices(topo: Topology) -> list:
    """Compile-only devices of ``topo``'s GPUs (`Topology.shape`: ``(gpus,)`` or ``(hosts, gpus)``),
    host by host: jax's CUDA plugin describes ``1 x hosts x gpus`` GPUs of our target description
    (`gpu_target`), and XLA's GPU compiler compiles for them on this machine, GPU or not. The
    process's own platform is unchanged (``JAX_PLATFORMS=cpu`` is fine)."""
    from jax.experimental import topologies

    key = next(k for k, c in CHIPS.items() if c is topo.chip)
    if not cuda_plugin_installed():
        raise ValueError(f"--topology {topo.name}: compiling for GPUs needs jax's CUDA plugin, "
                         f"which is not installed: {CUDA_AOT_INSTALL}")
    # The plugin checks the CUDA runtime's version when it loads, unless told the process is
    # CPU-only: compiling needs no runtime (and none may be here); the check is skipped.
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    hosts, gpus = topo.shape if len(topo.shape) == 2 else (1, topo.shape[0])
    try:
        desc = topologies.get_topology_desc(platform="cuda", topology=f"1x{hosts}x{gpus}",
                                            target_config=gpu_target(key))
    except NotImplementedError as e:  # the plugin did not load: jax started before we could ask
        raise ValueError(f"--topology {topo.name}: jax's CUDA plugin did not load in this process "
                         "(without a GPU its start-up check fails unless jax starts with "
                         "JAX_PLATFORMS=cpu or JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 set)") from e
    except (RuntimeError, ValueError, jax.errors.JaxRuntimeError) as e:
        raise ValueError(f"--topology {topo.name}: jax's CUDA plugin could not describe it "
                         f"({e}); is it the version of jaxlib ({CUDA_AOT_INSTALL})?") from e
    return list(desc.devices)


__all__ = ["CHIPS", "CUDA_AOT_INSTALL", "Chip", "GPU_TARGETS", "Topology", "cuda_plugin_installed",
           "gpu_devices", "gpu_target", "parse_topology", "topology_devices"]
