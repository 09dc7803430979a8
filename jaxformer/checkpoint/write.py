"""Writing checkpoints: `Checkpointer` saves the train state with the data iterator and restores it
on a resume.

Orbax writes each step to a temporary directory and renames it when complete, so a killed run never
leaves a half-written checkpoint; the manifest of checksums (`jaxformer.checkpoint.verify`) is
written just before that rename, and every read verifies it first (a resume falls back to the newest
intact step). `Checkpointer.save` refuses non-finite parameters, and a save that fails (disk full,
permissions, I/O) is `SaveFailed`, one line naming the step, why, and the step a rerun resumes from.

Orbax API: the v0 ``CheckpointManager`` with ``args=`` items and a ``preservation_policy`` (the
non-deprecated form in 0.12.8: no DeprecationWarning, see ``tests/test_legacy_checkpoint.py``). The
v1 API ships only as ``orbax.checkpoint.experimental.v1`` ("subject to change without notice"),
its ``training.Checkpointer`` wraps the same v0 manager, and it has no equivalent of
``CheckpointManager.reached_preemption(step)``, which the loop uses so that every process saves the
same step and stops after a multi-host preemption (`Checkpointer.preempted`). Checkpoints written by
jaxformer 8116153 (jax 0.10.2, orbax 0.12.4) restore unchanged (``tests/data/legacy_gpt_jax010``).
"""

from __future__ import annotations

import dataclasses
import errno
import logging as pylogging
import os
import re
import shutil
import sys
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import grain
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from jaxformer.checkpoint import orbax_arrays
from jaxformer.checkpoint.select import CheckpointSettings, committed_steps, retention_policy
from jaxformer.checkpoint.verify import (
    MANIFEST,
    MARKER,
    CheckpointDamaged,
    StateMismatch,
    read_manifest,
    structure_mismatch,
    verify_step,
    write_manifest,
)


class SaveFailed(RuntimeError):
    """A checkpoint that could not be written (disk full, permissions, an I/O error), or that would
    not fit on the disk: one line naming the step, why, the space a save needs, and the step a
    rerun resumes from."""


def _why(error: BaseException) -> str:
    """The cause of a failed write in a few words: the OS error (Python's, or the code that
    TensorStore reports as ``os_error_code='28'``), else the error's first line."""
    seen = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno:
            return f"{os.strerror(seen.errno)} ({errno.errorcode.get(seen.errno, seen.errno)})"
        code = re.search(r"os_error_code='?(\d+)", str(seen))
        if code:
            n = int(code.group(1))
            return f"{os.strerror(n)} ({errno.errorcode.get(n, n)})"
        seen = seen.__cause__ or seen.__context__
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]


def _megabytes(n: int | None) -> str:
    return "an unknown amount" if n is None else f"{n / 1e6:.1f} MB"


def _tree_bytes(path: Path) -> int:
    """The disk space the files under ``path`` take (allocated blocks, not their lengths)."""
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


class _OrbaxSaveErrors(pylogging.Filter):
    """Orbax logs a failed background save, traceback included, from each thread that sees it,
    and asyncio logs "Future exception was never retrieved" at exit for each of its writes left
    failed; the `Checkpointer` reports the failure once, as `SaveFailed` (its cause chained).
    Drops ERROR records with a traceback logged from, or raised in, Orbax's files."""

    def filter(self, record: pylogging.LogRecord) -> bool:
        if not (record.exc_info and record.levelno >= pylogging.ERROR):
            return True
        orbax = f"{os.sep}orbax{os.sep}"
        raised_in = [f.filename for f in traceback.extract_tb(record.exc_info[2])]
        return not (orbax in record.pathname or any(orbax in f for f in raised_in))


def _is_late_loop_callback(hook_args) -> bool:
    """Whether ``hook_args`` (`sys.unraisablehook`'s) is asyncio's ``RuntimeError('Event loop is
    closed')`` raised by ``loop.call_soon_threadsafe`` straight into native code: TensorStore
    finishing a write of a failed save after Orbax's background thread closed its event loop
    (TensorStore reports it with ``PyErr_WriteUnraisable``). A save that found the disk full printed
    one such traceback per chunk still in flight (86-154 of them)."""
    frames = traceback.extract_tb(hook_args.exc_traceback)
    return (hook_args.exc_type is RuntimeError and str(hook_args.exc_value) == "Event loop is closed"
            and [f.name for f in frames] == ["call_soon_threadsafe", "_check_closed"]
            and all(f.filename.endswith(f"asyncio{os.sep}base_events.py") for f in frames))


