"""The training config: defaults for every key, and validation before anything compiles.

Every ``configs/<name>.py`` starts from `base_config()` and overrides what it needs, so any key can be
overridden on the command line (``--config.num_train_steps=20``). Top-level keys:

=================  ==============================================================================
seed               int; parameters, dropout, masking and data order all derive from it
num_train_steps    optimizer updates to run (a resumed run continues up to this number)
init_from          "" | pretrain workdir | checkpoint step dir | Hugging Face model dir
model              `jaxformer.config.ModelConfig` fields
objective          name ("clm", "mlm", "seq2seq", "classify", "sft") + options
data               source, lengths, batch_size, packing, framing, tokenizer (see data.pipeline;
                   the data task follows objective.name)
optimizer          AdamW + schedule (see train.optim)
checkpoint         every_steps, keep, best_metric, async_save
eval               every_steps, num_batches, split
mesh               data / fsdp / tensor sizes (-1 fills)
parallel           "jit" (sharded over the mesh), "shard_map" or "pmap" (data parallel, replicated
                   state; see `jaxformer.parallel`)
module_api         "linen" (`jaxformer.models`) or "nnx" (`jaxformer.nnx`): same parameters, same
                   computation; checkpoints of either load into the other
log_every_steps    metrics.jsonl / TensorBoard cadence
nonfinite          "stop" at the first non-finite loss or grad norm, or "skip" (leave the update out)
nonfinite_limit    with "skip": stop after this many non-finite steps in a row
progress_bar       show a tqdm bar
=================  ==============================================================================
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import sys
import typing
from typing import Any

import ml_collections

from jaxformer.config import ModelConfig
from jaxformer.objectives import OPTION_DEFAULTS, check_objective
from jaxformer.train.nonfinite import POLICIES
from jaxformer.train.schedules import make_schedule

TOP_LEVEL_KEYS = ("seed", "num_train_steps", "init_from", "model", "objective", "data", "optimizer",
                  "checkpoint", "eval", "mesh", "parallel", "module_api", "log_every_steps",
                  "progress_bar", "name", "nonfinite", "nonfinite_limit")
PARALLEL_MODES = ("jit", "shard_map", "pmap")  # see jaxformer.parallel: which to use and why
MODULE_APIS = ("linen", "nnx")


def model_defaults() -> ml_collections.ConfigDict:
    """``config.model`` declaring every `ModelConfig` field at its default, so that
    ``--config.model.<field>=…`` can set any of them; fields derived when None (``head_dim``,
    ``num_kv_heads``, …) are typed placeholders. Configs fill it with
    ``c.model.update(preset(...))``, which keeps the declarations and their types."""
    hints = typing.get_type_hints(ModelConfig)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(ModelConfig):
        kind = next(t for t in (typing.get_args(hints[f.name]) or (hints[f.name],))
                    if t is not type(None))
        out[f.name] = ml_collections.config_dict.placeholder(kind) if f.default is None else f.default
    return ml_collections.ConfigDict(out)


def base_config() -> ml_collections.ConfigDict:
    """All keys with defaults; configs override them."""
    from jaxformer.data.pipeline import default_data_config
    from jaxformer.train.optim import default_optimizer_config

    c = ml_collections.ConfigDict()
    c.name = "run"
    c.seed = 0
    c.num_train_steps = 1000
    c.init_from = ""
    c.model = model_defaults()
    c.objective = ml_collections.ConfigDict(dict(
        name="clm", label_smoothing=0.0, z_loss=0.0, decoder_start_id=0, **OPTION_DEFAULTS))
    c.data = default_data_config()
    c.optimizer = default_optimizer_config()
    c.checkpoint = ml_collections.ConfigDict(dict(every_steps=500, keep=3, best_metric="",
                                                  best_mode="min", async_save=True))
    c.eval = ml_collections.ConfigDict(dict(every_steps=500, num_batches=20, split="validation"))
    c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
    c.parallel = "jit"
    c.module_api = "linen"
    c.log_every_steps = 50
    c.nonfinite = "stop"
    c.nonfinite_limit = 10
    c.progress_bar = True
    return c


def config_node(config: ml_collections.ConfigDict, dotted: str) -> tuple[Any, str]:
    """(parent, leaf name) of the existing key ``dotted = "a.b.c"``; KeyError naming the first
    missing part (overrides change keys, never add them)."""
    parts = dotted.split(".")
    node: Any = config
    for i, part in enumerate(parts):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            where = ".".join(parts[:i]) or "the config"
            close = difflib.get_close_matches(part, list(node.keys()) if isinstance(
                node, ml_collections.ConfigDict) else [], n=1)
            hint = f"; did you mean {'.'.join([*parts[:i], close[0]])!r}?" if close else ""
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


def define_config_flag(name: str = "config", flag_values: Any = None,
                       sys_argv: list[str] | None = None) -> Any:
    """``config_flags.DEFINE_config_file`` whose loaded config is `complete_config`-ed before the
    command-line overrides (``--config.model.num_layers=2``) are applied, then locked."""
    from absl import flags
    from ml_collections import config_flags

    class _CompletingParser(flags.ArgumentParser):
        def __init__(self, inner: flags.ArgumentParser):
            self.inner = inner  # ml_collections' own parser: loads the file, calls get_config()

        def parse(self, path):
            if not os.path.isfile(path.split(":", 1)[0]):
                raise ValueError(f"config file {path.split(':', 1)[0]!r} does not exist")
            config = self.inner.parse(path)
            if isinstance(config, ml_collections.ConfigDict):
                complete_config(config)
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
    flag_values[name].parser = _CompletingParser(flag_values[name].parser)
    return holder


def validate_config(config: ml_collections.ConfigDict) -> ModelConfig:
    """Check the whole config up front; returns the validated ModelConfig.

    Raises ValueError naming the offending field.
    """
    unknown = sorted(set(config.keys()) - set(TOP_LEVEL_KEYS))
    if unknown:
        raise ValueError(f"unknown top-level config keys {unknown}; valid keys are {TOP_LEVEL_KEYS}")
    model_cfg = ModelConfig.from_dict(config.model)
    if not isinstance(config.num_train_steps, int) or config.num_train_steps <= 0:
        raise ValueError(f"num_train_steps={config.num_train_steps!r} must be a positive integer")
    if config.parallel not in PARALLEL_MODES:
        raise ValueError(f"parallel={config.parallel!r} must be one of {PARALLEL_MODES}")
    if config.get("module_api", "linen") not in MODULE_APIS:
        raise ValueError(f"module_api={config.module_api!r} is invalid: choose one of {MODULE_APIS}")
    sharded = {a: config.mesh.get(a, 1) for a in ("fsdp", "tensor") if config.mesh.get(a, 1) != 1}
    if config.parallel != "jit" and sharded:
        raise ValueError(f"parallel={config.parallel!r} is data parallel only (replicated state), "
                         f"so {', '.join(f'mesh.{a}={v}' for a, v in sharded.items())} would be "
                         "ignored; use parallel='jit' for FSDP / tensor parallelism")
    if config.nonfinite not in POLICIES or config.nonfinite_limit < 1:
        raise ValueError(f"nonfinite={config.nonfinite!r} must be one of {POLICIES} and "
                         f"nonfinite_limit={config.nonfinite_limit} at least 1")
    for key in ("every_steps", "keep"):
        if config.checkpoint[key] <= 0:
            raise ValueError(f"checkpoint.{key}={config.checkpoint[key]} must be positive")
    if config.eval.every_steps <= 0 or config.eval.num_batches < 0:
        raise ValueError("eval.every_steps must be positive and eval.num_batches >= 0")
    check_objective(config.objective)
    make_schedule(config.optimizer, model_cfg.d_model, config.num_train_steps)  # its errors name
    # the optimizer field; checked here, before the tokenizer is trained or any data is read
    _check_data(config, model_cfg)
    accum = config.optimizer.get("grad_accum_steps", 1)
    if config.data.batch_size % accum:
        raise ValueError(f"data.batch_size={config.data.batch_size} must be divisible by "
                         f"optimizer.grad_accum_steps={accum}")
    return model_cfg


def _check_data(config: ml_collections.ConfigDict, model_cfg: ModelConfig) -> None:
    """The data section, and how it fits the model: row lengths within a learned position table,
    string labels within the classifier's classes."""
    from jaxformer.data.pipeline import check_data_config
    from jaxformer.data.sources import list_option

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
    tok = data.tokenizer
    if not tok.get("path") and not config.init_from and tok.vocab_size > model_cfg.vocab_size:
        raise ValueError(f"data.tokenizer.vocab_size={tok.vocab_size} exceeds model.vocab_size="
                         f"{model_cfg.vocab_size}: the tokenizer to be trained would emit ids the "
                         "model has no embedding for")
    names = list_option(data, "label_names")
    if names and model_cfg.head == "classify" and len(names) > model_cfg.num_classes:
        raise ValueError(f"data.label_names has {len(names)} labels {names} but model.num_classes="
                         f"{model_cfg.num_classes}; set model.num_classes={len(names)}")


