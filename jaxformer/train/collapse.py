"""A classifier that predicts one class for everything: warned about, not left to the metrics.

A fine-tuning run whose learning rate is too high (or too low, or whose labels carry no signal)
can settle on the majority class: validation accuracy then sits at that class's share of the split
and looks like learning. Or it stays at chance while spreading its predictions over several classes.
`with_prediction_counts` adds to the eval step's sums the number of examples predicted as each class
and the number labelled with each (``predicted [C]``, ``labelled [C]``, summed over batches with the
other sums); `CollapseWatch` warns once, when two evaluations in a row

* predicted a single class for every example, or
* scored an accuracy at or below the majority-class rate (the largest class's share of the
  evaluated examples: what always answering that class scores),

naming the likely causes: the learning rate, too few steps, or the labels.
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
    step returning its sums plus ``predicted`` and ``labelled`` `[C]` float32: the weight of the
    examples whose argmax, and whose label, is each class."""

    def count(classes: jax.Array, weights: jax.Array) -> jax.Array:
        return jnp.zeros((num_classes,), jnp.float32).at[classes.reshape(-1)].add(
            weights.reshape(-1).astype(jnp.float32))

    def step(params: Any, batch: dict, key: jax.Array) -> dict:
        sums, rows = eval_step(params, batch, key)
        return {**sums, "predicted": count(rows["predictions"], rows["weights"]),
                "labelled": count(rows["targets"], rows["weights"])}

    return step


CAUSES = ("try another optimizer.peak_lr (usually lower) or more optimizer.warmup_steps, train "
          "longer (num_train_steps), and check that the labels are read from the right column "
          "(data.columns, data.label_key)")


class CollapseWatch:
    """Warns (once) when ``patience`` evaluations in a row predicted one class for every example,
    or scored at or below the majority-class rate (module docstring)."""

    def __init__(self, class_names: Sequence[str] | None = None, patience: int = 2) -> None:
        self.names, self.patience = class_names, patience
        # (step, the only class predicted or None, accuracy, majority-class rate or None)
        self.history: list[tuple[int, int | None, float | None, float | None]] = []
        self.warned = False

    def _name(self, label: int) -> str:
        return (f"{label} ({self.names[label]!r})" if self.names and label < len(self.names)
                else str(label))

    def push(self, step: int, predicted: Any, labelled: Any = None,
             accuracy: float | None = None) -> str | None:
        """Record one evaluation: its ``predicted`` and ``labelled`` counts `[C]` and its
        ``accuracy``; returns the warning when it is given (also logged), else None."""
        counts = np.asarray(jax.device_get(predicted), np.float64)
        used = np.flatnonzero(counts > 0)
        majority = None
        if labelled is not None:
            labels = np.asarray(jax.device_get(labelled), np.float64)
            majority = (int(labels.argmax()), labels.max() / labels.sum()) if labels.sum() else None
        self.history.append((step, int(used[0]) if len(used) == 1 else None, accuracy, majority))
        recent = self.history[-self.patience:]
        if self.warned or len(recent) < self.patience:
            return None
        steps = ", ".join(str(s) for s, *_ in recent)
        label = recent[0][1]
        if label is not None and all(c == label for _, c, *_ in recent):
            message = (f"predictions are all class {self._name(label)}: every one of the "
                       f"{int(counts.sum())} examples of the last {self.patience} evaluations "
                       f"(steps {steps}), so eval_accuracy is that class's share of the split. "
                       f"The classifier has collapsed to one class: {CAUSES}")
        elif all(a is not None and m is not None and a <= m[1] + 1e-9 for _, _, a, m in recent):
            top, rate = recent[-1][3]
            scores = ", ".join(f"{a:.4f}" for _, _, a, _ in recent)
            message = (f"eval_accuracy {scores} at steps {steps} is at or below the majority-class "
                       f"rate {rate:.4f} (class {self._name(top)} is {100 * rate:.1f}% of the "
                       "evaluated examples): always answering that class would score as well. "
                       f"The classifier has learned nothing from the text yet: {CAUSES}")
        else:
            return None
        self.warned = True
        logging.warning(message)
        return message
