"""How Orbax writes the train state's ``jax.Array`` leaves (a process-wide Orbax setting).

Orbax's default on CPU and TPU is "replica-parallel" saving: each replica of a replicated array
writes a 1/R slice of it, sliced on its own device. Every (shape, device) pair is a separate
compiled slice program, so a small model on 8 devices compiles hundreds of them at its first save
(a tiny run's first checkpoint took 1.4 s longer; 0.35 s with every program in the persistent
compilation cache). Above `MIN_SLICE_BYTES` per replica the parallel write pays for its programs;
below it one replica writes the whole array (the saved values and the restore are the same).
"""

from __future__ import annotations

import logging

import jax
import orbax.checkpoint as ocp

try:  # Orbax's default handler is built with a metadata store; it has no public name (0.12)
    from orbax.checkpoint._src.metadata import array_metadata_store
except ImportError:  # another Orbax layout: keep Orbax's default handler
    array_metadata_store = None

MIN_SLICE_BYTES = 1 << 20  # per replica: an array replicated 8 ways is split from 8 MiB up


def register_array_handler() -> None:
    """Orbax's default ``jax.Array`` handler, replica-parallel only from `MIN_SLICE_BYTES` up
    (where this Orbax has the store and the option; otherwise its default stays)."""
    if array_metadata_store is None:
        return
    try:
        handler = ocp.type_handlers.ArrayHandler(
            array_metadata_store=array_metadata_store.Store(),
            min_slice_bytes_for_replica_parallel=MIN_SLICE_BYTES)
    except TypeError:  # an Orbax without `min_slice_bytes_for_replica_parallel`
        return
    # Orbax logs a warning for every override, though this one is deliberate: drop that record only
    absl_logger = logging.getLogger("absl")
    absl_logger.addFilter(_drop_override_notice)
    try:
        ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)
    finally:
        absl_logger.removeFilter(_drop_override_notice)


def _drop_override_notice(record: logging.LogRecord) -> bool:
    """False for Orbax's "Type handler registry type … overriding …" record (a logging filter)."""
    return not record.getMessage().startswith("Type handler registry type")
