"""The trainer's set-up, in one direction: each step a function that returns a value, run in order
by `set_up` (what ``Trainer(config, workdir)`` calls):

    resolved = resolve_config(config)             # pure: init_from read, validated once
    built = build(resolved)                       # model, mesh, abstract state and its shardings
    tokenizer = open_tokenizer(resolved, ...)     # the run's, init_from's, a given or a new one
                                                  # (None: an image model, `jaxformer.train.inputs`)
    prepare = wire_objective(...)                 # the objective's step, bound to the tokenizer
    make_ds, train_iter = open_data(...)          # the Grain pipeline (eval split probed)
    state = init_state(resolved, built)           # fresh, or init_from's backbone + fresh heads
    # or, resuming: plan_resume(...) before any write, then restore_state(...)

``init_from`` is a pretraining run (a workdir, its ``checkpoints`` dir or one step dir) or a
Hugging Face directory; of a run, ``init_from_step`` (None/0: the latest) or ``init_from_best``
(the best by the run's ``checkpoint.best_metric``) picks the step. `resolve_model` decides each
``config.model`` field (`jaxformer.config` kinds): a field the config leaves unset (None) takes the
pretrained model's value; a field it sets wins, except that an architecture field that differs from
a run's is refused, naming the field (a Hugging Face directory's architecture is always its own).
So the same config fine-tunes the same from a run and from its Hugging Face export.
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np
import optax
from absl import logging
from jax.sharding import Mesh

from jaxformer.checkpoint import (
    Checkpointer,
    SavedRun,
    StateMismatch,
    WorkdirLock,
    load_checkpoint_params,
    load_run_config,
    open_run,
    save_run_config,
    with_shardings,
)
from jaxformer.checkpoint.verify import verify_for_reading, verify_tokenizer
from jaxformer.config import ModelConfig, architecture_fields, changed_fields, fine_tuning_fields
from jaxformer.convert.hf import hf_model_config, load_hf
from jaxformer.convert.hf_io import find_tokenizer, is_hf_directory, read_config
from jaxformer.convert.lora import merged_params
from jaxformer.data.pipeline import check_train_records, source_texts
from jaxformer.data.sources import SourceSettings, get_source, label_names_from_data
from jaxformer.data.tokenizer import Tokenizer, load_or_train_tokenizer
from jaxformer.models import build_model, lora
from jaxformer.models.head_parts import HEAD_MODULE_NAMES
from jaxformer.models.image_size import fit_image_size
from jaxformer.models.vocab_padding import fit_vocab
from jaxformer.objectives import get_objective
from jaxformer.parallel.mesh import check_batch_size, describe, make_mesh
from jaxformer.settings import as_declared, read
from jaxformer.train.config import (
    TrainSettings,
    check_config,
    check_resume,
    check_vocabulary,
    position_lengths,
    run_settings,
    with_derived_model_fields,
)
from jaxformer.train.extension import Extension, combine
from jaxformer.train.inputs import Inputs, inputs_of
from jaxformer.train.metrics import truncate_metrics
from jaxformer.train.state import TrainState, create_params, create_train_state, state_shardings

# --------------------------------------------------------------------------------------------------
# 1. Resolve the config.


@dataclasses.dataclass(frozen=True)
class Pretrained:
    """What ``init_from`` points at.

    Attributes:
      path: ``init_from`` as given.
      model: its ModelConfig fields (None: derived from the others, or the default).
      tokenizer: what `jaxformer.data.tokenizer.Tokenizer.load` reads for its tokenizer (a run's
        ``tokenizer.model``; a Hugging Face directory's, `jaxformer.convert.hf_io.find_tokenizer`),
        or None.
      run: the checkpoint of a pretraining run; None for a Hugging Face directory.
    """

    path: str
    model: dict[str, Any]
    tokenizer: str | None
    run: SavedRun | None

    @property
    def is_hf(self) -> bool:
        return self.run is None


@dataclasses.dataclass(frozen=True)
class ResolvedConfig:
    """A training config resolved against ``init_from`` and validated.

    Attributes:
      config: a copy of the training config as the run records it in ``config.json``: ``model``
        holds the resolved fields, ``data.tokenizer.path`` the pretrained tokenizer when
        ``init_from`` has one and the config names none.
      model_cfg: the validated `ModelConfig` of ``config.model``.
      pretrained: what ``init_from`` points at, or None.
      tx, schedule: the optimizer and its learning-rate schedule.
      settings: ``config`` as typed sections (`jaxformer.train.config.TrainSettings`), built once.
    """

    config: ml_collections.ConfigDict
    model_cfg: ModelConfig
    pretrained: Pretrained | None
    tx: optax.GradientTransformation
    schedule: optax.Schedule
    settings: TrainSettings


def open_pretrained(config: ml_collections.ConfigDict, key: str = "init_from"
                    ) -> Pretrained | None:
    """Read ``init_from``'s (or the run or HF dir of the config key ``key``, with ``<key>_step``
    and ``<key>_best``) model fields and tokenizer (not its parameters), or None."""
    section, leaf = (config[key.rsplit(".", 1)[0]], key.rsplit(".", 1)[1]) if "." in key else (
        config, key)
    path, step, best = section[leaf], section.get(f"{leaf}_step"), section.get(f"{leaf}_best")
    if not path:
        if step or best:
            raise ValueError(f"{key}_step={step!r} / {key}_best={best!r} choose a step of "
                             f"{key}, which is unset")
        return None
    if not Path(path).exists():
        raise FileNotFoundError(f"{key}={path!r} does not exist")
    if is_hf_directory(path):
        if step or best:
            raise ValueError(f"{key}={path!r} is a Hugging Face model, which has no steps; "
                             f"unset {key}_step and {key}_best")
        model = hf_model_config(path, head=config.model.get("head"),
                                num_classes=config.model.get("num_classes"))
        return Pretrained(path, model, find_tokenizer(path), None)
    run = open_run(path, step=step or None, best=bool(best), verify=False)  # parameters verified when read
    tokenizer = None if run.tokenizer is None else str(run.tokenizer)
    return Pretrained(path, dict(run.run_config["model"]), tokenizer, run)


def resolve_model(stated: dict[str, Any], pretrained: Pretrained | None) -> dict[str, Any]:
    """``config.model`` (``stated``: None = unset) resolved against the pretrained model; see the
    module docstring. ValueError naming each architecture field a run's model has otherwise."""
    if pretrained is None:
        return dict(stated)
    source, names = pretrained.model, [f.name for f in dataclasses.fields(ModelConfig)]
    if pretrained.is_hf:
        fine = set(fine_tuning_fields())
        ignored = [f"model.{k}={stated[k]!r} (the checkpoint has {source[k]!r})"
                   for k in architecture_fields()
                   if stated.get(k) is not None and stated[k] != source[k]]
        if ignored:
            logging.warning("init_from=%s is a Hugging Face model: its architecture is used, not "
                            "%s", pretrained.path, ", ".join(ignored))
        return {k: stated[k] if k in fine and stated.get(k) is not None else source.get(k)
                for k in names}
    merged = {k: stated[k] if stated.get(k) is not None else source.get(k) for k in names}
    changes = changed_fields(ModelConfig.from_dict(source), ModelConfig.from_dict(merged),
                             architecture_fields())
    if changes:
        raise ValueError(f"init_from={pretrained.path} holds a model of another architecture; "
                         f"changed: {'; '.join(changes)}. Set these fields as the pretrained run "
                         "has them (or leave them unset to take its values)")
    return merged


