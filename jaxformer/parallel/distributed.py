"""Multi-host start-up: `jax.distributed.initialize()` when the environment asks for it.

Triggers (any of): ``JAX_COORDINATOR_ADDRESS`` (+ ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``) for
explicit launches on several GPU hosts; SLURM (``SLURM_JOB_ID`` with more than one task) and Cloud
TPU pod slices (``TPU_WORKER_HOSTNAMES`` / ``MEGASCALE_COORDINATOR_ADDRESS``), which JAX detects by
itself. On a single host nothing happens.
"""

from __future__ import annotations

import os

import jax


def maybe_initialize_distributed() -> bool:
    """Initialise the JAX distributed runtime if launched multi-process; returns whether it did."""
    env = os.environ
    if env.get("JAX_COORDINATOR_ADDRESS"):
        jax.distributed.initialize(
            coordinator_address=env["JAX_COORDINATOR_ADDRESS"],
            num_processes=int(env["JAX_NUM_PROCESSES"]),
            process_id=int(env["JAX_PROCESS_ID"]),
            local_device_ids=_local_ids(env.get("JAX_LOCAL_DEVICE_IDS")),
        )
        return True
    slurm_multi = int(env.get("SLURM_NTASKS", "1")) > 1 and "SLURM_JOB_ID" in env
    tpu_pod = "," in env.get("TPU_WORKER_HOSTNAMES", "") or "MEGASCALE_COORDINATOR_ADDRESS" in env
    if slurm_multi or tpu_pod:
        jax.distributed.initialize()  # auto-detects coordinator, process count and id
        return True
    return False


def _local_ids(value: str | None):
    return None if not value else [int(x) for x in value.split(",")]
