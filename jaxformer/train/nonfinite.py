"""The ``nonfinite`` policy, host side: what a non-finite loss or gradient norm does to the run.

``nonfinite="stop"`` ends training at the first such step; ``"skip"`` has the jitted step leave
the update out (`make_train_step` of a run with ``nonfinite="skip"`` keeps params and optimizer state with
`jnp.where`), counts it, and stops after ``nonfinite_limit`` in a row. Either way the error
names the step and the last good checkpoint (or that none was saved yet); checkpoints never hold
non-finite parameters (`Checkpointer.save` refuses them).

Each step is checked one step late, when the next has been dispatched (its scalars are ready by
then, so the host does not stall the device), and right away before a checkpoint is written.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np
from absl import logging

POLICIES = ("stop", "skip")


class NonFiniteError(FloatingPointError):
    pass


class NonfiniteGuard:
    def __init__(self, policy: str, limit: int, resume_point: Callable[[], str]):
        """``resume_point``: where a rerun would start, as a phrase (`Checkpointer.resume_point`)."""
        self.policy, self.limit, self.resume_point = policy, limit, resume_point
        self.skipped, self.in_a_row, self._pending = 0, 0, None

    def push(self, step: int, metrics: dict) -> None:
        """Record ``step``'s metrics and check the previous step's."""
        pending, self._pending = self._pending, (step, metrics["loss"], metrics["grad_norm"])
        if pending is not None:
            self._check(*pending)

    def flush(self) -> None:
        """Check the step pushed last (before checkpointing it, and at the end)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self._check(*pending)

    def _check(self, step: int, loss, grad_norm) -> None:
        loss, grad_norm = (float(v) for v in jax.device_get((loss, grad_norm)))
        if np.isfinite(loss) and np.isfinite(grad_norm):
            self.in_a_row = 0
            return
        what = f"loss={loss}, grad_norm={grad_norm}"
        fix = ("lower optimizer.peak_lr or set optimizer.clip_norm" +
               (", or nonfinite='skip' to leave such updates out" if self.policy == "stop" else ""))
        if self.policy == "skip":
            self.skipped += 1
            self.in_a_row += 1
            if self.in_a_row < self.limit:
                logging.warning("step %d: non-finite %s, update skipped (%d in a row, %d in all)",
                                step, what, self.in_a_row, self.skipped)
                return
            what += f": {self.in_a_row} non-finite steps in a row (nonfinite_limit={self.limit})"
        raise NonFiniteError(
            f"training stopped at step {step}: non-finite {what}; {self.resume_point()}; {fix}")
