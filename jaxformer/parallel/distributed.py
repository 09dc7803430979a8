"""Multi-host start-up: `jax.distributed.initialize()` when the environment asks for it.

Call `maybe_initialize_distributed` first thing (``train.py`` does), before anything touches a
device. It initialises when any of these holds, and does nothing on a single host otherwise:

======================================  ===================================================
environment                             how the processes find each other
======================================  ===================================================
``JAX_COORDINATOR_ADDRESS=host:port``   explicit (several GPU hosts): with ``JAX_NUM_PROCESSES``
                                        and ``JAX_PROCESS_ID`` (optional
                                        ``JAX_LOCAL_DEVICE_IDS=0,1,…``)
SLURM (``srun``), more than one task     JAX reads ``SLURM_*`` (one process per host or per GPU)
Open MPI (``mpirun``), more than one     JAX reads ``OMPI_*``
Cloud TPU VM (``/dev/accel*`` or         JAX asks the TPU metadata server (a single-host TPU VM
``/dev/vfio/<n>``), or                  initialises a one-process runtime, which is harmless)
``TPU_WORKER_HOSTNAMES`` / Megascale
``JAXFORMER_DISTRIBUTED=1`` / ``=0``     force auto-detected initialisation / never initialise
======================================  ===================================================

After initialisation `jax.devices()` lists the devices of all processes (the mesh spans them),
`jax.process_index()`/`jax.process_count()` tell the data pipeline which slice of the global batch
this process feeds, and Orbax writes each checkpoint collectively (every process writes its own
shards; the directory must be on storage all hosts share, e.g. GCS or NFS).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping

import jax


def distributed_requested(env: Mapping[str, str] | None = None) -> str | None:
    """Which trigger of the table above applies (None: single host).

    ``env`` defaults to `os.environ`; only then are the TPU device files probed as well.
    """
    probe = env is None
    env = os.environ if env is None else env
    forced = env.get("JAXFORMER_DISTRIBUTED", "").strip().lower()
    if forced in ("0", "false", "no"):
        return None
    if forced in ("1", "true", "yes"):
        return "JAXFORMER_DISTRIBUTED"
    if env.get("JAX_COORDINATOR_ADDRESS"):
        return "JAX_COORDINATOR_ADDRESS"
    if "SLURM_JOB_ID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
        return "SLURM"
    if int(env.get("OMPI_COMM_WORLD_SIZE", "1")) > 1:
        return "OpenMPI"
    if "," in env.get("TPU_WORKER_HOSTNAMES", "") or "MEGASCALE_COORDINATOR_ADDRESS" in env:
        return "TPU"
    if probe and (glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")):
        return "TPU VM"
    return None


def maybe_initialize_distributed() -> bool:
    """Initialise the JAX distributed runtime if launched multi-process; returns whether it did."""
    trigger = distributed_requested()
    if trigger is None or jax.distributed.is_initialized():
        return False
    env = os.environ
    if trigger == "JAX_COORDINATOR_ADDRESS":
        missing = [k for k in ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID") if k not in env]
        if missing:
            raise ValueError(f"JAX_COORDINATOR_ADDRESS={env['JAX_COORDINATOR_ADDRESS']!r} is set but "
                             f"{missing} are not: set JAX_NUM_PROCESSES (the number of processes) "
                             "and JAX_PROCESS_ID (0 … N-1, unique per process)")
        jax.distributed.initialize(
            coordinator_address=env["JAX_COORDINATOR_ADDRESS"],
            num_processes=int(env["JAX_NUM_PROCESSES"]),
            process_id=int(env["JAX_PROCESS_ID"]),
            local_device_ids=_local_ids(env.get("JAX_LOCAL_DEVICE_IDS")),
        )
    else:
        jax.distributed.initialize()  # auto-detects coordinator, process count and id
    return True


def _local_ids(value: str | None):
    return None if not value else [int(x) for x in value.split(",")]