def with_label_names_from_data(config: ml_collections.ConfigDict, source: SourceSettings
                               ) -> tuple[ml_collections.ConfigDict, SourceSettings]:
    """(``config``, ``source``: its ``data`` sources' section), or for a classifier (objective
    ``classify``) whose ``files:`` / ``tfds:`` labels are strings and whose ``data.label_names`` is
    unset, copies naming the train split's labels in sorted order
    (`jaxformer.data.sources.label_names_from_data`, as Hugging Face's ``run_glue.py`` does), said
    in one line; the run's ``config.json`` records them, so ``evaluate`` and ``predict`` use the
    same classes."""
    if config.objective.name != "classify":
        return config, source
    names = label_names_from_data(source)
    if names is None:
        return config, source
    if jax.process_index() == 0:
        print(f"data.label_names unset: the train split's labels, sorted: {','.join(names)} "
              "(set --config.data.label_names to choose the order)")
    named = copy.deepcopy(config)
    with named.unlocked():
        named.data.label_names = names
    label_type = typing.get_type_hints(SourceSettings)["label_names"]
    return named, dataclasses.replace(source, label_names=as_declared(names, label_type))


def _take_decoder_start(resolved: ml_collections.ConfigDict, pretrained: Pretrained) -> None:
    """``init_from``'s decoder start id (a Hugging Face ``decoder_start_token_id``, BART's 2
    ``</s>``; a run's or a converted directory's ``objective.decoder_start_id``) as
    ``objective.decoder_start_id`` when the config leaves that at its default (0, T5's pad), so
    fine-tuning and evaluation start the decoder as the checkpoint was trained to."""
    if pretrained.is_hf:
        start = read_config(pretrained.path).get("decoder_start_token_id")
    else:
        start = run_settings(pretrained.run.run_config).objective.decoder_start_id
    if (pretrained.model.get("family") == "encoder_decoder" and isinstance(start, int)
            and start != 0 and resolved.objective.decoder_start_id == 0):
        logging.info("objective.decoder_start_id=%d: init_from=%s's decoder start", start,
                     pretrained.path)
        resolved.objective.decoder_start_id = start


