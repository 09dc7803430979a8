"""The training config's schema: every section and key, declared once with type, default, doc, check.

The sections are declared where the code that reads them lives, and assembled here (`schema`):

- top level: `RunSettings` (here), read by the trainer;
- ``model``: `jaxformer.config.ModelConfig`, every field unset (a pretrained model's value, else
  ModelConfig's default) and checked by `ModelConfig.from_dict`;
- ``objective``: `ObjectiveSettings` (here) and each objective's options, declared beside it and
  gathered by `jaxformer.objectives.option_settings`;
- ``data``: `jaxformer.data.pipeline.DataSettings`, which holds the sources' keys
  (`jaxformer.data.sources.SourceSettings`) and ``data.tokenizer``
  (`jaxformer.data.tokenizer.TokenizerSettings`);
- ``optimizer``: `jaxformer.train.optim.OptimizerSettings`, with ``optimizer.lora``
  (`jaxformer.models.lora.LoraSettings`);
- ``checkpoint``: `jaxformer.checkpoint.select.CheckpointSettings`, read by the checkpoint writer
  and the readers of a run's best step;
- ``eval``: `jaxformer.evaluation.decoding.EvalSettings`, read by the training loop's evaluation;
- ``mesh``: `jaxformer.parallel.mesh.MeshSettings`;
- ``distill``: `jaxformer.train.distill_config.DistillSettings`.

From this one tree come `base_config` (the ConfigDict every ``configs/<name>.py`` starts from, so
``--config.<key>=…`` can set any key), `check_schema` (an unknown key, a wrong type or a value its
check refuses: ``ValueError`` naming the key, before compilation), `key_docs` (``--print_config``)
and the keys a resumed run may not change (kind ``VOCABULARY``, `jaxformer.train.config.resume`).
A new training option is one `jaxformer.settings.setting` line in its section.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections
from absl import logging

from jaxformer.checkpoint.select import CheckpointSettings
from jaxformer.config import ModelConfig
from jaxformer.data.pipeline import DataSettings
from jaxformer.evaluation.decoding import EvalSettings
from jaxformer.objectives import OBJECTIVES, Objective, get_objective, option_settings
from jaxformer.ops.dropout import PRNG_IMPLS
from jaxformer.parallel.mesh import MeshSettings
from jaxformer.settings import (
    Setting,
    at_least,
    check_tree,
    config_dict,
    docs,
    merge,
    one_of,
    positive,
    read,
    section,
    setting,
)
from jaxformer.train.distill_config import DistillSettings
from jaxformer.train.nonfinite import POLICIES
from jaxformer.train.optim import OptimizerSettings
from jaxformer.train.throughput import check_profile_steps

PARALLEL_MODES = ("jit", "shard_map", "pmap")  # see jaxformer.parallel: which to use and why
# Keys a config (or an old run's config.json) may still hold that the schema no longer declares,
# with what became of each: the schema check skips them, and a config that sets one logs this note
# (`note_legacy_keys`).
LEGACY_KEYS = {"data.task": "derived from objective.name (a config that sets it must agree: "
                            "validation._check_data)",
               "module_api": "ignored: there is one model implementation (the former 'linen' and "
                             "'nnx' ran the same program)"}


# Names a user of Hugging Face's Trainer (TrainingArguments, run_glue.py, run_translation.py) may
# type, and the key that means the same here: offered (before a close spelling) for an unknown key.
HF_NAMES = {"learning_rate": "optimizer.peak_lr", "lr": "optimizer.peak_lr",
            "max_steps": "num_train_steps", "num_labels": "model.num_classes",
            "max_seq_length": "data.seq_len", "max_source_length": "data.seq_len",
            "max_target_length": "data.target_len", "per_device_train_batch_size": "data.batch_size",
            "batch_size": "data.batch_size", "warmup": "optimizer.warmup_steps",
            "warmup_steps": "optimizer.warmup_steps", "weight_decay": "optimizer.weight_decay",
            "max_grad_norm": "optimizer.clip_norm", "label_smoothing_factor":
            "objective.label_smoothing", "eval_steps": "eval.every_steps",
            "save_steps": "checkpoint.every_steps", "save_total_limit": "checkpoint.keep",
            "logging_steps": "log_every_steps", "metric_for_best_model": "checkpoint.best_metric",
            "gradient_accumulation_steps": "optimizer.grad_accum_steps",
            "model_name_or_path": "init_from", "num_beams": "eval.generate_beam_size",
            "validation_split_percentage": "data.validation_from_train"}


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """The top-level keys of the training config (the sections are `schema`'s)."""

    name: str = setting("run", "the run's name (shown in logs)")
    seed: int = setting(0, "parameters, dropout, masking and data order all derive from it")
    dropout_prng: str = setting(
        "threefry2x32", "jax.random implementation of the dropout masks: 'threefry2x32' (the same "
        "masks on every backend and mesh), 'rbg' or 'unsafe_rbg' (XLA's RngBitGenerator: fewer "
        "bytes and FLOPs, masks that may differ across backends and shardings); resume stays "
        "bitwise either way", check=one_of(*PRNG_IMPLS))
    num_train_steps: int = setting(
        1000, "optimizer updates to run (a resumed run continues up to this number)", check=positive)
    init_from: str = setting(
        "", "'' | a pretraining workdir | a checkpoint step dir | a Hugging Face model dir")
    # unset, not 0 / False: runs written before these keys existed resume without a note
    init_from_step: int | None = setting(
        None, "the step of an init_from run to read (unset or 0: the latest)", check=at_least(0))
    init_from_best: bool | None = setting(None, "read init_from's best step by its checkpoint.best_metric")
    parallel: str = setting(
        "jit", "'jit' (sharded over the mesh), 'shard_map' or 'pmap' (data parallel, replicated "
        "state)", check=one_of(*PARALLEL_MODES))
    log_every_steps: int = setting(50, "metrics.jsonl / TensorBoard cadence", check=positive)
    nonfinite: str = setting(
        "stop", "'stop' at the first non-finite loss or grad norm, or 'skip' the update",
        check=one_of(*POLICIES))
    nonfinite_limit: int = setting(
        10, "with nonfinite='skip': stop after this many non-finite steps in a row", check=at_least(1))
    progress_bar: bool | None = setting(
        None, "tqdm progress bar: unset = only when stderr is a terminal (none in a redirected log), "
        "true = always, false = never")
    profile_steps: str = setting(
        "", "'N,M': a jax.profiler trace of steps N to M in <workdir>/profile (TensorBoard, XProf, "
        "Perfetto); '' = none", check=check_profile_steps)


@dataclasses.dataclass(frozen=True)
class ObjectiveSettings:
    """The ``objective`` keys every objective reads; each objective's own options are declared
    beside it and gathered by `jaxformer.objectives.option_settings`."""

    name: str = setting(
        "clm", f"one of {', '.join(sorted(OBJECTIVES))}; decides the data task and the usual framing")
    label_smoothing: float = setting(
        0.0, "label smoothing of the training cross-entropy (not of evaluation)",
        check=lambda v: None if 0.0 <= v < 1.0 else "must lie in [0, 1)")
    z_loss: float = setting(0.0, "weight of the z-loss log(Z)^2 on the output logits (PaLM)",
                            check=at_least(0))
    vocab_block_size: int = setting(
        8192, "LM/MLM loss over blocks of this many vocabulary columns, never forming the [B, L, V] "
        "float32 logits (ops.losses.blockwise_cross_entropy; same loss and gradients); 0 = from the "
        "full logits", check=at_least(0))
    decoder_start_id: int = setting(
        0, "encoder_decoder: the first decoder input id (T5: pad = 0; a Hugging Face init_from's "
        "decoder_start_token_id, e.g. BART's 2, replaces the default 0)", check=at_least(0))


def model_settings() -> dict[str, Setting]:
    """``model``: every `ModelConfig` field, unset (None): a field left unset takes the pretrained
    model's value when ``init_from`` is given (a run's ``config.json`` or a Hugging Face
    ``config.json``), else `ModelConfig`'s default; so the same config fine-tunes the same from a run
    and from its Hugging Face export. `ModelConfig.validate` checks the values."""
    return {k: dataclasses.replace(s, type=s.type | None, default=None)
            for k, s in section(ModelConfig).items()}


# The config's sections after ``model``: key -> section class (`schema`, `train_settings`).
SECTIONS = {"objective": ObjectiveSettings, "data": DataSettings, "optimizer": OptimizerSettings,
            "checkpoint": CheckpointSettings, "eval": EvalSettings, "mesh": MeshSettings,
            "distill": DistillSettings}


def schema() -> dict[str, Any]:
    """The tree of every training-config key (`jaxformer.settings`): the run keys and sections
    (``objective`` also declares every objective's options)."""
    return {**section(RunSettings), "model": model_settings(),
            **{key: section(cls) for key, cls in SECTIONS.items()},
            "objective": merge(section(ObjectiveSettings), option_settings(), where="objective.")}


def model_defaults() -> ml_collections.ConfigDict:
    """``config.model`` declaring every `ModelConfig` field as a typed placeholder (None = not set),
    so that ``--config.model.<field>=…`` can set any of them. Configs fill it with
    ``c.model.update(preset(...))``, which keeps the declarations and their types."""
    return config_dict(model_settings())


def base_config() -> ml_collections.ConfigDict:
    """All keys with defaults (``model``: declared, unset); configs override them."""
    return config_dict(schema())


def key_docs() -> dict[str, str]:
    """``{dotted key: one-line description}`` for every key a training config may have."""
    return docs(schema())


def check_schema(config: Any) -> None:
    """ValueError naming the first key of ``config`` (a ConfigDict or its dict) that the schema does
    not declare (with the key meant: `HF_NAMES`, else a close spelling), whose value has the wrong
    type, or that its setting's check refuses. `LEGACY_KEYS` are left to their own checks."""
    meant = {k: f"; did you mean {v!r}? (what Hugging Face calls {k!r})" for k, v in HF_NAMES.items()}
    check_tree(schema(), config, skip=lambda dotted: dotted in LEGACY_KEYS, meant=meant)


# --------------------------------------------------------------------------------------------------
# The typed config at run time: built once, after the checks; every function below takes its section.


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainSettings(RunSettings):
    """A training config as typed, frozen sections, built once (`train_settings`, `run_settings`):
    the run keys as attributes (``settings.seed``, ``settings.parallel`` …) and one section object
    per config section; the trainer hands each function the section it reads.

    Attributes:
      model: the resolved, validated `ModelConfig`.
      objective: `ObjectiveSettings` (the keys every objective reads).
      objective_options: the options dataclass of the named objective (``MLMOptions`` …, declared
        beside it: `jaxformer.objectives.Objective.options`), or None when it has none.
      objective_spec: the named `jaxformer.objectives.Objective` resolved once with those options
        (`Objective.resolve`: its data task chosen, the options carried), what the data checks, the
        pipeline and the train step's ``prepare`` take.
      data: `DataSettings`, with ``data.tokenizer`` (`TokenizerSettings`).
      optimizer: `OptimizerSettings`, with ``optimizer.lora`` (`LoraSettings`).
      checkpoint, eval, mesh, distill: `CheckpointSettings`, `EvalSettings`, `MeshSettings`,
        `DistillSettings` (unset keys as their ``unset`` values).
    """

    model: ModelConfig
    objective: ObjectiveSettings
    objective_options: Any
    objective_spec: Objective
    data: DataSettings
    optimizer: OptimizerSettings
    checkpoint: CheckpointSettings
    eval: EvalSettings
    mesh: MeshSettings
    distill: DistillSettings


def _node(values: Any, key: str) -> Any:
    """``values[key]`` of a ConfigDict or dict, None when absent (a run saved before it existed)."""
    return values[key] if key in values else None


def train_settings(config: Any, model: ModelConfig) -> TrainSettings:
    """The `TrainSettings` of ``config`` (a training ConfigDict, checked by `check_schema`, or a
    run's ``config.json`` as a dict) for the validated ``model``: declared keys only (a legacy key
    logs its note, `note_legacy_keys`), unset keys as their defaults, lists as tuples
    (`jaxformer.settings.read`)."""
    note_legacy_keys(config)
    run = read(RunSettings, config)
    sections = {k: read(cls, _node(config, k)) for k, cls in SECTIONS.items()}
    objective = get_objective(sections["objective"].name)
    options = objective.read_options(_node(config, "objective"))
    return TrainSettings(
        **{f.name: getattr(run, f.name) for f in dataclasses.fields(RunSettings)}, model=model,
        objective_options=options, objective_spec=objective.resolve(options), **sections)


def run_settings(run_config: dict) -> TrainSettings:
    """The `TrainSettings` of an old run's ``config.json`` (a dict): its model validated by
    `ModelConfig.from_dict`, keys it predates as their defaults, legacy keys noted and ignored."""
    return train_settings(run_config, ModelConfig.from_dict(run_config["model"]))


def note_legacy_keys(config: Any) -> None:
    """Log the note of each `LEGACY_KEYS` key that ``config`` (a ConfigDict or a dict) sets."""
    for dotted, note in LEGACY_KEYS.items():
        node = config
        for part in dotted.split("."):
            node = _node(node, part) if node is not None else None
        if node is not None:
            logging.warning("config key %s=%r: %s", dotted, node, note)
