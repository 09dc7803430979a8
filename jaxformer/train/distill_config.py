"""The ``distill.*`` keys of a training config: declarations, defaults and up-front checks.

Knowledge distillation (Hinton et al. 2015; DistilBERT, Sanh et al. 2019) trains the config's model
(the student) against a trained teacher; the loss and the teacher are `jaxformer.train.distill`'s.
Every key is a placeholder (unset = None), so runs written before distillation existed resume
without a changed-config note; `settings` fills what an unset key means (`DistillSettings`).

Defaults are DistilBERT's weights α_ce = 5.0, α_mlm = 2.0, α_cos = 1.0 (its ``train.py``) and
temperature 2.0. Our three terms are each normalised by the same count — the positions the
objective weights (masked tokens for MLM, every target for causal LM, one per row for
classification) — where DistilBERT averages its cosine term over every non-padding token.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import ml_collections
from absl import logging

from jaxformer.settings import at_least, config_dict, positive, read, section, setting

DISTILL_OBJECTIVES = ("mlm", "clm", "classify")


@dataclasses.dataclass(frozen=True)
class DistillSettings:
    """``config.distill``: every key a placeholder (unset = None) in the config; `settings` reads
    it with each unset key's ``unset`` value filled (DistilBERT's)."""

    teacher: str | None = setting(
        None, "'' (off) | a jaxformer workdir (or checkpoint step dir) | a Hugging Face model dir: "
        "distil the model into this config's (smaller) model", unset="")
    teacher_step: int | None = setting(
        None, "the step of a teacher run to read (unset or 0: the latest)", check=at_least(0))
    teacher_best: bool | None = setting(
        None, "read the teacher run's best step by its checkpoint.best_metric", unset=False)
    temperature: float | None = setting(
        None, "softmax temperature T of the soft targets (unset = 2.0)", unset=2.0, check=positive)
    alpha: float | None = setting(
        None, "weight of T²·KL(teacher ‖ student) on the objective's positions (unset = 5.0, "
        "DistilBERT's α_ce)", unset=5.0, check=at_least(0))
    beta: float | None = setting(
        None, "weight of the objective's hard-label cross-entropy (unset = 2.0, DistilBERT's α_mlm)",
        unset=2.0, check=at_least(0))
    gamma: float | None = setting(
        None, "weight of 1 − cos(student, teacher last hidden states) (unset = 1.0, α_cos)",
        unset=1.0, check=at_least(0))
    init_student: bool | None = setting(
        None, "initialise the student from the teacher's layers 0, 2, 4, … plus its embeddings and "
        "heads (DistilBERT §3; unset = False)", unset=False)


def default_distill_config() -> ml_collections.ConfigDict:
    """``config.distill``: every key declared and unset (`DistillSettings`)."""
    return config_dict(section(DistillSettings))


def settings(config: ml_collections.ConfigDict) -> DistillSettings | None:
    """The run's distillation settings (unset keys filled), or None when ``distill.teacher`` is
    unset."""
    s = read(DistillSettings, config.get("distill"))
    return dataclasses.replace(s, teacher_step=s.teacher_step or None) if s.teacher else None


def check_distill(settings: Any, stated: Mapping | None) -> None:
    """ValueError naming the field for a distillation the trainer cannot run (before anything is
    read or compiled): an objective other than `DISTILL_OBJECTIVES`, all weights zero, or a
    combination the step does not support. ``settings`` is the run's typed config (a
    `jaxformer.train.config.TrainSettings`: ``distill``, ``objective``, ``parallel``, ``optimizer``,
    ``init_from``; each key alone was checked by `DistillSettings`' checks), ``stated`` the config's
    ``distill`` section as given (its keys set without a teacher are named in a warning)."""
    s = settings.distill
    if not s.teacher:  # e.g. a distillation config run without its teacher, as a baseline
        named = [f.name for f in dataclasses.fields(DistillSettings)
                 if f.name != "teacher" and (stated or {}).get(f.name) is not None]
        if named:
            logging.warning("distill.teacher is unset: no distillation (distill.%s ignored)",
                            ", distill.".join(named))
        return
    objective = settings.objective.name
    if objective not in DISTILL_OBJECTIVES:
        raise ValueError(f"distill.teacher is set but objective.name={objective!r}: distillation "
                         f"supports {DISTILL_OBJECTIVES}")
    if not any((s.alpha, s.beta, s.gamma)):  # each >= 0 and temperature > 0: their settings
        raise ValueError("distill.alpha, distill.beta and distill.gamma are all 0: nothing to train")
    if s.teacher_step and s.teacher_best:
        raise ValueError(f"distill.teacher_step={s.teacher_step} and distill.teacher_best=True: "
                         "choose one")
    if settings.parallel != "jit":
        raise ValueError(f"distill.teacher needs parallel='jit' (got {settings.parallel!r}): the "
                         "teacher is sharded on the student's mesh")
    if settings.optimizer.lora.rank:
        raise ValueError("distill.teacher with optimizer.lora.rank > 0 is not supported: train the "
                         "student's full parameters (optimizer.lora.rank=0)")
    if s.init_student and settings.init_from:
        raise ValueError(f"distill.init_student=True and init_from={settings.init_from!r} both "
                         "initialise the student: choose one")