def _fit_lengths_to_positions(resolved: ml_collections.ConfigDict, pretrained: Pretrained) -> None:
    """A row length longer than ``init_from``'s learned position table is lowered to it, said in
    one line, as Hugging Face's ``run_glue.py`` takes ``min(max_seq_length, model_max_length)``: a
    pretrained table cannot grow, and a config such as configs/hf_classify_finetune.py (128) fits
    any checkpoint (a RoBERTa of 64 positions as well as roberta-base's 512)."""
    model_cfg = ModelConfig.from_dict(resolved.model)
    for key, n in position_lengths(resolved.data, model_cfg).items():
        if n > model_cfg.max_len:
            resolved.data[key] = model_cfg.max_len
            if jax.process_index() == 0:
                print(f"data.{key}={n} is longer than init_from={pretrained.path}'s position table: "
                      f"data.{key}={model_cfg.max_len}, the checkpoint's")


def resolve_config(config: ml_collections.ConfigDict, source: SourceSettings | None = None
                   ) -> ResolvedConfig:
    """Resolve ``config`` against ``init_from`` (`resolve_model`) and validate it once
    (`jaxformer.train.config.check_config`); ``config`` itself is left as it is. ``source``: its
    ``data`` sources' section when the caller has read it (`set_up`), else read here."""
    source = read(SourceSettings, config.data) if source is None else source
    config = with_derived_model_fields(config, source.label_names)  # model.num_classes
    pretrained = open_pretrained(config)
    resolved = copy.deepcopy(config)
    with resolved.unlocked():
        resolved.model = ml_collections.ConfigDict(resolve_model(config.model.to_dict(), pretrained))
        if pretrained is not None:
            _take_decoder_start(resolved, pretrained)
            _fit_lengths_to_positions(resolved, pretrained)
        if pretrained is not None and not config.data.tokenizer.get("path"):
            if pretrained.tokenizer:
                resolved.data.tokenizer.path = pretrained.tokenizer
            else:
                logging.warning(
                    "init_from=%s has no tokenizer: training a new tokenizer, so the "
                    "pretrained embeddings are read with other token ids; set "
                    "data.tokenizer.path to the pretraining tokenizer", pretrained.path)
        for key in ("columns", "label_names"):  # ('text,label',) as the run reads it
            if getattr(source, key):
                resolved.data[key] = getattr(source, key)
    resolved.lock()
    model_cfg = ModelConfig.from_dict(resolved.model)
    settings, tx, schedule = check_config(resolved, model_cfg, resolved=True)
    return ResolvedConfig(resolved, model_cfg, pretrained, tx, schedule, settings)


# --------------------------------------------------------------------------------------------------
# 2. Build the model and the mesh.


@dataclasses.dataclass(frozen=True)
class Built:
    """The model, the mesh, and the train state's abstract shapes and shardings on it;
    ``param_shardings`` are the model's parameters' (the state's too, unless a feature trains
    other parameters: `with_trained`)."""

    model: Any
    mesh: Mesh
    abstract: TrainState
    shardings: TrainState
    param_shardings: Any


def build(resolved: ResolvedConfig) -> Built:
    """The model (`jaxformer.models.Model`, pure functions of the parameter dict) and the state's
    shardings on the mesh; a parameter the mesh cannot split fails here, before any tokenizer or
    file is written."""
    model_cfg, settings = resolved.model_cfg, resolved.settings
    mesh = make_mesh(settings.mesh)
    check_batch_size(mesh, settings.data.batch_size, settings.optimizer.grad_accum_steps)
    model = build_model(model_cfg)
    abstract, shardings = state_shardings(model, resolved.tx, mesh)
    return Built(model, mesh, abstract, shardings, shardings.params)


