"""Preemption: SIGTERM, which TPU/GPU schedulers send before they take a job's machines away."""

from __future__ import annotations

import signal
import threading

import jax


class PreemptionWatch:
    """Records SIGTERM (what TPU/GPU schedulers send before preempting a job) while training, so
    the loop can checkpoint the current step and stop instead of losing the steps since the last
    periodic checkpoint. Installed only in the main thread of a single-process run (with several
    processes JAX's coordination service watches for the signal: `Checkpointer.preempted`);
    `restore` puts the previous handler back."""

    def __init__(self) -> None:
        self.signalled, self._installed, self._previous = False, False, None
        if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._installed = True

    def _handle(self, signum, frame) -> None:
        self.signalled = True

    def restore(self) -> None:
        if self._installed:  # None: the previous handler was not set from Python → the default
            signal.signal(signal.SIGTERM, signal.SIG_DFL if self._previous is None else self._previous)
            self._installed = False