# ModelConfig fields a resumed run may change: they neither shape the parameters nor change the
# function the parameters compute (only how it is computed, or the training noise).
RESUMABLE_MODEL_FIELDS = ("dropout_rate", "attention_dropout_rate", "ffn_dropout_rate",
                          "target_token_dropout_rate", "dtype", "remat_policy", "attention_impl",
                          "attention_chunk_size", "init_std", "embed_init_std")


def check_resume(saved: dict, config: ml_collections.ConfigDict) -> list[str]:
    """Compare the ``config.json`` a workdir's checkpoints were written with to the current config.

    Raises ValueError naming the fields when the model architecture or the tokenizer settings
    differ (the checkpoint could not be restored, or would be read with other token ids); returns a
    note for every other changed key (e.g. ``num_train_steps``: the schedule is stretched).
    """
    def flat(tree: Any, prefix: str = "") -> dict[str, Any]:
        if not isinstance(tree, dict):
            return {prefix[:-1]: tree}
        return {k: v for key, sub in tree.items() for k, v in flat(sub, f"{prefix}{key}.").items()}

    import json

    current = json.loads(json.dumps(config.to_dict(), default=str))  # as config.json stores it
    now, before = flat(current), flat(saved)
    old_model, new_model = (dataclasses.asdict(ModelConfig.from_dict(c["model"]))
                            for c in (saved, current))
    changed = [k for k in sorted(set(now) | set(before))
               if not k.startswith("model.") and before.get(k) != now.get(k)]
    fixed = [f"model.{k}: {old_model[k]!r} -> {new_model[k]!r}" for k in old_model
             if k not in RESUMABLE_MODEL_FIELDS and old_model[k] != new_model[k]]
    fixed += [f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in changed
              if k.startswith("data.tokenizer.")]
    if fixed:
        raise ValueError("this workdir holds checkpoints of a different model or tokenizer; "
                         f"changed: {'; '.join(fixed)}. Use a new --workdir (or "
                         "--config.init_from=<this workdir> to fine-tune from it)")
    notes = [f"model.{k}: {old_model[k]!r} -> {new_model[k]!r}" for k in RESUMABLE_MODEL_FIELDS
             if old_model[k] != new_model[k]]
    for k in changed:
        note = f"{k}: {before.get(k)!r} -> {now.get(k)!r}"
        if k == "num_train_steps":
            note += (" (the learning-rate schedule is recomputed for the new length, so it differs "
                     "from the one trained so far)")
        notes.append(note)
    return notes