def with_trained(built: Built, tx: optax.GradientTransformation,
                 trained: tuple[Any, Any] | None) -> Built:
    """``built`` with a train state that holds ``trained`` = (abstract parameters, their logical
    axes) in place of the model's parameters (a feature's:
    `jaxformer.train.extension.Extension.trained`); None: ``built`` as it is."""
    if trained is None:
        return built
    abstract, shardings = state_shardings(built.model, tx, built.mesh, trained)
    return dataclasses.replace(built, abstract=abstract, shardings=shardings)


# --------------------------------------------------------------------------------------------------
# 3. The tokenizer, the objective and the data.


def open_tokenizer(resolved: ResolvedConfig, workdir: Path, resuming: bool) -> Tokenizer | None:
    """The run's own ``tokenizer.model`` when resuming; else ``data.tokenizer.path`` (given, or
    init_from's), else one trained on the train split (its size was checked with the config);
    None for a run that reads no text (an image model: `jaxformer.train.inputs`)."""
    data = resolved.settings.data
    if not inputs_of(resolved.model_cfg).needs_tokenizer:
        return None
    if resuming:
        path = workdir / "tokenizer.model"
    elif data.tokenizer.path:
        path = Path(data.tokenizer.path)
    else:
        return load_or_train_tokenizer(data.tokenizer, None,  # the trainer saves it
                                       lambda: source_texts(get_source(data, "train")),
                                       reuse_saved=False)
    tokenizer = Tokenizer.load(str(path))
    check_vocabulary(tokenizer.vocab_size, resolved.model_cfg, f"the tokenizer {path} "
                     f"({tokenizer.vocab_size} ids)")
    return tokenizer


def record_tokenizer(config: ml_collections.ConfigDict, tokenizer: Tokenizer | None) -> None:
    """``data.tokenizer.vocab_size`` of ``config`` (the resolved config, what ``config.json``
    stores) set to the size of a tokenizer loaded from ``data.tokenizer.path``: the key sizes a
    tokenizer to be trained, and a loaded one has its own (a Hugging Face ``init_from``'s 30,522
    pieces were recorded as a tiny config's 2,048). Resuming compares it only for trained ones
    (`jaxformer.train.config.resume`)."""
    if tokenizer is not None and config.data.tokenizer.get("path"):
        with config.unlocked():
            config.data.tokenizer.vocab_size = int(tokenizer.vocab_size)


def wire_objective(settings: TrainSettings, tokenizer: Tokenizer | None
                   ) -> Callable[[dict, Any], dict]:
    """The ``prepare(batch, rng)`` of the objective of ``settings`` (a run's `TrainSettings`: its
    resolved ``objective_spec`` and ``objective.decoder_start_id``) for the train step, bound to the
    tokenizer's ids (its host-side per-example step, if any, is applied by the pipeline:
    `open_data`); an image model's (no tokenizer) to its `jaxformer.train.inputs` ids."""
    spec = settings.objective_spec
    special = inputs_of(settings.model).special(tokenizer, settings.model)
    return spec.bind(spec.resolved_options, special, tokenizer=tokenizer,
                     decoder_start_id=settings.objective.decoder_start_id)


def open_data(resolved: ResolvedConfig, tokenizer: Tokenizer | None
              ) -> tuple[Callable[..., Any], Any]:
    """(``make_ds(split, num_epochs=None)``, the train iterator), examples built for the
    objective's data task, framing and host-side step (an image model's: image batches,
    `jaxformer.train.inputs`). A missing, empty or unreadable eval split fails now, not after
    training. Each split's size (and what was cut to fit) is reported once, by these first
    datasets, not by every evaluation's."""
    settings, model_cfg = resolved.settings, resolved.model_cfg
    make_ds = inputs_of(model_cfg).dataset_maker(
        settings.data, model_cfg, tokenizer, seed=settings.seed,
        objective=settings.objective_spec, process_index=jax.process_index(),
        process_count=jax.process_count(), report=False)
    train_iter = iter(make_ds("train", report=True))
    if settings.eval.num_batches > 0:
        probe = iter(make_ds(settings.eval.split, num_epochs=1, report=True))
        next(probe, None)
        if hasattr(probe, "close"):
            probe.close()
    return make_ds, train_iter


