"""Which checkpoints of a run to keep and which to read: the latest, one step, or the best.

One rule ranks steps for both: ``checkpoint.best_metric`` (e.g. ``eval_accuracy``) compared by
``checkpoint.best_mode`` ("min" or "max"); a step saved without that metric ranks last.

- Keeping (`retention_policy`): the ``keep`` latest steps plus the best one. The trainer gives
  every step it saves its evaluation metrics (``{}`` when it did not evaluate at that step), and
  Orbax writes them into the step (``<step>/metrics/metrics``), so the best survives a resume.
  Orbax's ``BestN`` would otherwise never delete a step saved without metrics: with evaluation only
  at the end, a run kept every step it saved.
- Reading (`best_step`): the best of the committed steps by the metrics saved with them, or, for
  steps written before metrics were saved, by the run's ``metrics.jsonl`` row of the same step.

`jaxformer.checkpoint.read.resolve_checkpoint` turns a path plus ``step=`` / ``best=`` into the
step directory every reader opens (generate, predict, evaluate, ``init_from``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from orbax.checkpoint import checkpoint_managers as cm

from jaxformer.checkpoint.run_files import read_metrics
from jaxformer.settings import one_of, positive, read, setting

BEST_MODES = ("min", "max")
METRICS_FILE = ("metrics", "metrics")  # Orbax's metrics item of a step: <step>/metrics/metrics


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
    """``config.checkpoint``: when checkpoints are written and which are kept."""

    every_steps: int = setting(
        500, "save a checkpoint every this many steps (and at the last step)", check=positive)
    keep: int = setting(
        3, "the latest this many checkpoints are kept (plus the best by best_metric)", check=positive)
    best_metric: str = setting(
        "", "also keep the best checkpoint by this logged metric, e.g. 'eval_loss' ('' = none)")
    best_mode: str = setting("min", "'min' or 'max': which value of best_metric is best",
                             check=one_of(*BEST_MODES))
    async_save: bool = setting(True, "write checkpoints in the background while training goes on")


def committed_steps(ckpt_dir: Path) -> list[int]:
    """Steps of a ``checkpoints`` dir, ascending (Orbax renames a step's directory to ``<step>``
    when it is complete; ``<step>.damaged`` and temporary directories are not steps)."""
    if not ckpt_dir.is_dir():
        return []
    return sorted(int(d.name) for d in ckpt_dir.iterdir() if d.name.isdigit() and d.is_dir())


def score(metrics: Mapping | None, best_metric: str, best_mode: str) -> float:
    """``metrics[best_metric]``, or the worst value of ``best_mode`` when it is absent."""
    value = (metrics or {}).get(best_metric)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return math.inf if best_mode == "min" else -math.inf
    return float(value)


def retention_policy(keep: int, best_metric: str | None, best_mode: str
                     ) -> cm.PreservationPolicy:
    """Orbax's preservation policy: the ``keep`` latest steps, plus the best by ``best_metric``.

    ``keep_checkpoints_without_metrics=False``: a step saved without metrics is kept by the
    latest-``keep`` rule only (Orbax's default keeps every such step forever).
    """
    policies = [cm.LatestN(keep)]
    if best_metric:
        policies.append(cm.BestN(get_metric_fn=lambda m: score(m, best_metric, best_mode), n=1,
                                 reverse=best_mode == "min",
                                 keep_checkpoints_without_metrics=False))
    return cm.AnyPreservationPolicy(policies)


def saved_metrics(ckpt_dir: Path, steps: Sequence[int]) -> dict[int, dict]:
    """step → the metrics saved with it (Orbax's metrics item), else the run's ``metrics.jsonl``
    row of that step (the last one written), else ``{}``."""
    rows = {r["step"]: r for r in read_metrics(ckpt_dir.parent) if "step" in r}
    out = {}
    for step in steps:
        path = ckpt_dir.joinpath(str(step), *METRICS_FILE)
        saved = json.loads(path.read_text()) if path.is_file() else None
        out[step] = saved if saved else rows.get(step, {})
    return out


def best_of(metrics: Mapping[int, Mapping], metric: str, mode: str) -> int | None:
    """The step whose ``metrics[step][metric]`` is best by ``mode`` ("min" / "max"), the earliest
    on ties; None when no step has ``metric``."""
    ranked = [s for s in sorted(metrics) if metric in metrics[s]]
    if not ranked:
        return None
    pick = min if mode == "min" else max
    return pick(ranked, key=lambda s: (score(metrics[s], metric, mode), -s if mode == "max" else s))


def best_step(ckpt_dir: Path, steps: Sequence[int],
              checkpoint: CheckpointSettings | Mapping | None) -> int:
    """The best of ``steps`` by the run's ``checkpoint`` section (`CheckpointSettings`, or its dict
    in a run's ``config.json``: ``best_metric``, ``best_mode``); ValueError when the run kept no
    best metric or no step has it."""
    if not isinstance(checkpoint, CheckpointSettings):
        checkpoint = read(CheckpointSettings, checkpoint)
    metric, mode, run = checkpoint.best_metric, checkpoint.best_mode, ckpt_dir.parent
    if not metric:
        raise ValueError(f"{run} kept no best checkpoint (its checkpoint.best_metric is unset); "
                         "choose a step instead (--step N, or init_from_step=N): its steps are "
                         f"{list(steps)}")
    if mode not in BEST_MODES:
        raise ValueError(f"{run}: checkpoint.best_mode={mode!r} must be one of {BEST_MODES}")
    step = best_of(saved_metrics(ckpt_dir, steps), metric, mode)
    if step is None:
        raise ValueError(f"no checkpoint of {run} was evaluated: none of its steps {list(steps)} "
                         f"has {metric} (checkpoint.best_metric); choose a step instead (--step N, or "
                         "init_from_step=N)")
    return step
