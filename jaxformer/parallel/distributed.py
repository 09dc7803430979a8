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

A process that dies (SIGKILL, a crash, a lost host) would leave the others waiting in their next
collective until JAX's coordination service (hosted by process 0) gives up on it and aborts them
with a stack trace. `watch_peers` gets there first, with one line: each process's watchdog thread
writes a heartbeat into the service's key-value store every second and reads the others'; a process
whose heartbeat has not changed for ``JAXFORMER_HEARTBEAT_TIMEOUT`` seconds (default
`HEARTBEAT_TIMEOUT_S`) is gone, and the others print one line naming it and exit with code 1.
JAX's own ``heartbeat_timeout_seconds`` is set to `JAX_HEARTBEAT_FACTOR` times that, a fallback:
JAX's agents beat every half of its timeout, so its service may declare a killed process dead as
soon as half its timeout after the kill; at twice ours it sometimes came first and aborted the
survivor with a stack trace (tests/test_multiprocess.py, once in a full-suite run). A process
that ends normally says so first (a peer that ended is not a lost one), then waits at most
``JAXFORMER_SHUTDOWN_TIMEOUT`` seconds (default `SHUTDOWN_TIMEOUT_S`, JAX's
``shutdown_timeout_seconds``) for the others to end too. If process 0 itself dies, the service goes
with it and JAX ends the others at once with its own message ("Terminating process because the JAX
distributed service detected fatal errors. This most likely indicates that another task died").
"""

from __future__ import annotations

import atexit
import glob
import importlib.util
import itertools
import os
import sys
import threading
import time
from collections.abc import Mapping

import jax

HEARTBEAT_TIMEOUT_S = 50  # a process whose heartbeat is this old is gone
JAX_HEARTBEAT_FACTOR = 4  # JAX's own timeout, in multiples of ours (module docstring)
_watching: dict[str, int] = {}  # the running watchdog's timeout_s (`watch_peers`)
SHUTDOWN_TIMEOUT_S = 300  # JAX's default: how long an ending process waits for the others


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
    heartbeat = _seconds(env, "JAXFORMER_HEARTBEAT_TIMEOUT", HEARTBEAT_TIMEOUT_S)
    timeouts = {"heartbeat_timeout_seconds": JAX_HEARTBEAT_FACTOR * heartbeat,  # ours first
                "shutdown_timeout_seconds": _seconds(env, "JAXFORMER_SHUTDOWN_TIMEOUT",
                                                     SHUTDOWN_TIMEOUT_S)}
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
            **timeouts,
        )
    else:  # auto-detects coordinator, process count and id
        jax.distributed.initialize(**timeouts)
    watch_peers(heartbeat)
    return True


def _seconds(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name, str(default))
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{name}={value!r} must be a whole number of seconds >= 1 (default "
                         f"{default})")
    return int(value)


def watch_peers(timeout_s: int, interval_s: float = 1.0) -> threading.Thread:
    """Start the watchdog thread of the module docstring: every ``interval_s`` it writes this
    process's heartbeat into JAX's key-value store and reads the others'; when one has not changed
    for ``timeout_s`` (and that process did not end normally), or the store (process 0) cannot be
    reached, it prints one line to stderr and ends this process with exit code 1, instead of
    leaving it waiting in a collective that will never complete."""
    from jax._src import distributed as jax_distributed  # the client `initialize` made: no public handle

    state = jax_distributed.global_state
    client, me = state.client, state.process_id
    others = [p for p in range(state.num_processes) if p != me]
    ended = threading.Event()

    @atexit.register  # before JAX's own clean-up (registered earlier, so run later)
    def end() -> None:
        ended.set()
        try:
            client.key_value_set(f"jaxformer/ended/{me}", "1")
        except Exception:  # the service is gone already: nobody is left to tell
            pass

    def stop(why: str) -> None:
        sys.stderr.write(f"{os.path.basename(sys.argv[0])}: error: process {me}: {why}; this "
                         "process stops too. Rerun the same command on every host: the run "
                         "resumes from its last checkpoint\n")
        sys.stderr.flush()
        os._exit(1)

    def read(key: str) -> str | None:
        try:
            return client.key_value_try_get(key)
        except Exception as e:  # not written yet (NOT_FOUND), or the store is gone
            if "NOT_FOUND" in str(e) or "not found" in str(e).lower():
                return None
            raise

    def watch() -> None:
        seen = {p: (None, time.monotonic()) for p in others}
        for beat in itertools.count():
            if ended.is_set():
                return
            try:
                client.key_value_set(f"jaxformer/heartbeat/{me}", str(beat), allow_overwrite=True)
                for p in others:
                    value, since = seen[p]
                    now, latest = time.monotonic(), read(f"jaxformer/heartbeat/{p}")
                    if latest != value:
                        seen[p] = (latest, now)
                    elif now - since > timeout_s and read(f"jaxformer/ended/{p}") is None:
                        if not ended.is_set():
                            stop(f"process {p} of {state.num_processes} is gone (no heartbeat for "
                                 f"{timeout_s} s: killed, crashed or preempted)")
            except Exception as e:  # the service (on process 0) cannot be reached
                if not ended.is_set():
                    stop("the coordination service on process 0 cannot be reached "
                         f"({(str(e).strip().splitlines() or [type(e).__name__])[0][:200]})")
            time.sleep(interval_s)

    thread = threading.Thread(target=watch, name="jaxformer_watch_peers", daemon=True)
    thread.start()
    _watching["timeout_s"] = timeout_s
    return thread


def await_lost_peer() -> None:
    """After a collective failed (a peer's connection closed: its process died), give
    `watch_peers` the time to tell: it ends this process with its one line when a peer is gone;
    this returns (the caller re-raises) when none is, or when no watchdog runs."""
    if "timeout_s" in _watching:
        time.sleep(_watching["timeout_s"] + 3)


def _on_cloud_tpu_vm() -> bool:
    """libtpu installed and TPU chips visible (``/dev/accel*`` on v2–v4, ``/dev/vfio/<n>`` on v5+)."""
    return importlib.util.find_spec("libtpu") is not None and bool(
        glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def _local_ids(value: str | None):
    return None if not value else [int(x) for x in value.split(",")]
