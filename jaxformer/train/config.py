"""The training config: defaults for every key, and validation before anything compiles.

Every ``configs/<name>.py`` starts from `base_config()` and overrides what it needs, so any key can be
overridden on the command line (``--config.num_train_steps=20``). Each key is described in one line
where it is declared: `KEY_DOCS` here (top level, ``objective``, ``checkpoint``, ``eval``, ``mesh``),
`jaxformer.config.ModelConfig`'s field ``doc`` (``model``), `jaxformer.data.pipeline.DATA_KEY_DOCS`,
`jaxformer.data.sources.SOURCE_KEY_DOCS`, `jaxformer.data.tokenizer.TOKENIZER_KEY_DOCS` (``data``),
`jaxformer.train.optim.OPTIMIZER_KEY_DOCS`, `jaxformer.objectives.OPTION_DOCS`, and (``distill``)
`jaxformer.train.distill_config.DISTILL_KEY_DOCS`; ``train.py --print_config`` lists them all.

Three things are configs; the code names them apart: ``config`` is this training config (an
``ml_collections.ConfigDict``), ``model_cfg`` the `jaxformer.config.ModelConfig` read from its
``model`` section, ``run_config`` the training config a run saved (``<workdir>/config.json``, a
plain dict), and ``hf_config`` a Hugging Face model's ``config.json``.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib.util
import json
import os
import sys
import typing
from collections.abc import Mapping
from typing import Any

import ml_collections
import optax
from absl import flags
from ml_collections import config_flags

from jaxformer.config import ModelConfig, changed_fields, resumable_fields
from jaxformer.data.pipeline import check_data_config, default_data_config
from jaxformer.data.sources import list_option
from jaxformer.evaluation.decoding import check_generation
from jaxformer.objectives import OBJECTIVES, OPTION_DEFAULTS, check_objective, get_objective
from jaxformer.objectives.cloze import check_cloze_config, predicts_labels
from jaxformer.objectives.permutation import check_plm_model
from jaxformer.objectives.scheduled_sampling import check_scheduled_sampling
from jaxformer.ops.attention_kernels import check_backend
from jaxformer.train.distill_config import check_distill, default_distill_config
from jaxformer.train.nonfinite import POLICIES
from jaxformer.train.optim import default_optimizer_config, make_optimizer

TOP_LEVEL_KEYS = ("seed", "num_train_steps", "init_from", "init_from_step", "init_from_best", "model",
                  "objective", "data", "optimizer", "checkpoint", "eval", "mesh", "parallel", "distill",
                  "module_api", "log_every_steps", "progress_bar", "name", "nonfinite", "nonfinite_limit")
PARALLEL_MODES = ("jit", "shard_map", "pmap")  # see jaxformer.parallel: which to use and why
MODULE_APIS = ("linen", "nnx")


# One line per key that `base_config` declares here (the other sections' keys are described where
# they are declared: see the module docstring). Dotted keys for the keys of a section.
KEY_DOCS = {
    "name": "the run's name (shown in logs)",
    "seed": "parameters, dropout, masking and data order all derive from it",
    "num_train_steps": "optimizer updates to run (a resumed run continues up to this number)",
    "init_from": "'' | a pretraining workdir | a checkpoint step dir | a Hugging Face model dir",
    "init_from_step": "the step of an init_from run to read (unset or 0: the latest)",
    "init_from_best": "read init_from's best step by its checkpoint.best_metric",
    "objective.name": f"one of {', '.join(sorted(OBJECTIVES))}; decides the data task and the "
                      "usual framing",
    "objective.label_smoothing": "label smoothing of the training cross-entropy (not of evaluation)",
    "objective.z_loss": "weight of the z-loss log(Z)^2 on the output logits (PaLM)",
    "objective.decoder_start_id": "encoder_decoder: the first decoder input id (T5: pad = 0; a "
                                  "Hugging Face init_from's decoder_start_token_id, e.g. BART's 2, "
                                  "replaces the default 0)",
    "checkpoint.every_steps": "save a checkpoint every this many steps (and at the last step)",
    "checkpoint.keep": "the latest this many checkpoints are kept (plus the best by best_metric)",
    "checkpoint.best_metric": "also keep the best checkpoint by this logged metric, e.g. "
                              "'eval_loss' ('' = none)",
    "checkpoint.best_mode": "'min' or 'max': which value of best_metric is best",
    "checkpoint.async_save": "write checkpoints in the background while training goes on",
    "eval.every_steps": "evaluate every this many steps (and at the last step)",
    "eval.num_batches": "batches of eval.split per evaluation (0 = no evaluation)",
    "eval.split": "the split evaluated during training: 'validation' or 'test'",
    "eval.generate_examples": "decode the first N examples of eval.split at each evaluation and log "
                              "eval_bleu / eval_chrf / eval_exact_match (0 = off; seq2seq, sft, clm)",
    "eval.generate_max_new_tokens": "tokens generated per example in that scoring (0 = data.target_len)",
    "eval.generate_strategy": "decoding for that scoring: 'greedy' or 'beam'",
    "eval.generate_beam_size": "beams when eval.generate_strategy='beam'",
    "mesh.data": "data-parallel mesh axis size (-1 = the devices the other axes leave)",
    "mesh.fsdp": "FSDP mesh axis size (parameters sharded over it)",
    "mesh.context": "context-parallel mesh axis size: the sequence split over it, attention as "
                    "zig-zag ring attention (data.seq_len / target_len multiples of 2×context)",
    "mesh.tensor": "tensor-parallel mesh axis size",
    "mesh.dcn_data": "slices (TPU multi-slice, over the data-center network) along mesh.data; "
                     "mesh.data, mesh.fsdp and mesh.tensor are then sizes within one slice",
    "mesh.dcn_fsdp": "slices along mesh.fsdp (FSDP across slices: its gathers cross the DCN)",
    "parallel": "'jit' (sharded over the mesh), 'shard_map' or 'pmap' (data parallel, replicated "
                "state)",
    "module_api": "'nnx' (the one module implementation, jaxformer.nnx); 'linen', the former "
                  "Linen modules' setting, runs the same NNX program (same parameters)",
    "log_every_steps": "metrics.jsonl / TensorBoard cadence",
    "nonfinite": "'stop' at the first non-finite loss or grad norm, or 'skip' the update",
    "nonfinite_limit": "with nonfinite='skip': stop after this many non-finite steps in a row",
    "progress_bar": "tqdm progress bar: unset = only when stderr is a terminal (none in a "
                    "redirected log), true = always, false = never",
}


def model_defaults() -> ml_collections.ConfigDict:
    """``config.model`` declaring every `ModelConfig` field as a typed placeholder (None = not set),
    so that ``--config.model.<field>=…`` can set any of them. A field left unset takes the
    pretrained model's value when ``init_from`` is given (a run's ``config.json`` or a Hugging Face
    ``config.json``), else `ModelConfig`'s default; so the same config fine-tunes the same from a
    run and from its Hugging Face export. Configs fill it with ``c.model.update(preset(...))``,
    which keeps the declarations and their types."""
    hints = typing.get_type_hints(ModelConfig)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(ModelConfig):
        kind = next(t for t in (typing.get_args(hints[f.name]) or (hints[f.name],))
                    if t is not type(None))
        out[f.name] = ml_collections.config_dict.placeholder(kind)
    return ml_collections.ConfigDict(out)


def base_config() -> ml_collections.ConfigDict:
    """All keys with defaults (``model``: declared, unset); configs override them. Every key is
    described (see the module docstring; a test checks that none lacks a description)."""
    c = ml_collections.ConfigDict()
    c.name = "run"
    c.seed = 0
    c.num_train_steps = 1000
    c.init_from = ""
    c.init_from_step = ml_collections.config_dict.placeholder(int)  # unset: not in old runs'
    c.init_from_best = ml_collections.config_dict.placeholder(bool)  # config.json, no resume note
    c.model = model_defaults()
    c.objective = ml_collections.ConfigDict(dict(
        name="clm", label_smoothing=0.0, z_loss=0.0, decoder_start_id=0, **OPTION_DEFAULTS))
    c.data = default_data_config()
    c.optimizer = default_optimizer_config()
    c.checkpoint = ml_collections.ConfigDict(dict(every_steps=500, keep=3, best_metric="",
                                                  best_mode="min", async_save=True))
    c.eval = ml_collections.ConfigDict(dict(
        every_steps=500, num_batches=20, split="validation", generate_examples=0,
        generate_max_new_tokens=0, generate_strategy="greedy", generate_beam_size=4))
    c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, context=1, tensor=1, dcn_data=1,
                                            dcn_fsdp=1))
    c.parallel = "jit"
    c.module_api = "nnx"
    c.log_every_steps = 50
    c.nonfinite = "stop"
    c.nonfinite_limit = 10
    c.progress_bar = ml_collections.config_dict.placeholder(bool)  # unset: auto (TTY only)
    c.distill = default_distill_config()  # knowledge distillation (jaxformer.train.distill)
    return c


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


def config_node(config: ml_collections.ConfigDict, dotted: str) -> tuple[Any, str]:
    """(parent, leaf name) of the existing key ``dotted = "a.b.c"``; KeyError naming the first
    missing part (overrides change keys, never add them) and the key meant: the key of the same
    meaning (`HF_NAMES`, e.g. ``learning_rate``), else a close spelling (`difflib`)."""
    parts = dotted.split(".")
    node: Any = config
    for i, part in enumerate(parts):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            where = ".".join(parts[:i]) or "the config"
            close = difflib.get_close_matches(part, list(node.keys()) if isinstance(
                node, ml_collections.ConfigDict) else [], n=1)
            hint = f"; did you mean {'.'.join([*parts[:i], close[0]])!r}?" if close else ""
            if part in HF_NAMES and HF_NAMES[part] != dotted:
                hint = (f"; did you mean {HF_NAMES[part]!r}? (what Hugging Face calls "
                        f"{part!r})")
            raise KeyError(f"{dotted!r}: {where} has no key {part!r}{hint}")
        if i < len(parts) - 1:
            node = node[part]
    return node, parts[-1]


def set_key(config: ml_collections.ConfigDict, dotted: str, value: Any) -> None:
    """``config[a][b][c] = value`` for the existing key ``dotted = "a.b.c"`` (KeyError if absent)."""
    parent, leaf = config_node(config, dotted)
    parent[leaf] = value


def complete_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Add to ``config`` (in place, and return it) every key `base_config()` declares that it lacks.

    A config written as ``c.model = preset(...)`` replaces the declared ``model`` node with one holding
    only the preset's fields, so ``--config.model.pooling=max`` would fail with a bare
    ``AttributeError``; completed, it has every field again, typed placeholders included. Values the
    config sets, its own field references and keys it added (refused later by `validate_config` if
    unknown) are kept.
    """
    def fill(node: ml_collections.ConfigDict, declared: ml_collections.ConfigDict) -> None:
        for key in declared.keys():
            if key not in node:
                node[key] = declared[key] if declared[key] is not None else declared.get_ref(key)
            elif isinstance(node[key], ml_collections.ConfigDict) and isinstance(
                    declared[key], ml_collections.ConfigDict):
                fill(node[key], declared[key])

    with config.unlocked():
        fill(config, base_config())
    return config


