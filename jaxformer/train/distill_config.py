"""The ``distill.*`` keys of a training config: declarations, defaults and up-front checks.

Knowledge distillation (Hinton et al. 2015; DistilBERT, Sanh et al. 2019) trains the config's model
(the student) against a trained teacher; the loss and the teacher are `jaxformer.train.distill`'s.
Every key is a placeholder (unset = None), so runs written before distillation existed resume
without a changed-config note; `settings` fills the defaults below.

Defaults are DistilBERT's weights α_ce = 5.0, α_mlm = 2.0, α_cos = 1.0 (its ``train.py``) and
temperature 2.0. Our three terms are each normalised by the same count — the positions the
objective weights (masked tokens for MLM, every target for causal LM, one per row for
classification) — where DistilBERT averages its cosine term over every non-padding token.
"""

from __future__ import annotations

import dataclasses

import ml_collections
from absl import logging

DISTILL_OBJECTIVES = ("mlm", "clm", "classify")
DEFAULTS = dict(temperature=2.0, alpha=5.0, beta=2.0, gamma=1.0, init_student=False)

DISTILL_KEY_DOCS = {
    "teacher": "'' (off) | a jaxformer workdir (or checkpoint step dir) | a Hugging Face model dir: "
               "distil the model into this config's (smaller) model",
    "teacher_step": "the step of a teacher run to read (unset or 0: the latest)",
    "teacher_best": "read the teacher run's best step by its checkpoint.best_metric",
    "temperature": "softmax temperature T of the soft targets (unset = 2.0)",
    "alpha": "weight of T²·KL(teacher ‖ student) on the objective's positions (unset = 5.0, "
             "DistilBERT's α_ce)",
    "beta": "weight of the objective's hard-label cross-entropy (unset = 2.0, DistilBERT's α_mlm)",
    "gamma": "weight of 1 − cos(student, teacher last hidden states) (unset = 1.0, α_cos)",
    "init_student": "initialise the student from the teacher's layers 0, 2, 4, … plus its "
                    "embeddings and heads (DistilBERT §3; unset = False)",
}


def default_distill_config() -> ml_collections.ConfigDict:
    """``config.distill``: every key declared and unset (see `DISTILL_KEY_DOCS`)."""
    placeholder = ml_collections.config_dict.placeholder
    return ml_collections.ConfigDict(dict(
        teacher=placeholder(str), teacher_step=placeholder(int), teacher_best=placeholder(bool),
        temperature=placeholder(float), alpha=placeholder(float), beta=placeholder(float),
        gamma=placeholder(float), init_student=placeholder(bool)))


@dataclasses.dataclass(frozen=True)
class DistillSettings:
    """``config.distill`` with its defaults filled (`DEFAULTS`)."""

    teacher: str
    teacher_step: int | None
    teacher_best: bool
    temperature: float
    alpha: float
    beta: float
    gamma: float
    init_student: bool


def settings(config: ml_collections.ConfigDict) -> DistillSettings | None:
    """The run's distillation settings, or None when ``distill.teacher`` is unset."""
    section = config.get("distill") or {}
    if not section.get("teacher"):
        return None
    values = {k: section.get(k) if section.get(k) is not None else v for k, v in DEFAULTS.items()}
    return DistillSettings(teacher=section["teacher"], teacher_step=section.get("teacher_step") or None,
                           teacher_best=bool(section.get("teacher_best")),
                           **{k: (float(v) if k != "init_student" else bool(v))
                              for k, v in values.items()})


def check_distill(config: ml_collections.ConfigDict) -> None:
    """ValueError naming the field for a distillation the trainer cannot run (before anything is
    read or compiled): an objective other than `DISTILL_OBJECTIVES`,
    a negative weight or temperature, or a combination the step does not support."""
    section = config.get("distill") or {}
    stated = [k for k in DISTILL_KEY_DOCS if k != "teacher" and section.get(k) is not None]
    s = settings(config)
    if s is None:  # e.g. a distillation config run without its teacher, as a baseline
        if stated:
            logging.warning("distill.teacher is unset: no distillation (distill.%s ignored)",
                            ", distill.".join(stated))
        return
    objective = config.objective.name
    if objective not in DISTILL_OBJECTIVES:
        raise ValueError(f"distill.teacher is set but objective.name={objective!r}: distillation "
                         f"supports {DISTILL_OBJECTIVES}")
    if s.temperature <= 0:
        raise ValueError(f"distill.temperature={s.temperature} must be positive")
    weights = {"alpha": s.alpha, "beta": s.beta, "gamma": s.gamma}
    for name, value in weights.items():
        if value < 0:
            raise ValueError(f"distill.{name}={value} must be >= 0")
    if not any(weights.values()):
        raise ValueError("distill.alpha, distill.beta and distill.gamma are all 0: nothing to train")
    if s.teacher_step and s.teacher_best:
        raise ValueError(f"distill.teacher_step={s.teacher_step} and distill.teacher_best=True: "
                         "choose one")
    if config.parallel != "jit":
        raise ValueError(f"distill.teacher needs parallel='jit' (got {config.parallel!r}): the "
                         "teacher is sharded on the student's mesh")
    if config.optimizer.get("lora", {}).get("rank"):
        raise ValueError("distill.teacher with optimizer.lora.rank > 0 is not supported: train the "
                         "student's full parameters (optimizer.lora.rank=0)")
    if s.init_student and config.init_from:
        raise ValueError(f"distill.init_student=True and init_from={config.init_from!r} both "
                         "initialise the student: choose one")