def _quiet_late_loop_callbacks() -> None:
    """Wrap ``sys.unraisablehook`` (once) so that `_is_late_loop_callback` errors print nothing:
    the save they belong to has failed and is reported once, as `SaveFailed`. Everything else
    goes to the hook that was there."""
    if getattr(sys.unraisablehook, "jaxformer_quiet_loop", False):
        return
    previous = sys.unraisablehook

    def hook(hook_args) -> None:
        if not _is_late_loop_callback(hook_args):
            previous(hook_args)

    hook.jaxformer_quiet_loop = True
    sys.unraisablehook = hook


@jax.jit
def _all_finite(tree) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
              if jnp.issubdtype(x.dtype, jnp.floating)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


class Checkpointer:
    """Keeps the last ``checkpoint.keep`` checkpoints plus the best by ``best_metric`` when given
    (`jaxformer.checkpoint.select.retention_policy`: the metrics passed to `save` are written
    with each step); each carries a manifest of checksums (`jaxformer.checkpoint.verify`), checked
    before it is read.

    Reading (`latest_step`, `steps`, `restore`) never writes; Orbax's manager (which creates the
    directory and removes the temporary directories of killed saves) starts at the first save.

    A save that fails in Orbax's background thread (disk full, permissions, I/O) raises
    `SaveFailed` at the next `check` (the trainer calls it at every step boundary), `save`,
    `wait` or `close`, its temporary directory removed; before each save the free space is
    checked against the size of the previous save (one ``statvfs``), so a save that cannot fit
    is refused before it starts.

    ``settings`` is the run's ``checkpoint`` section (`CheckpointSettings`; its defaults when None);
    keyword ``overrides`` replace its fields (``Checkpointer(d, async_save=False)``).
    """

    def __init__(self, workdir: str | os.PathLike, settings: CheckpointSettings | None = None,
                 **overrides: Any):
        # Always Orbax's async path, whose post-finalization callback writes the manifest inside
        # the commit; async_save=False waits for each save. best_fn only makes Orbax write (and
        # read back on a resume) each step's metrics; the preservation policy alone deletes.
        s = dataclasses.replace(settings or CheckpointSettings(), **overrides)
        best_metric = self.best_metric = s.best_metric or None  # '' (or None): no best kept
        self._options = ocp.CheckpointManagerOptions(
            preservation_policy=retention_policy(s.keep, best_metric, s.best_mode),
            best_fn=(lambda m: m.get(best_metric)) if best_metric else None, best_mode=s.best_mode,
            enable_async_checkpointing=True,
            create=True, cleanup_tmp_directories=True,
            async_options=ocp.AsyncOptions(post_finalization_callback=self._seal))
        self.async_save = s.async_save
        self.workdir = Path(workdir).absolute()
        self.directory = self.workdir / "checkpoints"
        self._manager, self._sealing, self._pending = None, None, False
        self._save_bytes: int | None = None  # the size of the last save (process 0)
        self._state_bytes = 0  # the train state's array bytes, before a save has been measured

    @property
    def manager(self) -> ocp.CheckpointManager:
        if self._manager is None:
            orbax_arrays.register_array_handler()  # small arrays: no per-device slice programs
            for logger in map(pylogging.getLogger, ("absl", "asyncio")):
                if not any(isinstance(f, _OrbaxSaveErrors) for f in logger.filters):
                    logger.addFilter(_OrbaxSaveErrors())
            _quiet_late_loop_callbacks()
            self._manager = ocp.CheckpointManager(self.directory, options=self._options)
        return self._manager

    def steps(self) -> list[int]:
        """Committed steps, ascending (Orbax renames a step's directory to ``<step>`` when done)."""
        return committed_steps(self.directory)

    def latest_step(self) -> int | None:
        return (self.steps() or [None])[-1]

    def resume_point(self) -> str:
        """Where rerunning the command starts, for messages: the newest committed step, or none."""
        step = self.latest_step()
        if step is None:
            return "no checkpoint was saved yet (rerunning the command starts from scratch)"
        return f"the last good checkpoint is step {step} (rerunning the command resumes there)"

    def save(self, step: int, state, data_iter=None, metrics: dict | None = None) -> None:
        params = state["params"] if isinstance(state, dict) else state.params
        if not bool(_all_finite(params)):
            raise FloatingPointError(
                f"refusing to checkpoint step {step}: parameters contain NaN/Inf (training diverged; "
                f"{self.resume_point()}). Lower the learning rate or enable clipping "
                "(optimizer.clip_norm).")
        items = {"state": ocp.args.StandardSave(state)}
        if data_iter is not None and hasattr(data_iter, "get_state"):
            items["data"] = grain.checkpoint.CheckpointSave(data_iter)
        self.wait()  # the previous step's manifest is written (`SaveFailed` if it failed)
        self._check_space(step)
        self._sealing, self._pending = step, True
        if self._save_bytes is None:  # no save measured yet: the arrays' bytes, for messages
            self._state_bytes = sum(getattr(x, "nbytes", 0) for x in jax.tree.leaves(state))
        if self.best_metric:  # {}: saved without evaluation, ranked last (kept as a latest step)
            metrics = dict(metrics or {})
        try:
            self.manager.save(step, args=ocp.args.Composite(**items), metrics=metrics,
                              custom_metadata={MARKER: MANIFEST})
        except OSError as e:  # a write before Orbax's background thread (its directories)
            self._pending = False
            raise self._failure(step, e) from e
        if not self.async_save:
            self.wait()

    def check(self) -> None:
        """Raise `SaveFailed` if the save in the background has failed; returns at once while it
        is still writing. With several processes only `save`, `wait` and `close` check (each
        process would see the failure at its own step, the others waiting in a collective)."""
        if (self._pending and jax.process_count() == 1
                and not self.manager.is_saving_in_progress()):
            self.wait()

    def _check_space(self, step: int) -> None:
        """Refuse ``step``'s save when the disk has less free space than the previous save took
        (process 0 decides for all)."""
        free = -1  # -1: enough space, or nothing to compare with (no save yet)
        if jax.process_index() == 0:
            if self._save_bytes is None and self.latest_step() is not None:
                self._save_bytes = _tree_bytes(self.directory / str(self.latest_step()))
            left = shutil.disk_usage(self.directory if self.directory.is_dir() else self.workdir)
            if self._save_bytes is not None and left.free < self._save_bytes:
                free = left.free
        if jax.process_count() > 1:
            free = int(multihost_utils.broadcast_one_to_all(np.int64(free)))
        if free >= 0:
            raise SaveFailed(
                f"checkpoint step {step} was not saved: {_megabytes(free)} free on the disk of "
                f"{self.directory}, the previous save took {_megabytes(self._save_bytes)}; "
                f"{self.resume_point()}; free some space and rerun the same command")

    def _failure(self, step: int, error: BaseException) -> SaveFailed:
        """`SaveFailed` for ``step``'s save, which raised ``error``; its temporary directory is
        removed first (process 0)."""
        if jax.process_index() == 0:
            for tmp in self.directory.glob(f"{step}.orbax-checkpoint-tmp*"):
                shutil.rmtree(tmp, ignore_errors=True)
        free = shutil.disk_usage(self.workdir).free if self.workdir.is_dir() else None
        size = (_megabytes(self._save_bytes) if self._save_bytes else
                f"about {_megabytes(self._state_bytes)} (the train state's arrays)")
        return SaveFailed(
            f"checkpoint step {step} could not be saved: {_why(error)}; a save takes {size}, "
            f"{_megabytes(free)} free on the disk of {self.directory}; {self.resume_point()}; "
            "free some space (or fix the cause) and rerun the same command")

    def _seal(self) -> None:
        """Orbax's post-finalization callback: every file of the step is written, the temporary
        directory not yet renamed. Process 0 writes the manifest into it."""
        if jax.process_index() != 0 or self._sealing is None:
            return
        step = self._sealing
        pending = sorted(self.directory.glob(f"{step}.orbax-checkpoint-tmp*"))
        target = pending[-1] if pending else self.directory / str(step)
        if not target.is_dir():
            raise FileNotFoundError(f"no directory for step {step} under {self.directory} to write "
                                    f"{MANIFEST} into (has Orbax's temporary naming changed?)")
        write_manifest(target, self.workdir)
        self._save_bytes = _tree_bytes(target)

    def newest_intact(self, need=("state", "data")) -> tuple[int | None, dict | None, list]:
        """Verify from the newest step down: (the newest intact step or None, its manifest, the
        `CheckpointDamaged` of each newer step). Process 0 reads the files; the others get its
        answer (and read the chosen step's manifest)."""
        found, manifest, damaged = None, None, []
        if jax.process_index() == 0:
            for step in reversed(self.steps()):
                try:
                    manifest = verify_step(self.directory / str(step), need)
                except CheckpointDamaged as e:
                    damaged.append(e)
                    continue
                found = step
                break
        if jax.process_count() > 1:
            found = int(multihost_utils.broadcast_one_to_all(np.int64(-1 if found is None else found)))
            found = None if found < 0 else found
            if jax.process_index() != 0 and found is not None:
                manifest = read_manifest(self.directory / str(found))
        return found, manifest, damaged

    def set_aside(self, steps: Iterable[int]) -> list[Path]:
        """Rename damaged steps to ``<step>.damaged`` (kept for inspection, never read, not counted
        by ``keep``) so that training can write those steps again; before the first save."""
        moved = []
        for step in steps:
            src, n = self.directory / str(step), 0
            dst = src.with_name(f"{step}.damaged")
            while dst.exists():
                n += 1
                dst = src.with_name(f"{step}.damaged-{n}")
            if jax.process_index() == 0:
                src.rename(dst)
            moved.append(dst)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("jaxformer_set_aside")
        return moved

    def restore(self, abstract_state, data_iter=None, step: int | None = None, *,
                verified: bool = False):
        """Verify ``step`` (default: the latest), check that ``abstract_state`` has its structure,
        and restore onto ``abstract_state``'s shardings (any mesh); returns (state, step).

        With ``data_iter`` the iterator state is required: a step without it is damaged
        (`CheckpointDamaged`), never a silent partial restore. ``verified``: the caller has just
        verified the step (`newest_intact`).
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint under {self.directory}")
        step_dir = self.directory / str(step)
        with_data = data_iter is not None and hasattr(data_iter, "set_state")
        if not verified:
            verify_step(step_dir, ("state", "data") if with_data else ("state",))
        mismatch = structure_mismatch(abstract_state, step_dir)
        if mismatch:
            raise StateMismatch(step_dir, mismatch)
        items = {"state": ocp.args.StandardRestore(abstract_state)}
        if with_data:
            items["data"] = grain.checkpoint.CheckpointRestore(data_iter)
        with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as reader:
            restored = reader.restore(step_dir, args=ocp.args.Composite(**items))
        return restored["state"], step

    def preempted(self, step: int, signalled: bool) -> bool:
        """Whether to checkpoint ``step`` and stop because the job is being preempted: with several
        processes JAX's preemption sync point (every process answers True at the same step, so all
        save it together); with one, ``signalled`` (a SIGTERM seen by
        `jaxformer.checkpoint.preemption.PreemptionWatch`)."""
        if jax.process_count() > 1:
            return self.manager.reached_preemption(step)
        return signalled

    def wait(self) -> None:
        """Wait for the save in the background; `SaveFailed` if it failed."""
        if self._manager is None or not self._pending:
            return
        try:
            self._manager.wait_until_finished()
        except Exception as e:  # e.g. RESOURCE_EXHAUSTED from TensorStore: the disk is full
            raise self._failure(self._sealing, e) from e
        finally:
            self._pending = False

    def close(self) -> None:
        if self._manager is not None:
            try:
                self.wait()
            finally:
                self._manager.close()
