"""One writer per workdir: an exclusive `fcntl.flock` on ``<workdir>/.lock``.

The kernel drops the lock when its holder exits, however it exits (a SIGKILLed run leaves no stale
lock); the file itself stays, holding the last holder's PID for the message. With several processes
only process 0 takes it (Orbax writes collectively, coordinated from process 0) and tells the others
whether it got it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import jax
import numpy as np
from jax.experimental import multihost_utils

LOCK_FILE = ".lock"


class WorkdirBusy(RuntimeError):
    pass


class WorkdirLock:
    def __init__(self, workdir: str | os.PathLike):
        self.path = Path(workdir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> WorkdirLock:
        """Take the lock (creating the workdir) or raise `WorkdirBusy` naming the holder's PID."""
        holder = None
        if jax.process_index() == 0:
            holder = self._try_lock()
        if jax.process_count() > 1:
            holder = int(multihost_utils.broadcast_one_to_all(np.int64(holder or 0))) or None
        if holder is not None:
            self.release()
            pid = f"PID {holder}" if holder > 0 else "a process whose PID it has not written yet"
            raise WorkdirBusy(f"workdir {self.path.parent} is in use by another run ({pid}, lock "
                              f"{self.path}); wait for it to end or stop it, or use another --workdir")
        return self

    def _try_lock(self) -> int | None:
        """None when locked; else the holder's PID (-1 if unknown)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            return int(text) if text.isdigit() else -1
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return None

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.release()
