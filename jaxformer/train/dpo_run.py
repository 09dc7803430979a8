"""DPO runs (`jaxformer.objectives.dpo`): the frozen reference beside the policy.

The reference is the policy's ``init_from`` (the SFT model: a jaxformer run or a Hugging Face
directory), read once more at the start and at every resume, never checkpointed. It stays **on the
same mesh**, sharded like the policy by the same logical-axis rules (the step's ``frozen`` tree), and
runs inside the jitted step without gradients: its log-probabilities are not precomputed, so the data
pipeline is the one every objective uses and a resumed or re-shuffled run needs no second pass.
It costs one more copy of the parameters (no optimizer state, no gradients) and one forward pass
per step; docs/training.md has the compiled memory of both forms.

With LoRA (``optimizer.lora.rank`` > 0) the reference is LoRA's frozen base, the adapters switched
off: `jaxformer.train.lora_run` already holds it as the step's frozen tree, so DPO adds only its loss
and no second copy.

The run's evaluation (`DPOEval`, the extension's ``evaluator``) reports the DPO loss and TRL's eval
metrics on held-out pairs; `saved_reference` reads a finished run's reference again for
`jaxformer.evaluate_run`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from jaxformer.checkpoint import open_run
from jaxformer.config import ModelConfig
from jaxformer.convert.hf import load_hf
from jaxformer.convert.hf_io import is_hf_directory
from jaxformer.convert.lora import merged_params
from jaxformer.models.vocab_padding import fit_vocab
from jaxformer.objectives.dpo import DPOOptions, dpo_sums
from jaxformer.train.config import TrainSettings
from jaxformer.train.extension import Extension
from jaxformer.train.setup import Built, ResolvedConfig, load_pretrained
from jaxformer.train.step import StepHooks

DPO_OBJECTIVES = ("dpo", "dpo_seq2seq")


@dataclasses.dataclass(frozen=True)
class DPOLoss:
    """The train step's loss hook (`jaxformer.train.step.StepHooks.loss`): `dpo_sums` of the policy
    (``params``) against the reference (the step's ``frozen`` tree: the reference's parameters, or
    LoRA's base)."""

    options: DPOOptions

    def __call__(self, model, params, frozen, prepared: dict, *, dropout_rng: jax.Array | None,
                 hard_sums: Callable) -> dict:
        del dropout_rng, hard_sums  # dropout off in both passes (TRL's disable_dropout)
        return dpo_sums(model, params, frozen, prepared, self.options)


@dataclasses.dataclass(frozen=True)
class DPOEval:
    """The trainer's evaluation of a DPO run (`jaxformer.train.extension.Extension.evaluator`):
    the DPO loss and TRL's eval metrics of the policy against the reference on held-out pairs, in
    place of the cross-entropy of both responses."""

    options: DPOOptions

    def sums(self, model, params, reference, prepared: dict) -> dict:
        """`dpo_sums` of one preference batch (add over batches)."""
        return dpo_sums(model, params, reference, prepared, self.options)

    @staticmethod
    def summarize(totals: dict) -> dict[str, float]:
        """Totals over batches → ``loss``, ``rewards_accuracies``, ``rewards_chosen``,
        ``rewards_rejected``, ``rewards_margins``, ``logps_chosen``, ``logps_rejected`` (means over
        the pairs, as TRL's eval logs them) and ``pairs``."""
        n = max(float(totals["weight"]), 1.0)
        out = {k: float(v) / n for k, v in totals.items() if k not in ("weight", "correct")}
        return {**out, "pairs": float(totals["weight"])}


def load_reference(resolved: ResolvedConfig, built: Built) -> Any:
    """``init_from``'s parameters (heads it lacks fresh, seeded by ``seed``), placed on the policy's
    parameter shardings."""
    params, _ = load_pretrained(resolved, built)
    return jax.device_put(params, built.param_shardings)


def extension(resolved: ResolvedConfig, built: Built) -> Extension | None:
    """The DPO `Extension` of a run whose objective is ``dpo`` or ``dpo_seq2seq`` (None otherwise):
    its loss hook, and, without LoRA, ``init_from``'s parameters as the frozen reference."""
    settings = resolved.settings
    if settings.objective.name not in DPO_OBJECTIVES:
        return None
    hooks = StepHooks(loss=DPOLoss(settings.objective_options))
    evaluator = DPOEval(settings.objective_options)
    if settings.optimizer.lora.rank:  # LoRA's base is the frozen tree: the reference
        return Extension(hooks=hooks, evaluator=evaluator)
    if resolved.pretrained is None:
        raise ValueError(f"objective.name={settings.objective.name!r} needs init_from=<the SFT run "
                         "or Hugging Face directory>: the frozen reference the policy starts from")
    print(f"DPO reference: {resolved.pretrained.path} (frozen, on the policy's mesh; β="
          f"{settings.objective_options.dpo_beta}, loss {settings.objective_options.dpo_loss})")
    return Extension(hooks=hooks, frozen=load_reference(resolved, built),
                     frozen_shardings=built.param_shardings, evaluator=evaluator)


def evaluate_pairs(model, params: Any, reference: Any, batches, options: DPOOptions, prepare: Callable
                   ) -> dict[str, float]:
    """Held-out DPO metrics of ``params`` against ``reference`` over ``batches`` (a finite pass of
    preference batches, e.g. ``trainer.make_ds("validation", num_epochs=1)``): ``loss``,
    ``rewards_accuracies``, ``rewards_chosen``, ``rewards_rejected``, ``rewards_margins``,
    ``logps_chosen``, ``logps_rejected`` (means over the pairs, as TRL's eval logs them) and
    ``pairs``. ``prepare(batch, rng)`` is the bound objective (``trainer.prepare``)."""
    evaluator = DPOEval(options)
    step = jax.jit(lambda p, r, b: evaluator.sums(model, p, r, prepare(b, None)))
    totals = None
    for batch in batches:
        sums = step(params, reference, batch)
        totals = sums if totals is None else jax.tree.map(lambda a, b: a + b, totals, sums)
    return {} if totals is None else evaluator.summarize(totals)


def saved_reference(settings: TrainSettings, model_cfg: ModelConfig) -> Any:
    """The reference of a finished DPO run (its ``settings``), read again for scoring it
    (`jaxformer.evaluate_run`): ``init_from``'s parameters (a LoRA run's merged into its base), as
    the trainer read them (for a LoRA-DPO run: its base, the adapters off), host arrays."""
    path = settings.init_from
    if is_hf_directory(path):
        return load_hf(path, scan_layers=model_cfg.scan_layers, head=model_cfg.head,
                       num_classes=model_cfg.num_classes, seed=settings.seed,
                       vocab_pad_multiple=model_cfg.vocab_pad_multiple)[1]
    run = open_run(path, step=settings.init_from_step, best=bool(settings.init_from_best))
    return fit_vocab(merged_params(run), ModelConfig.from_dict(run.run_config["model"]), model_cfg)


def evaluate_trainer(trainer, split: str = "validation") -> dict[str, float]:
    """`evaluate_pairs` of a DPO `jaxformer.train.loop.Trainer`'s current policy (LoRA merged)
    against its reference (the step's frozen tree) on ``split``."""
    batches = trainer.make_ds(split, num_epochs=1)
    return evaluate_pairs(trainer.model, trainer.model_params(trainer.state), trainer.extension.frozen,
                          batches, trainer.settings.objective_options, trainer.prepare)
