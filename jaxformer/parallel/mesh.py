"""Device meshes from the config: ``mesh.data``, ``mesh.fsdp``, ``mesh.expert``, ``mesh.context``,
``mesh.tensor`` (−1 = the rest).

The mesh spans all devices of all processes. Axis order is (data, fsdp, expert, context, tensor): the
innermost axis, tensor parallelism, gets the closest devices, context parallelism (a ring of
key/value hops per attention layer) the next closest (`jax.make_mesh` orders devices for the
topology), and on several hosts the outermost axes span the hosts — keep ``tensor`` within a host
(its all-reduces run twice per block) and put the hosts on ``data`` or ``fsdp``.

=====================  =========================================================================
mesh                   what is split
=====================  =========================================================================
data=N (default)       the batch; parameters and optimizer state replicated (DDP)
fsdp=N                 the batch, and every parameter/moment with a d_model axis (ZeRO-3/FSDP)
context=N              the sequence (activations' length axis); attention runs as ring attention
                       over the axis (`jaxformer.parallel.context`); parameters replicated
tensor=N               heads, FFN hidden units and the vocabulary (Megatron); batch replicated
expert=N               the experts of MoE FFNs (GShard); the batch as well (data parallel outside
                       the experts), tokens sent to their experts' devices by all-to-all
data=a,fsdp=b,...      any combination; the product = number of devices
=====================  =========================================================================

Several TPU slices (multi-slice: chips within a slice talk over ICI, slices over the slower
data-center network, DCN): ``mesh.dcn_data=S`` puts S slices along the data axis, ``mesh.dcn_fsdp``
along fsdp; ``data``, ``fsdp`` and ``tensor`` are then sizes within one slice. The mesh keeps the
axes (``data`` of size ``data · dcn_data``), built by `jax`'s hybrid device mesh so that each
slice holds a contiguous block of every axis: only the outer (data / fsdp) collectives cross the
DCN, and with ``dcn_data`` alone only the data-parallel gradient reduction does (MaxText's layout).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh

from jaxformer.parallel.rules import batch_shards
from jaxformer.settings import read, setting

MESH_AXES = ("data", "fsdp", "expert", "context", "tensor")
DCN_AXES = ("dcn_data", "dcn_fsdp")  # slices along data / fsdp (multi-slice)


@dataclasses.dataclass(frozen=True)
class MeshSettings:
    """``config.mesh``: the device mesh (module docstring)."""

    data: int = setting(-1, "data-parallel mesh axis size (-1 = the devices the other axes leave)")
    fsdp: int = setting(1, "FSDP mesh axis size (parameters sharded over it)")
    expert: int = setting(
        1, "expert-parallel mesh axis size: MoE experts split over it, tokens dispatched by "
        "all-to-all; the batch split over it too (must divide model.num_experts)")
    context: int = setting(
        1, "context-parallel mesh axis size: the sequence split over it, attention as zig-zag ring "
        "attention (data.seq_len / target_len multiples of 2×context)")
    tensor: int = setting(1, "tensor-parallel mesh axis size")
    dcn_data: int = setting(
        1, "slices (TPU multi-slice, over the data-center network) along mesh.data; mesh.data, "
        "mesh.fsdp and mesh.tensor are then sizes within one slice")
    dcn_fsdp: int = setting(1, "slices along mesh.fsdp (FSDP across slices: its gathers cross the DCN)")


def mesh_settings(sizes: MeshSettings | Mapping[str, int] | None) -> MeshSettings:
    """``sizes`` as `MeshSettings`: a mapping (``{"fsdp": 8}``, a ``config.mesh``) names some axes,
    the others keep their defaults; ValueError naming an axis that does not exist."""
    if isinstance(sizes, MeshSettings):
        return sizes
    unknown = set(sizes or {}) - set(MESH_AXES) - set(DCN_AXES)
    if unknown:
        raise ValueError(f"unknown mesh axes {sorted(unknown)}; valid axes are "
                         f"{MESH_AXES + DCN_AXES}")
    return read(MeshSettings, dict(sizes or {}))


def dcn_shape(mesh: MeshSettings | Mapping[str, int]) -> dict[str, int]:
    """Slices along each mesh axis: ``{"data": dcn_data, "fsdp": dcn_fsdp, "expert": 1,
    "context": 1, "tensor": 1}``."""
    mesh = mesh_settings(mesh)
    out = {"data": mesh.dcn_data, "fsdp": mesh.dcn_fsdp, "expert": 1, "context": 1, "tensor": 1}
    for a in ("data", "fsdp"):
        if out[a] < 1:
            raise ValueError(f"mesh.dcn_{a}={out[a]} is invalid: use a positive number of slices")
    return out


def mesh_shape(mesh: MeshSettings | Mapping[str, int], num_devices: int) -> dict[str, int]:
    """Resolve sizes (at most one −1) so that their product is ``num_devices``.

    Default (empty config): everything on ``data``. ``data``'s −1 (its default) gives way to
    another axis set to −1: ``{"data": -1, "fsdp": -1}`` is all devices on ``fsdp``. With DCN
    slices (`dcn_shape`) the sizes given are within a slice and the result is the whole mesh
    (``data · dcn_data``, ...).
    """
    mesh = mesh_settings(mesh)
    dcn = dcn_shape(mesh)
    slices = math.prod(dcn.values())
    if num_devices % slices:
        raise ValueError(f"mesh: {num_devices} devices do not split into dcn_data × dcn_fsdp = "
                         f"{slices} slices")
    ici = _ici_shape(mesh, num_devices // slices, _more_devices_hint(dcn, num_devices))
    return {a: ici[a] * dcn[a] for a in MESH_AXES}


def _more_devices_hint(dcn: Mapping[str, int], num_devices: int) -> Callable[[int], str]:
    """For a mesh whose slice needs ``needed`` devices but has fewer: how to get them ("" when it
    has enough, and the sizes are wrong otherwise). Several slices (``dcn``): the sizes are per
    slice, and a topology compiled for needs ``--num_slices`` (`jaxformer.parallel.topology`); one:
    simulated devices on a CPU host (docs/scaling.md)."""
    slices = math.prod(dcn.values())

    def hint(needed: int) -> str:
        if needed <= num_devices // slices:
            return ""
        if slices > 1:
            asked = " × ".join(f"mesh.dcn_{a}={n}" for a, n in dcn.items() if n > 1)
            return (f" ({asked}: {slices} slices of {num_devices // slices} of the {num_devices} "
                    f"devices; the other mesh sizes are per slice. For {slices} slices of a TPU "
                    f"topology pass --num_slices={slices}, else lower the sizes)")
        return (f"; on a CPU host, simulate {needed} devices by starting with "
                f"XLA_FLAGS=--xla_force_host_platform_device_count={needed}")
    return hint


def _ici_shape(mesh: MeshSettings, num_devices: int,
               hint: Callable[[int], str] = lambda needed: "") -> dict[str, int]:
    sizes = {a: getattr(mesh, a) for a in MESH_AXES}
    if sizes["data"] == -1 and any(sizes[a] == -1 for a in MESH_AXES if a != "data"):
        sizes["data"] = 1
    fill = [a for a, s in sizes.items() if s == -1]
    if len(fill) > 1:
        raise ValueError(f"mesh: at most one axis may be -1, got {fill}")
    for a, s in sizes.items():
        if s == 0 or s < -1:
            raise ValueError(f"mesh.{a}={s} is invalid: use a positive size or -1")
    known = math.prod(s for s in sizes.values() if s != -1)
    if fill:
        if num_devices % known:
            device = "device is" if num_devices == 1 else "devices are"
            raise ValueError(f"mesh {sizes}: {num_devices} {device} not divisible by {known}"
                             f"{hint(known)}")
        sizes[fill[0]] = num_devices // known
    if math.prod(sizes.values()) != num_devices:
        raise ValueError(
            f"mesh {sizes} has {math.prod(sizes.values())} devices but {num_devices} are available; "
            "set one axis to -1 to fill the rest"
            f"{hint(math.prod(sizes.values()))}")
    return sizes


def make_mesh(mesh: MeshSettings | Mapping[str, int] | None = None,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A `Mesh` with axes ``("data", "fsdp", "expert", "context", "tensor")`` over ``devices`` (default: all
    devices), of sizes ``mesh`` (`MeshSettings`, or a mapping of some axes: `mesh_settings`)."""
    devices = list(jax.devices() if devices is None else devices)
    mesh = mesh_settings(mesh)
    sizes = mesh_shape(mesh, len(devices))
    shape = tuple(sizes[a] for a in MESH_AXES)
    dcn = tuple(dcn_shape(mesh).values())
    if math.prod(dcn) > 1:
        return _hybrid_mesh(shape, dcn, devices)
    # Auto axes: shardings are propagated by the compiler from the jit in/out shardings and the
    # logical constraints (recent `jax.make_mesh` defaults to Explicit axes, which type-check
    # every op instead).
    # `jax.make_mesh` lays the axes out along the chips' physical topology (ICI rings on a TPU
    # slice), also for a subset of devices or compile-only devices of another machine
    # (`jaxformer.parallel.topology`); a naive reshape would not.
    auto = (AxisType.Auto,) * len(MESH_AXES)
    return jax.make_mesh(shape, MESH_AXES, devices=devices, axis_types=auto)