# --------------------------------------------------------------------------------------------------
# 4. Restore or initialise.


def _flat(tree) -> dict[tuple[str, ...], Any]:
    return {tuple(str(k.key) for k in path): v
            for path, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def merge_backbone(new_params, pretrained, *, head_modules: Iterable[str] = HEAD_MODULE_NAMES):
    """Copy every pretrained parameter into ``new_params``; keep fresh init only for new heads.

    Raises ValueError naming the parameter path when a shape differs, or when a non-head parameter
    of the new model is missing from the checkpoint. Returns (merged params, list of fresh paths).
    """
    new_flat, old_flat = _flat(new_params), _flat(pretrained)
    fresh, merged = [], {}
    for path, value in new_flat.items():
        name = "/".join(path)
        if path in old_flat:
            old = old_flat[path]
            if tuple(old.shape) != tuple(value.shape):
                raise ValueError(f"init_from: parameter {name} has shape {tuple(old.shape)} in the "
                                 f"checkpoint but {tuple(value.shape)} in the model")
            merged[path] = np.asarray(old, dtype=value.dtype)  # on the host until sharded
        elif path[0] in head_modules:
            merged[path] = value
            fresh.append(name)
        else:
            raise ValueError(f"init_from: backbone parameter {name} (shape {tuple(value.shape)}) is "
                             f"missing from the checkpoint; {_layout_hint(path, old_flat)}")
    leaves = [merged[p] for p in new_flat]
    return jax.tree_util.tree_unflatten(jax.tree.structure(new_params), leaves), fresh


def _layout_hint(missing: tuple[str, ...], old_flat: dict) -> str:
    """Why a parameter may be missing: a scanned (``layers``) vs unrolled (``layer_i``) stack."""
    scanned_old = any("layers" in p for p in old_flat)
    scanned_new = "layers" in missing
    if scanned_old != scanned_new:
        return (f"the checkpoint's layers are {'stacked' if scanned_old else 'unrolled'}: set "
                f"model.scan_layers={scanned_old} to read it")
    return "is the architecture the same?"


def init_state(resolved: ResolvedConfig, built: Built) -> TrainState:
    """Fresh parameters, or with ``init_from`` its backbone plus fresh (sharded) parameters for new
    heads; the pretrained parameters are read on the host and placed shard by shard, never whole on
    one device."""
    pretrained = resolved.pretrained
    params, fresh = None, []
    if pretrained is not None:
        params, fresh = load_pretrained(resolved, built)
    state, _ = create_train_state(built.model, resolved.tx, built.mesh, resolved.settings.seed,
                                  params=params)
    report_init_from(pretrained, fresh)
    return state


def load_pretrained(resolved: ResolvedConfig, built: Built) -> tuple[Any, list[str]]:
    """(init_from's parameters with fresh ones for new heads, on the host; the fresh paths)."""
    model_cfg, pretrained, seed = resolved.model_cfg, resolved.pretrained, resolved.settings.seed
    if pretrained.is_hf:  # the importer initialises any head the checkpoint lacks (logged)
        hf_cfg, backbone, _ = load_hf(pretrained.path, scan_layers=model_cfg.scan_layers,
                                      head=model_cfg.head, num_classes=model_cfg.num_classes,
                                      seed=seed, vocab_pad_multiple=model_cfg.vocab_pad_multiple)
        backbone = fit_image_size(backbone, ModelConfig.from_dict(hf_cfg), model_cfg)
    else:  # verified first; its vocabulary tables re-padded as the model pads them (a layout)
        source = ModelConfig.from_dict(pretrained.model)  # ViT at another resolution: positions resampled
        backbone = fit_image_size(fit_vocab(_run_params(pretrained.run), source, model_cfg), source,
                                  model_cfg)
    fresh_params = create_params(built.model, built.param_shardings, seed)
    return merge_backbone(fresh_params, backbone)


def _run_params(run: SavedRun) -> Any:
    """The parameters a run's model applies, verified: its checkpoint's, or for a LoRA run (whose
    checkpoint holds adapters and task heads only) those merged into its base
    (`jaxformer.convert.lora.merged_params`; its ``init_from``, a run or a Hugging Face model)."""
    if not lora.is_lora(run.run_config):
        return load_checkpoint_params(run.step_dir)
    verify_for_reading(run.step_dir.parent, int(run.step_dir.name))
    return merged_params(run)


def report_init_from(pretrained: Pretrained | None, fresh: list[str]) -> None:
    if pretrained is not None and pretrained.is_hf:
        print(f"Initialised from the Hugging Face model {pretrained.path}")
    elif pretrained is not None:
        print(f"Initialised from {pretrained.run.step_dir}; fresh parameters: {fresh or 'none'}")


@dataclasses.dataclass(frozen=True)
class ResumePlan:
    """The newest intact checkpoint of the workdir and what a resume from it must report."""

    step: int
    manifest: dict | None
    damaged: list
    notes: list[str]


def plan_resume(ckpt: Checkpointer, workdir: Path, config: ml_collections.ConfigDict,
                inputs: Inputs) -> ResumePlan | None:
    """None if the workdir holds no checkpoint; else the newest intact step and the checks a resume
    must pass (config; the tokenizer, when ``inputs`` read text), before any write."""
    if not ckpt.steps():
        return None
    step, manifest, damaged = ckpt.newest_intact()
    if step is None:
        raise ValueError(
            f"no intact checkpoint in {ckpt.directory}: "
            + "; ".join(f"{e.step_dir.name}: {e.problem}" for e in damaged)
            + ". Restore the files from a copy, or move the checkpoints folder away to "
              "train from scratch")
    notes = check_resume(load_run_config(workdir, manifest), config)
    verify_tokenizer(workdir, manifest, required=inputs.needs_tokenizer)
    return ResumePlan(step, manifest, damaged, notes)


def restore_state(ckpt: Checkpointer, built: Built, train_iter: Any, plan: ResumePlan,
                  workdir: Path) -> tuple[TrainState, int]:
    """(state, step) of ``plan.step``, the data iterator restored with it; then (the resume has
    succeeded) the changed config keys are logged and damaged newer steps set aside."""
    try:
        state, step = ckpt.restore(with_shardings(built.abstract, built.shardings), train_iter,
                                   plan.step, verified=True)
    except StateMismatch as e:
        changed = [n for n in plan.notes if n.startswith("optimizer.")]
        raise ValueError(
            f"cannot resume: {e}; changed: {'; '.join(changed) or 'no optimizer.* key'}. "
            "Resume with the previous optimizer settings, or fine-tune its parameters with a "
            f"fresh optimizer state in a new --workdir with --config.init_from={workdir}"
        ) from None
    for note in plan.notes:  # from here on the resume succeeds: the workdir may change
        logging.warning("resuming %s with a changed config: %s", workdir, note)
    moved = ckpt.set_aside(int(e.step_dir.name) for e in plan.damaged)
    for e, target in zip(plan.damaged, moved):
        print(f"Skipped damaged checkpoint {e.step_dir.name} ({e.problem}); kept as "
              f"{target} (never read: inspect or delete it)")
    checked = (plan.manifest or {}).get("verified")
    how = (f"verified {checked['bytes'] / 1e6:.1f} MB in {checked['seconds']:.2f} s" if checked
           else "written before checkpoints carried checksums: not verified")
    print(f"Resumed from {ckpt.directory}/{step} ({how})")
    return state, step


# --------------------------------------------------------------------------------------------------
# 5. All of it, in order.

# A feature of the run (`jaxformer.train.loop.FEATURES`): ``(resolved, built) -> Extension | None``.
Feature = Callable[[ResolvedConfig, Built], Extension | None]
# A feature's step on the stated config before it is resolved (distillation's teacher tokenizer).
ConfigStep = Callable[[ml_collections.ConfigDict], ml_collections.ConfigDict]


@dataclasses.dataclass(frozen=True)
class Setup:
    """What a run starts from (`set_up`).

    Attributes:
      resolved: the config resolved and validated (``resolved.settings``: its typed sections).
      built: the model, the mesh and the state's shardings (a feature's trained tree included).
      workdir: the run's directory; ``lock``: held on it, claimed (the run writes it).
      ckpt: the workdir's `Checkpointer`.
      tokenizer: the run's tokenizer (None: an image model's); ``prepare``: the objective's
        ``prepare(batch, rng)``.
      make_ds, train_iter: ``make_ds(split, num_epochs=None)`` and the train iterator.
      extension: the features' combined `Extension`.
      state, start_step: the state training starts from (resumed, from ``init_from``, a feature's
        start, or fresh) and its step.
    """

    resolved: ResolvedConfig
    built: Built
    workdir: Path
    lock: WorkdirLock
    ckpt: Checkpointer
    tokenizer: Tokenizer | None
    prepare: Callable[[dict, Any], dict]
    make_ds: Callable[..., Any]
    train_iter: Any
    extension: Extension
    state: TrainState
    start_step: int


def stated_inputs(config: ml_collections.ConfigDict) -> Inputs:
    """What a run of the stated ``config`` reads (`jaxformer.train.inputs.inputs_of`), before it
    is resolved: of ``config.model``, or of ``init_from``'s model when it leaves ``image_size``
    unset (a fine-tuning config takes the pretrained model's)."""
    if config.model.get("image_size") is None and config.get("init_from"):
        return inputs_of(open_pretrained(config).model)
    return inputs_of(config.model.to_dict())


def set_up(config: ml_collections.ConfigDict, workdir: str | Path, features: Sequence[Feature],
           config_steps: Sequence[ConfigStep] = ()) -> Setup:
    """The trainer's set-up, in order (Levanter's ``TrainLmConfig.build()``): the train records and
    label names read from the data (a bad record refused before the config's other checks),
    ``config_steps`` (each feature's, on the stated config), `resolve_config`, `build`; then, the
    workdir locked, every check that can refuse the run, reading only (`plan_resume`,
    `open_tokenizer`, the objective, `open_data`, ``features``: each ``(resolved, built) ->
    Extension | None``, combined); the state restored or initialised. A refusal, or a failure
    before the lock is claimed, leaves no trace (`jaxformer.checkpoint.lock`); after it the run
    writes ``config.json``, a new tokenizer and the metrics cut back to its start step."""
    source = read(SourceSettings, config.data)  # the sources' section, read once before resolve
    if stated_inputs(config).needs_tokenizer:  # text records; image files are read as batched
        config, source = with_label_names_from_data(config, source)  # string labels: sorted
        objective = get_objective(config.objective.name)  # a bad record: refused now, before the
        check_train_records(source, objective.resolve(  # config's other checks
            objective.read_options(config.objective)))
    for step in config_steps:
        config = step(config)
    resolved = resolve_config(config, source)
    workdir = Path(workdir)
    if workdir.exists() and not workdir.is_dir():
        raise ValueError(f"workdir {str(workdir)!r} exists and is not a directory")
    built = build(resolved)
    lock = WorkdirLock(workdir).acquire()  # a second run stops here; nothing written
    try:  # every check that can refuse the run, reading only: a refusal leaves no trace
        settings, model_cfg = resolved.settings, resolved.model_cfg
        ckpt = Checkpointer(workdir, settings.checkpoint)
        resume = plan_resume(ckpt, workdir, resolved.config, inputs_of(model_cfg))
        if jax.process_index() == 0:
            print(f"Mesh {describe(built.mesh)}, parallel={settings.parallel}, attention "
                  f"{model_cfg.attention_summary(built.mesh.shape['context'])}")
        tokenizer = open_tokenizer(resolved, workdir, resuming=resume is not None)
        record_tokenizer(resolved.config, tokenizer)  # config.json: the size it has
        prepare = wire_objective(settings, tokenizer)
        make_ds, train_iter = open_data(resolved, tokenizer)
        ext = combine(*(feature(resolved, built) for feature in features))
        built = with_trained(built, resolved.tx, ext.trained)  # what a feature trains, if not the model
        if resume is None:
            state, start_step = (ext.init_state or init_state)(resolved, built), 0
        else:  # sets damaged newer steps aside once the restore has succeeded
            state, start_step = restore_state(ckpt, built, train_iter, resume, workdir)
    except BaseException:
        lock.release(undo=True)
        raise
    lock.claim()  # the checks have passed: the run writes the workdir from here on
    if jax.process_index() == 0:
        save_run_config(workdir, resolved.config)
        if resume is None and tokenizer is not None:  # a resumed run keeps its own
            tokenizer.save(str(workdir / "tokenizer.model"))
        truncate_metrics(workdir, start_step)  # one row per step across crashes
    return Setup(resolved, built, workdir, lock, ckpt, tokenizer, prepare, make_ds, train_iter, ext,
                 state, start_step)
