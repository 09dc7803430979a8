"""A classifier that predicts one class for everything: warned about, not left to the metrics.

A fine-tuning run whose learning rate is too high (or too low, or whose labels carry no signal)
can settle on the majority class: validation accuracy then sits at that class's share of the split
and looks like learning. `with_prediction_counts` adds to the eval step's sums the number of
examples predicted as each class (``predicted [C]``, summed over batches with the other sums);
`CollapseWatch` warns once when two evaluations in a row predicted a single class for every
example.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging


def with_prediction_counts(eval_step: Callable, num_classes: int) -> Callable:
    """``eval_step`` of `jaxformer.train.step.make_eval_step` (``predictions=True``) → an eval
    step returning its sums plus ``predicted`` `[C]` float32: the weight of the examples whose
    argmax is each class."""

    def step(params: Any, batch: dict, key: jax.Array) -> dict:
        sums, rows = eval_step(params, batch, key)
        counts = jnp.zeros((num_classes,), jnp.float32).at[rows["predictions"].reshape(-1)].add(
            rows["weights"].reshape(-1).astype(jnp.float32))
        return {**sums, "predicted": counts}

    return step


class CollapseWatch:
    """Warns (once) when ``patience`` evaluations in a row predicted one class for every example."""

    def __init__(self, class_names: Sequence[str] | None = None, patience: int = 2) -> None:
        self.names, self.patience = class_names, patience
        self.history: list[tuple[int, int | None]] = []  # (step, the only class predicted or None)
        self.warned = False

    def push(self, step: int, predicted: Any) -> str | None:
        """Record one evaluation's ``predicted`` counts `[C]`; returns the warning when it is
        given (also logged), else None."""
        counts = np.asarray(jax.device_get(predicted), np.float64)
        used = np.flatnonzero(counts > 0)
        self.history.append((step, int(used[0]) if len(used) == 1 else None))
        recent = self.history[-self.patience:]
        if (self.warned or len(recent) < self.patience or recent[0][1] is None
                or any(c != recent[0][1] for _, c in recent)):
            return None
        self.warned = True
        label = recent[0][1]
        name = (f"{label} ({self.names[label]!r})" if self.names and label < len(self.names)
                else str(label))
        message = (f"predictions are all class {name}: every one of the {int(counts.sum())} "
                   f"examples of the last {self.patience} evaluations (steps "
                   f"{', '.join(str(s) for s, _ in recent)}), so eval_accuracy is that class's "
                   "share of the split. The classifier has collapsed to one class: try another "
                   "optimizer.peak_lr (usually lower) or more optimizer.warmup_steps, and check "
                   "that the labels are read from the right column")
        logging.warning(message)
        return message