def _hybrid_mesh(shape: tuple[int, ...], dcn: tuple[int, ...], devices: list) -> Mesh:
    """The mesh of several slices: `mesh_utils.create_hybrid_device_mesh` (ICI axes within a
    slice, DCN axes across). GPUs of several hosts, which share one slice index, are slices by host
    (``process_is_granule``: NVLink within a host, the network across). Devices of one process
    without a slice index (CPU) stand in one slice per block of consecutive devices, in order:
    same shardings, no physical meaning."""
    ici = tuple(s // d for s, d in zip(shape, dcn))
    auto = (AxisType.Auto,) * len(MESH_AXES)
    slices = {getattr(d, "slice_index", None) for d in devices}
    if len(slices) > 1 and None not in slices:
        grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices)
    elif devices[0].platform in ("gpu", "cuda") and len({d.process_index for d in devices}) > 1:
        grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, process_is_granule=True)
    elif all(hasattr(d, "slice_index") for d in devices):  # one TPU slice: its error names it
        grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices)
    else:
        blocks = np.asarray(devices).reshape(*dcn, *ici)  # [dcn axes..., ici axes...]
        n = len(MESH_AXES)
        grid = blocks.transpose([i for pair in zip(range(n), range(n, 2 * n)) for i in pair]
                                ).reshape(shape)
    return Mesh(grid, MESH_AXES, axis_types=auto)


def describe(mesh: Mesh) -> str:
    """E.g. ``"data=2 fsdp=2 expert=1 context=1 tensor=2 (8 devices, 1 process)"``."""
    axes = " ".join(f"{a}={n}" for a, n in mesh.shape.items())
    procs = len({d.process_index for d in mesh.devices.flat})
    return (f"{axes} ({mesh.size} device{'s' if mesh.size > 1 else ''}, "
            f"{procs} process{'es' if procs > 1 else ''})")


def check_batch_size(mesh: Mesh, batch_size: int, grad_accum_steps: int = 1) -> None:
    """Raise ValueError unless each (micro-)batch splits evenly over the mesh's batch axes."""
    shards = batch_shards(mesh)
    micro = batch_size // max(grad_accum_steps, 1)
    if micro % shards:
        what = (f"data.batch_size={batch_size}" if grad_accum_steps <= 1 else
                f"the micro-batch data.batch_size/optimizer.grad_accum_steps={micro}")
        raise ValueError(
            f"{what} is not divisible by the {shards} batch shards of mesh "
            f"{dict(mesh.shape)} (data×fsdp); use a multiple of {shards} or change mesh.data/fsdp")
