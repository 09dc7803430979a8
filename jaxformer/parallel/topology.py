"""Accelerator topologies without the hardware: compile-only devices for TPU slices and GPU hosts.

``jax.experimental.topologies.get_topology_desc`` describes the chips of a slice that this machine
does not have (libtpu, from the package registry, compiles for them on a CPU host, as MaxText's
``train_compile`` does); a `jax.sharding.Mesh` over those devices lowers and compiles the trainer's
real step, and nothing is allocated. Names follow Cloud TPU's accelerator types:

    v5e:2x2   v5e:16x16   v5p:4x4x4   v5p:8x8x4   v6e:16x16   v4:2x2x1   (TPU slices)
    h100:8    h200:8                                                    (one GPU host)

A v5p / v4 name counts chips (Cloud TPU's ``v5p-128`` is 64 chips, ``v5p:4x4x4``). GPUs need jax's
CUDA plugin and a GPU target description (not shipped by any wheel; see docs/scaling.md).

`CHIPS` holds each chip's published peak bf16 rate, HBM capacity and bandwidth, and ICI bandwidth,
with its source: the roofline of `jaxformer.compile` divides by these, not by measurements.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

import jax


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


_GB = 1e9
CHIPS = {
    "v4": Chip("TPU v4", "tpu", 275e12, 32 * 2**30, 1228 * _GB, 300 * _GB,
               "https://cloud.google.com/tpu/docs/v4"),
    "v5e": Chip("TPU v5e", "tpu", 197e12, 16 * _GB, 819 * _GB, 400 * _GB,
                "https://cloud.google.com/tpu/docs/v5e"),
    "v5p": Chip("TPU v5p", "tpu", 459e12, 95 * _GB, 2765 * _GB, 1200 * _GB,
                "https://cloud.google.com/tpu/docs/v5p"),
    "v6e": Chip("TPU v6e (Trillium)", "tpu", 918e12, 32 * _GB, 1638 * _GB, 800 * _GB,
                "https://cloud.google.com/tpu/docs/v6e"),
    "h100": Chip("NVIDIA H100 SXM", "cuda", 989e12, 80 * _GB, 3350 * _GB, 900 * _GB,
                 "NVIDIA H100 Tensor Core GPU datasheet (dense bf16, SXM5)"),
    "h200": Chip("NVIDIA H200 SXM", "cuda", 989e12, 141 * _GB, 4800 * _GB, 900 * _GB,
                 "NVIDIA H200 Tensor Core GPU datasheet (dense bf16, SXM)"),
}
# libtpu's topology names: the chip generation as its compiler knows it.
_TPU_NAMES = {"v4": "v4", "v5e": "v5e", "v5p": "v5p", "v6e": "v6e"}


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
    if chip.platform == "cuda" and len(shape) != 1:
        raise ValueError(f"--topology {name!r}: a GPU host is <gpu>:<count>, e.g. h100:8")
    if num_slices < 1 or min(shape) < 1:
        raise ValueError(f"--topology {name!r} with {num_slices} slices: sizes must be positive")
    return Topology(name, chip, shape, num_slices)


def topology_devices(topo: Topology) -> list:
    """Compile-only devices of every chip of ``topo`` (all slices), in the order jax gives them.

    TPU: needs libtpu (``pip install -e '.[tpu]'``). libtpu takes a machine-wide lock file on
    start-up; compile-only use allocates nothing, so the lock is waived for this process
    (``ALLOW_MULTIPLE_LIBTPU_LOAD``), and other jax processes on the machine are not blocked.
    """
    from jax.experimental import topologies

    if topo.chip.platform == "tpu":
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        key = next(k for k, c in CHIPS.items() if c is topo.chip)
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
    raise ValueError(f"--topology {topo.name}: compiling for GPUs without one needs jax's CUDA "
                     "plugin and an XLA GPU target description (docs/scaling.md); not set up here")


__all__ = ["CHIPS", "Chip", "Topology", "parse_topology", "topology_devices"]