def load_config(path: str | os.PathLike, overrides: Mapping[str, Any] | None = None
                ) -> ml_collections.ConfigDict:
    """The training config of a config file: ``get_config()`` of ``path`` (``"file.py:arg"``
    passes ``arg`` to it), completed (`complete_config`), with ``overrides`` applied
    (``{"model.num_layers": 2}``, `set_key`: KeyError naming a key the config lacks), and locked
    (setting a key it lacks is an error, not a new key)."""
    path = os.fspath(path)
    file, _, arg = path.partition(":")
    if os.path.isdir(file):
        raise ValueError(f"config file {file!r} is a directory; give one of its config files "
                         f"(e.g. {os.path.join(file, 'gpt_pretrain_tiny.py')!r})")
    if not os.path.isfile(file):
        raise ValueError(f"config file {file!r} does not exist")
    name = "jaxformer_config_" + os.path.splitext(os.path.basename(file))[0]
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(arg) if arg else module.get_config()
    if not isinstance(config, ml_collections.ConfigDict):
        raise ValueError(f"{file}: get_config() returned a {type(config).__name__}, not an "
                         "ml_collections.ConfigDict")
    complete_config(config)
    for key, value in (overrides or {}).items():
        set_key(config, key, value)
    config.lock()
    return config


def define_config_flag(name: str = "config", flag_values: Any = None,
                       sys_argv: list[str] | None = None) -> Any:
    """``config_flags.DEFINE_config_file`` whose file is read by `load_config` (so completed)
    before the command-line overrides (``--config.model.num_layers=2``) are applied, then locked."""

    class _LoadingParser(flags.ArgumentParser):
        def __init__(self, inner: flags.ArgumentParser):
            self.inner = inner  # ml_collections' own parser: names the flag type

        def parse(self, path):
            config = load_config(path)
            for arg in sys.argv if sys_argv is None else sys_argv:  # name a misspelt key
                if arg.startswith(f"--{name}."):                    # in one line
                    try:
                        config_node(config, arg[len(name) + 3:].split("=", 1)[0])
                    except KeyError as e:
                        raise ValueError(f"{arg}: {e.args[0]}") from None
            return config

        def flag_type(self):
            return self.inner.flag_type()

    flag_values = flags.FLAGS if flag_values is None else flag_values
    holder = config_flags.DEFINE_config_file(
        name, None, "Path to a configs/<name>.py file.", flag_values=flag_values, sys_argv=sys_argv)
    flag_values[name].parser = _LoadingParser(flag_values[name].parser)
    return holder


