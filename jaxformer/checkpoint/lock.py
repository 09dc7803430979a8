"""One writer per workdir: an exclusive `fcntl.flock` on ``<workdir>/.lock``.

The kernel drops the lock when its holder exits, however it exits (a SIGKILLed run leaves no stale
lock). A run takes the lock before it reads the workdir, but writes nothing into it until its
checks have passed (`WorkdirLock.claim` writes its PID then), so a refused run leaves the workdir
as it was: `WorkdirLock.release` with ``undo=True`` removes what `WorkdirLock.acquire` created (the
workdir, or only the ``.lock`` file). A second run is told the PID of the live holder, read from
the kernel's lock table (``/proc/locks``, Linux), else the PID the holder wrote into ``.lock``.
With several processes only process 0 takes it (Orbax writes collectively, coordinated from
process 0) and tells the others whether it got it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
from pathlib import Path

import jax
import numpy as np
from jax.experimental import multihost_utils

LOCK_FILE = ".lock"


class WorkdirBusy(RuntimeError):
    pass


def _cannot_create(workdir: Path, error: OSError) -> str:
    """One line for a workdir that cannot be created (or locked): which, why, and the fix."""
    why = os.strerror(error.errno) if error.errno else str(error)
    blocking = next((p for p in [workdir, *workdir.parents] if p.exists() and not p.is_dir()), None)
    fix = (f"{str(blocking)!r} is a file, not a directory" if blocking is not None else
           "choose a --workdir on a disk you can write to" if error.errno in (
               errno.EACCES, errno.EPERM, errno.EROFS) else "fix that or choose another --workdir")
    return f"workdir {str(workdir)!r} cannot be created: {why.lower()}; {fix}"


class WorkdirLock:
    def __init__(self, workdir: str | os.PathLike):
        self.path = Path(workdir) / LOCK_FILE
        self._fd: int | None = None
        self._created: Path | None = None  # what `acquire` created: the workdir or the .lock file

    def acquire(self) -> WorkdirLock:
        """Take the lock (creating the workdir and ``.lock`` if absent; an existing ``.lock`` is
        not written) or raise `WorkdirBusy` naming the holder's PID."""
        holder = None
        if jax.process_index() == 0:
            holder = self._try_lock()
        if jax.process_count() > 1:
            holder = int(multihost_utils.broadcast_one_to_all(np.int64(holder or 0))) or None
        if holder is not None:
            self.release()
            pid = f"PID {holder}" if holder > 0 else "a process whose PID is unknown"
            raise WorkdirBusy(f"workdir {self.path.parent} is in use by another run ({pid}, lock "
                              f"{self.path}); wait for it to end or stop it, or use another --workdir")
        return self

    def _try_lock(self) -> int | None:
        """None when locked; else the holder's PID (-1 if unknown)."""
        workdir, created = self.path.parent, None
        if not workdir.exists():
            created = workdir
        elif not self.path.exists():
            created = self.path
        try:
            workdir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:  # a user's path: say why in words and what to do, not the errno
            raise ValueError(_cannot_create(workdir, e)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder_pid(fd)
            os.close(fd)
            return holder
        self._fd, self._created = fd, created
        return None

    def claim(self) -> None:
        """Write this process's PID into ``.lock``: the run's checks have passed and it starts
        writing the workdir."""
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self, *, undo: bool = False) -> None:
        """Drop the lock; ``undo`` (a run refused, or failed before its first step): also remove
        the workdir or the ``.lock`` file that `acquire` created."""
        if self._fd is None:
            return
        if undo and self._created is not None:
            if self._created == self.path:
                self.path.unlink(missing_ok=True)
            else:
                shutil.rmtree(self._created, ignore_errors=True)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = self._created = None

    def __del__(self) -> None:
        self.release()


def _holder_pid(fd: int) -> int:
    """The PID holding the flock on ``fd``'s file: the kernel's lock table (``/proc/locks`` lines
    ``1: FLOCK ADVISORY WRITE <pid> <major>:<minor>:<inode> 0 EOF``; waiters are marked ``->``),
    else the PID written into the file, else -1."""
    st = os.fstat(fd)
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == key:
                    if int(fields[4]) > 0:  # 0: a holder outside this PID namespace
                        return int(fields[4])
    except (OSError, ValueError):
        pass
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return int(text) if text.isdigit() else -1
