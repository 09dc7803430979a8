"""Multi-host start-up: `jax.distributed.initialize()` when the environment asks for it.

Call `maybe_initialize_distributed` first thing (``train.py`` does), before anything touches a
device. It initialises when the environment says the run has several processes, and does nothing
on a single host:

- ``JAX_COORDINATOR_ADDRESS=host:port`` with ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` (optional
  ``JAX_LOCAL_DEVICE_IDS=0,1,…``): explicit launch, e.g. on several GPU hosts;
- SLURM (``srun``) with more than one task, or Open MPI (``mpirun``) with more than one rank: JAX
  reads ``SLURM_*`` / ``OMPI_*`` itself;
- a Cloud TPU VM (libtpu installed, chips at ``/dev/accel*`` or ``/dev/vfio/<n>``), or
  ``TPU_WORKER_HOSTNAMES`` / ``MEGASCALE_COORDINATOR_ADDRESS`` set: JAX asks the TPU metadata
  (a single-host TPU VM gets a one-process runtime, which is harmless);
- ``JAXFORMER_DISTRIBUTED=1`` forces auto-detected initialisation, ``=0`` disables all of the above.

After initialisation `jax.devices()` lists the devices of all processes (the mesh spans them),
`jax.process_index()`/`jax.process_count()` tell the data pipeline which slice of the global batch
this process feeds, and Orbax writes each checkpoint collectively (every process writes its own
shards; the directory must be on storage all hosts share, e.g. GCS or NFS).
"""

from __future__ import annotations

import glob
import importlib.util
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
    if probe and _on_cloud_tpu_vm():
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


def _on_cloud_tpu_vm() -> bool:
    """libtpu installed and TPU chips visible (``/dev/accel*`` on v2–v4, ``/dev/vfio/<n>`` on v5+)."""
    return importlib.util.find_spec("libtpu") is not None and bool(
        glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def _local_ids(value: str | None):
    return None if not value else [int(x) for x in value.split(",")]
