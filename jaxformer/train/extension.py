"""A training feature as one object: what it changes in the step and what it keeps beside the state.

The trainer (`jaxformer.train.loop.Trainer`) knows features only through `Extension`: it builds the
step with ``ext.hooks``, passes ``ext.frozen`` to every step (compiled in
``ext.frozen_shardings``), starts a fresh run with ``ext.init_state`` when the feature has one, and
evaluates the parameters ``ext.hooks.model_params(state.params, ext.frozen)``. A feature is a
function of ``(resolved, built)`` (`jaxformer.train.setup`) returning an `Extension`, or None
when the config does not ask for it: `jaxformer.train.lora_run.extension` (LoRA: a parameter
transform), `jaxformer.train.distill.extension` (a teacher and a loss), `scheduled_sampling` (an
input hook); `combine` joins those a run asks for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from jaxformer.objectives.scheduled_sampling import scheduled_sampling_mixer
from jaxformer.train.step import StepHooks


@dataclasses.dataclass(frozen=True)
class Extension:
    """What one feature adds to a run (the defaults add nothing: the plain step).

    Attributes:
      hooks: the step's hooks (`jaxformer.train.step.StepHooks`).
      trained: (abstract parameters, their logical axes) the train state holds in place of the
        model's (LoRA: adapters and task heads), or None (`jaxformer.train.setup.with_trained`).
      frozen: parameters the step reads but never trains (LoRA's base, a teacher's), or None;
        never checkpointed (the feature reloads them on resume).
      frozen_shardings: their `NamedSharding`s on the run's mesh (None: where they are).
      init_state: ``(resolved, built) -> TrainState`` for a fresh run, in place of
        `jaxformer.train.setup.init_state`; None: that one.
      evaluator: what `jaxformer.train.loop.Trainer.evaluate` reports in place of the objective's
        cross-entropy: ``evaluator.sums(model, params, frozen, prepared) -> sums`` of one batch
        (added over batches) and ``evaluator.summarize(totals) -> metrics`` (DPO's preference
        metrics, `jaxformer.train.dpo_run.DPOEval`); None: the cross-entropy.
    """

    hooks: StepHooks = StepHooks()
    trained: Any = None
    frozen: Any = None
    frozen_shardings: Any = None
    init_state: Callable | None = None
    evaluator: Any = None


def combine(*extensions: Extension | None) -> Extension:
    """One `Extension` of the given ones (None: not asked for); ValueError when two set the same
    part (e.g. both a frozen tree), which the config checks refuse first with the keys' names."""
    out, hooks = Extension(), StepHooks()
    for ext in (e for e in extensions if e is not None):
        out = _set_parts(out, ext, "run's", skip=("hooks",))
        hooks = _set_parts(hooks, ext.hooks, "step's")
    return dataclasses.replace(out, hooks=hooks)


def _set_parts(into, part, whose: str, skip=()):
    """``into`` with every field ``part`` sets (differs from its class's default) copied over;
    ValueError when ``into`` already set it."""
    default = type(into)()
    for f in dataclasses.fields(into):
        if f.name in skip or getattr(part, f.name) is getattr(default, f.name):
            continue
        if getattr(into, f.name) is not getattr(default, f.name):
            raise ValueError(f"two features set the {whose} {f.name}; train with one of them")
        into = dataclasses.replace(into, **{f.name: getattr(part, f.name)})
    return into


def scheduled_sampling(resolved: Any, built: Any) -> Extension | None:
    """Scheduled sampling (`jaxformer.objectives.scheduled_sampling`; here because objectives do
    not import the trainer): its mixer as the step's ``mix_inputs`` hook, or None when the
    objective's ``scheduled_sampling`` is "none"."""
    settings = resolved.settings
    mix = scheduled_sampling_mixer(settings.objective.name, settings.objective_options, built.model)
    return None if mix is None else Extension(hooks=StepHooks(mix_inputs=mix))
