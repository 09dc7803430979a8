"""Weighted mixtures of sources: ``data.source='mix:shakespeare@0.7,files:more/*.txt@0.3'``.

Each component is a source of its own (any ``data.source`` but another mixture), read, shuffled
and tokenized by the pipeline as a plain source is (`jaxformer.data.pipeline.make_dataset`), then
drawn from in the weights' proportions by Grain's mixing (``grain.IterDataset.mix`` over a mapping
keyed by the component's spec). Grain's mixing is a deterministic interleaving in integer
proportions (the smallest weight scaled to 100, the others truncated: 0.7 / 0.3 → 233 : 100, 69.97%;
over 10,000 examples 6,997 / 3,003, `tests/test_mixture.py`); which examples those are is each
component's own seeded shuffle. A component read to its end starts its next epoch, so a training
stream never ends.

The mixing state (the position ``k`` and every component's own position) is part of the
checkpointed iterator state, so a resumed run reads on bit for bit. A run resumed with changed
weights (as MaxText allows) continues every component where it stopped, drawing in the new
proportions from then on, and says so in one line (`MixedExamples`). A component added on resume
starts at its beginning; one removed is dropped.

A finite pass (evaluation) reads a mixture as its components one after another: every example of
each once, whatever the weights (`jaxformer.data.sources.get_source`).

Rows carry ``inputs_component`` ``[B, L]`` int32: the component index + 1 of every token (0 on
padding), so the trainer counts the tokens seen per component (``tokens/<component>`` in the
metrics, summed over the steps since the previous metrics row), and evaluation scores each
component on its own as well (``eval_loss/<component>``, ``eval_accuracy/<component>``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import grain
import jax
import numpy as np
from jax.experimental import multihost_utils
from tqdm.auto import tqdm

COMPONENT_FEATURE = "inputs_component"


def mixture_components(spec: str) -> list[tuple[str, float]]:
    """``[(component spec, weight)]`` of a ``mix:a@w,b@w`` spec, weights normalised to sum to 1;
    ValueError naming the part that is wrong (no ``@weight``, a weight not > 0, a nested mixture,
    a component named twice)."""
    parts = [p.strip() for p in spec.removeprefix("mix:").split(",") if p.strip()]
    out: list[tuple[str, float]] = []
    for part in parts:
        name, at, weight = part.rpartition("@")
        try:
            w = float(weight) if at else float("nan")
        except ValueError:
            w = float("nan")
        if not name or not w > 0 or not np.isfinite(w):
            raise ValueError(f"data.source={spec!r}: mixture part {part!r} needs a positive weight, "
                             "e.g. 'mix:shakespeare@0.7,kjv_bible@0.3'")
        if name.startswith(("mix:", "concat:")):
            raise ValueError(f"data.source={spec!r}: component {name!r} may not be a mixture or a "
                             "concat; list its parts in this mixture with their weights")
        if name in dict(out):
            raise ValueError(f"data.source={spec!r}: component {name!r} is named twice; give it "
                             "one weight")
        out.append((name, w))
    if not out:
        raise ValueError(f"data.source={spec!r}: 'mix:' needs components 'source@weight', e.g. "
                         "'mix:shakespeare@0.7,kjv_bible@0.3'")
    total = sum(w for _, w in out)
    return [(n, w / total) for n, w in out]


def check_mixture(spec: str) -> None:
    """ValueError for a malformed ``mix:`` spec (`mixture_components`)."""
    mixture_components(spec)


def component_names(spec: str) -> list[str]:
    """The component specs of ``spec`` (a mixture), in order; [] for another source."""
    return [n for n, _ in mixture_components(spec)] if spec.startswith("mix:") else []


class TagComponent(grain.transforms.Map):
    """Adds ``inputs_component``: ``index + 1`` for every token of ``inputs`` (after framing)."""

    def __init__(self, index: int):
        self.index = index

    def map(self, ex: dict) -> dict:
        return {**ex, COMPONENT_FEATURE: np.full(len(ex["inputs"]), self.index + 1, np.int32)}


class MixedExamples(grain.IterDataset):
    """Grain's weighted mixing of ``parents`` (keyed by component spec, in the weights'
    proportions), whose iterator state records the weights: restoring a state saved with other
    weights continues with the new ones and prints one line saying so."""

    def __init__(self, parents: Mapping[str, grain.IterDataset], weights: Mapping[str, float]):
        super().__init__(grain.IterDataset.mix(dict(parents), dict(weights)))
        self.weights = dict(weights)

    def __iter__(self) -> grain.DatasetIterator:
        return _MixedIterator(self._parent.__iter__(), self.weights)


class _MixedIterator(grain.DatasetIterator):
    def __init__(self, parent: grain.DatasetIterator, weights: dict[str, float]):
        super().__init__(parent)
        self.weights = weights

    def __next__(self) -> Any:
        return next(self._parent)

    def get_state(self) -> dict:
        return {"mix": self._parent.get_state(), "weights": self.weights}

    def set_state(self, state: dict) -> None:
        saved = state.get("weights")
        if saved is not None and saved != self.weights:
            tqdm.write(f"data mixture: the checkpoint's weights were {_fmt(saved)}, now "
                       f"{_fmt(self.weights)}; each component continues where it stopped, drawn "
                       "in the new proportions")
        self._parent.set_state(state["mix"])


def _fmt(weights: Mapping[str, float]) -> str:
    return ", ".join(f"{k}@{w:.4g}" for k, w in weights.items())


def tokens_per_component(rows: np.ndarray, names: Sequence[str]) -> dict[str, int]:
    """``{component: tokens}`` of ``inputs_component`` rows ``[B, L]`` (index + 1, 0 = padding)."""
    counts = np.bincount(np.asarray(rows).ravel(), minlength=len(names) + 1)
    return {name: int(counts[i + 1]) for i, name in enumerate(names)}


class ComponentTokens:
    """The trainer's count of the tokens read from each component of ``data.source`` (none for
    a source that is not a mixture): `take` removes ``inputs_component`` from a batch (the step
    does not read it) and counts it; `row` gives ``{"tokens/<component>": n}`` since the last row,
    summed over processes."""

    def __init__(self, spec: str):
        self.names = component_names(spec)
        self.counts = np.zeros(len(self.names) + 1, np.int64)

    def take(self, batch: dict) -> dict:
        rows = batch.pop(COMPONENT_FEATURE, None)
        if rows is not None:
            self.counts += np.bincount(np.asarray(rows).ravel(), minlength=len(self.counts))
        return batch

    def row(self) -> dict[str, int]:
        if not self.names:
            return {}
        counts = self.counts
        if jax.process_count() > 1:  # every process logs the same steps: a collective is safe
            counts = np.asarray(multihost_utils.process_allgather(counts)).sum(axis=0)
        self.counts = np.zeros_like(self.counts)
        return {f"tokens/{n}": int(counts[i + 1]) for i, n in enumerate(self.names)}


def component_sources(data: Any, split: str, objective: str, options: Any = None
                      ) -> list[tuple[str, Sequence[dict]]]:
    """``[(component, its random-access source of split)]`` of a mixture ``data`` (the
    `jaxformer.data.pipeline.DataSettings`) for ``objective``'s data task, to evaluate each on its
    own; [] for a source that is not a mixture."""
    from jaxformer.data.sources import get_source
    from jaxformer.objectives.registry import check_data_task

    task = check_data_task(objective, options).data_task
    return [(n, get_source(dataclasses.replace(data, source=n), split, task=task))
            for n in component_names(data.source)]