def with_derived_model_fields(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """``config``, or a copy of it with ``model.num_classes = len(data.label_names)`` when it
    classifies (``objective.name``), names its labels and leaves ``model.num_classes`` unset (a
    stated value is kept: `check_config` refuses one smaller than the labels)."""
    names = list_option(config.data, "label_names")
    if (not names or config.model.get("num_classes") is not None
            or get_objective(config.objective.name).data_task != "classify"):
        return config
    derived = copy.deepcopy(config)
    with derived.unlocked():
        derived.model.num_classes = len(names)
    return derived


def validate_config(config: ml_collections.ConfigDict) -> ModelConfig:
    """Check the whole config up front (its derived fields filled, `with_derived_model_fields`);
    returns the validated ModelConfig.

    Raises ValueError naming the offending field.
    """
    config = with_derived_model_fields(config)
    model_cfg = ModelConfig.from_dict(config.model)
    check_config(config, model_cfg)
    return model_cfg


def check_config(config: ml_collections.ConfigDict, model_cfg: ModelConfig, *,
                 resolved: bool = False) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Check ``config`` for ``model_cfg`` (ValueError naming the field), before the tokenizer is
    trained or any data is read; returns the optimizer and its schedule, built on the way (their
    errors name the ``optimizer`` field). ``resolved``: ``config`` was resolved against its
    ``init_from`` (`jaxformer.train.setup.resolve_config`), so a tokenizer it names no path for is
    one to be trained."""
    unknown = sorted(set(config.keys()) - set(TOP_LEVEL_KEYS))
    if unknown:
        raise ValueError(f"unknown top-level config keys {unknown}; valid keys are {TOP_LEVEL_KEYS}")
    if not isinstance(config.num_train_steps, int) or config.num_train_steps <= 0:
        raise ValueError(f"num_train_steps={config.num_train_steps!r} must be a positive integer")
    if config.parallel not in PARALLEL_MODES:
        raise ValueError(f"parallel={config.parallel!r} must be one of {PARALLEL_MODES}")
    if config.get("module_api", "nnx") not in MODULE_APIS:
        raise ValueError(f"module_api={config.module_api!r} is invalid: choose one of {MODULE_APIS}")
    sharded = {a: config.mesh.get(a, 1) for a in ("fsdp", "context", "tensor")
               if config.mesh.get(a, 1) != 1}
    if config.parallel != "jit" and sharded:
        raise ValueError(f"parallel={config.parallel!r} is data parallel only (replicated state), "
                         f"so {', '.join(f'mesh.{a}={v}' for a, v in sharded.items())} would be "
                         "ignored; use parallel='jit' for FSDP / context / tensor parallelism")
    check_context_parallel(config, model_cfg)
    if config.nonfinite not in POLICIES or config.nonfinite_limit < 1:
        raise ValueError(f"nonfinite={config.nonfinite!r} must be one of {POLICIES} and "
                         f"nonfinite_limit={config.nonfinite_limit} at least 1")
    for key in ("every_steps", "keep"):
        if config.checkpoint[key] <= 0:
            raise ValueError(f"checkpoint.{key}={config.checkpoint[key]} must be positive")
    if config.eval.every_steps <= 0 or config.eval.num_batches < 0:
        raise ValueError("eval.every_steps must be positive and eval.num_batches >= 0")
    check_objective(config.objective)
    check_plm_model(config.objective, model_cfg)
    check_cloze_config(config, model_cfg)
    check_scheduled_sampling(config.objective)
    check_distill(config)
    check_generation(config, model_cfg)
    check_backend(model_cfg.attention_impl)  # e.g. cudnn without a CUDA GPU, before compiling
    optimizer = make_optimizer(config.optimizer, model_cfg.d_model, config.num_train_steps)
    if config.optimizer.get("lora", {}).get("rank") and (not config.init_from
                                                          or config.parallel != "jit"):
        raise ValueError("optimizer.lora.rank > 0 adapts the weights of init_from (set it) and "
                         f"trains with parallel='jit' (got {config.parallel!r})")
    _check_data(config, model_cfg, resolved)
    accum = config.optimizer.get("grad_accum_steps", 1)
    if config.data.batch_size % accum:
        raise ValueError(f"data.batch_size={config.data.batch_size} must be divisible by "
                         f"optimizer.grad_accum_steps={accum}")
    return optimizer


def check_context_parallel(config: ml_collections.ConfigDict, model_cfg: ModelConfig) -> None:
    """``mesh.context > 1`` (`jaxformer.parallel.context`): what ring attention cannot run,
    refused naming the field, before compilation."""
    n = int(config.mesh.get("context", 1))
    if n == 1:
        return
    name = f"mesh.context={n}"
    if model_cfg.attention_impl not in ("xla", "chunked"):
        raise ValueError(f"{name} runs attention as ring attention, whose blocks are XLA matmuls; "
                         f"model.attention_impl={model_cfg.attention_impl!r} cannot run inside it: "
                         "use 'xla' or 'chunked'")
    if model_cfg.attention_dropout_rate:
        raise ValueError(f"{name}: ring attention has no attention dropout; set "
                         f"model.attention_dropout_rate=0.0 (got {model_cfg.attention_dropout_rate})")
    if model_cfg.permutation_lm:
        raise ValueError(f"{name}: XLNet's two-stream attention (model.permutation_lm) uses dense "
                         "masks that ring attention does not take; use mesh.context=1")
    if n < 1:
        return  # -1: the size depends on the devices; the lengths are checked when tracing
    lengths = {"seq_len": config.data.seq_len}
    if model_cfg.family == "encoder_decoder":
        lengths["target_len"] = config.data.target_len
    for key, length in lengths.items():
        if length % (2 * n):
            raise ValueError(f"data.{key}={length} is not divisible by 2 × {name} = {2 * n}: ring "
                             f"attention's zig-zag order cuts the sequence into {2 * n} chunks; "
                             f"use a multiple of {2 * n}")


def check_vocabulary(num_ids: int, model_cfg: ModelConfig, tokenizer: str) -> None:
    """A tokenizer of ``num_ids`` ids (described by ``tokenizer``) fits the model's embedding table
    (else JAX would clamp the ids past its end)."""
    if num_ids > model_cfg.vocab_size:
        raise ValueError(f"{tokenizer} exceeds model.vocab_size={model_cfg.vocab_size}: the model "
                         f"has no embedding for its ids above that; set model.vocab_size >= "
                         f"{num_ids}")


def _check_data(config: ml_collections.ConfigDict, model_cfg: ModelConfig, resolved: bool) -> None:
    """The data section, and how it fits the model: row lengths within a learned position table,
    string labels within the classifier's classes, a tokenizer to be trained within the vocabulary
    (one read from a file is checked when it is read)."""
    data = config.data
    check_data_config(data, objective=config.objective)
    if model_cfg.position == "learned":
        lengths = {"seq_len": data.seq_len}
        if model_cfg.family == "encoder_decoder":
            lengths["target_len"] = data.target_len
        for key, n in lengths.items():
            if n > model_cfg.max_len:
                raise ValueError(f"data.{key}={n} exceeds model.max_len={model_cfg.max_len}, the "
                                 f"learned position table; lower data.{key} or raise model.max_len")
    pairs = config.objective.get("sentence_pairs", "none")  # the pair label needs its head
    if pairs != "none" and (not model_cfg.nsp_head or model_cfg.type_vocab_size < 2):
        raise ValueError(f"objective.sentence_pairs={pairs!r} trains on [CLS] A [SEP] B [SEP] rows "
                         f"with a pair label: set model.nsp_head=True (got {model_cfg.nsp_head}) "
                         f"and model.type_vocab_size=2 (got {model_cfg.type_vocab_size})")
    tok = data.tokenizer
    if not tok.get("path") and (resolved or not config.init_from):  # else init_from's may be used
        check_vocabulary(tok.vocab_size, model_cfg, f"data.tokenizer.vocab_size={tok.vocab_size}")
    names = list_option(data, "label_names")
    if (names and predicts_labels(model_cfg, config.objective.name)
            and len(names) > model_cfg.num_classes):
        raise ValueError(f"data.label_names has {len(names)} labels {names} but model.num_classes="
                         f"{model_cfg.num_classes}; set model.num_classes={len(names)}")


def _effective_data(flat_config: dict[str, Any]) -> dict[str, Any]:
    """``data.task`` and an unset ``data.framing`` as the objective derives them, so a config.json
    written when configs still stated them compares equal to today's config."""
    out = {k: v for k, v in flat_config.items() if k != "data.task"}
    objective = get_objective(flat_config.get("objective.name", "clm"))
    if not out.get("data.framing") and objective.framing:
        out["data.framing"] = objective.framing
    return out


def check_resume(run_config: dict, config: ml_collections.ConfigDict) -> list[str]:
    """Compare the ``config.json`` a workdir's checkpoints were written with to the current config.

    Raises ValueError naming the fields when the model (other than `resumable_fields`) or the
    tokenizer settings differ (the checkpoint could not be restored, or would be read with other
    token ids); returns a note for every other changed key (e.g. ``num_train_steps``: the schedule
    is stretched; ``data.tokenizer.path``: a resumed run reads its own, checksummed tokenizer).
    """
    def flat(tree: Any, prefix: str = "") -> dict[str, Any]:
        if not isinstance(tree, dict):
            return {prefix[:-1]: tree}
        return {k: v for key, sub in tree.items() for k, v in flat(sub, f"{prefix}{key}.").items()}

    current = json.loads(json.dumps(config.to_dict(), default=str))  # as config.json stores it
    now, before = _effective_data(flat(current)), _effective_data(flat(run_config))
    old_model, new_model = (ModelConfig.from_dict(c["model"]) for c in (run_config, current))
    changed = [k for k in sorted(set(now) | set(before))
               if not k.startswith("model.") and before.get(k) != now.get(k)]
    fixed = changed_fields(old_model, new_model, (f.name for f in dataclasses.fields(ModelConfig)
                                                  if f.name not in resumable_fields()))
    fixed += [f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in changed
              if k.startswith("data.tokenizer.") and k != "data.tokenizer.path"]
    if fixed:
        raise ValueError("this workdir holds checkpoints of a different model or tokenizer; "
                         f"changed: {'; '.join(fixed)}. Use a new --workdir (or "
                         "--config.init_from=<this workdir> to fine-tune from it)")
    notes = changed_fields(old_model, new_model, resumable_fields())
    for k in changed:
        note = f"{k}: {before.get(k)!r} -> {now.get(k)!r}"
        if k == "num_train_steps":
            note += (" (the learning-rate schedule is recomputed for the new length, so it differs "
                     "from the one trained so far)")
        notes.append(note)
    return notes
