"""Validating a training config before anything is read or compiled: each key alone, then the rules
between keys and sections.

`validate_config` (and `check_config`, which the trainer runs on the config resolved against its
``init_from``) first checks every key against the schema (`jaxformer.train.config.schema
.check_schema`: unknown keys, types, each setting's own check), then the cross-field rules: the
model (`ModelConfig`), the objective and its options against the model, the data against the
model, distillation, in-training generation, the mesh and the optimizer. Every error is a
``ValueError`` naming the key, its value and what would be right.

Three things are configs; the code names them apart: ``config`` is this training config (an
``ml_collections.ConfigDict``), ``model_cfg`` the `jaxformer.config.ModelConfig` read from its
``model`` section, ``run_config`` the training config a run saved (``<workdir>/config.json``, a
plain dict), and ``hf_config`` a Hugging Face model's ``config.json``.
"""

from __future__ import annotations

import copy

import ml_collections
import optax

from jaxformer.config import ModelConfig
from jaxformer.data.pipeline import DataSettings
from jaxformer.evaluation.decoding import check_generation
from jaxformer.objectives import check_objective, get_objective
from jaxformer.objectives.cloze import check_cloze_config, predicts_labels
from jaxformer.objectives.dpo import check_dpo_model
from jaxformer.objectives.mlm import MLMOptions
from jaxformer.objectives.plm import check_plm_model
from jaxformer.objectives.prefix_lm import check_prefix_lm_model
from jaxformer.objectives.scheduled_sampling import check_scheduled_sampling
from jaxformer.ops.kernel_choice import check_backend
from jaxformer.settings import read
from jaxformer.train.config.schema import TrainSettings, check_schema, train_settings
from jaxformer.train.distill_config import check_distill
from jaxformer.train.inputs import inputs_of
from jaxformer.train.optim import make_optimizer


def with_derived_model_fields(config: ml_collections.ConfigDict,
                              label_names: tuple[str, ...] | None) -> ml_collections.ConfigDict:
    """``config``, or a copy of it with ``model.num_classes = len(label_names)`` (its
    ``data.label_names``, as the sources' section reads them) when it classifies
    (``objective.name``), names its labels and leaves ``model.num_classes`` unset (a stated value is
    kept: `check_config` refuses one smaller than the labels)."""
    if (not label_names or config.model.num_classes is not None
            or get_objective(config.objective.name).data_task != "classify"):
        return config
    derived = copy.deepcopy(config)
    with derived.unlocked():
        derived.model.num_classes = len(label_names)
    return derived


def validate_config(config: ml_collections.ConfigDict) -> ModelConfig:
    """Check the whole config up front (its derived fields filled, `with_derived_model_fields`);
    returns the validated ModelConfig.

    Raises ValueError naming the offending field.
    """
    check_schema(config)
    config = with_derived_model_fields(config, read(DataSettings, config.data).label_names)
    model_cfg = ModelConfig.from_dict(config.model)
    check_config(config, model_cfg)
    return model_cfg


def check_config(config: ml_collections.ConfigDict, model_cfg: ModelConfig, *,
                 resolved: bool = False
                 ) -> tuple[TrainSettings, optax.GradientTransformation, optax.Schedule]:
    """Check ``config`` for ``model_cfg`` (ValueError naming the field), before the tokenizer is
    trained or any data is read; returns its `TrainSettings` (built once the keys are checked
    each alone), the optimizer and its schedule (built on the way: their errors name the
    ``optimizer`` field). ``resolved``: ``config`` was resolved against its ``init_from``
    (`jaxformer.train.setup.resolve_config`), so a tokenizer it names no path for is one to be
    trained."""
    check_schema(config)  # each key alone; the rules between keys follow, on the typed sections
    settings = train_settings(config, model_cfg)
    mesh = settings.mesh
    sharded = {a: getattr(mesh, a) for a in ("fsdp", "expert", "context", "tensor")
               if getattr(mesh, a) != 1}
    if settings.parallel != "jit" and sharded:
        raise ValueError(f"parallel={settings.parallel!r} is data parallel only (replicated state), "
                         f"so {', '.join(f'mesh.{a}={v}' for a, v in sharded.items())} would be "
                         "ignored; use parallel='jit' for FSDP / expert / context / tensor "
                         "parallelism")
    check_context_parallel(settings, model_cfg)
    check_expert_parallel(mesh.expert, model_cfg)
    name, options = check_objective(config.objective), settings.objective_options
    if name == "plm":
        check_plm_model(options, model_cfg)
    if name == "prefix_lm":
        check_prefix_lm_model(model_cfg)
    if name == "cloze":
        check_cloze_config(options, settings.data.framing or "", model_cfg)
    if name in ("dpo", "dpo_seq2seq"):
        check_dpo_model(name, model_cfg)
    check_scheduled_sampling(options)
    check_distill(settings, config.get("distill"))
    check_generation(settings, model_cfg)
    check_backend(model_cfg.attention_kernel)  # e.g. cudnn without a CUDA GPU, before compiling
    tx, schedule = make_optimizer(settings.optimizer, model_cfg.d_model, settings.num_train_steps)
    if settings.optimizer.lora.rank and (not settings.init_from or settings.parallel != "jit"):
        raise ValueError("optimizer.lora.rank > 0 adapts the weights of init_from (set it) and "
                         f"trains with parallel='jit' (got {settings.parallel!r})")
    _check_data(config, settings, resolved)
    accum = settings.optimizer.grad_accum_steps
    if settings.data.batch_size % accum:
        raise ValueError(f"data.batch_size={settings.data.batch_size} must be divisible by "
                         f"optimizer.grad_accum_steps={accum}")
    return settings, tx, schedule


def check_expert_parallel(expert: int, model_cfg: ModelConfig) -> None:
    """``mesh.expert > 1`` (`jaxformer.parallel.rules`: experts split over it): an MoE model whose
    experts it divides, on the capacity path (the dropless path's sort runs over a device's own
    tokens only), refused naming the fields otherwise."""
    if expert == 1:
        return
    if not model_cfg.num_experts:
        raise ValueError(f"mesh.expert={expert} splits MoE experts, but model.num_experts=0 (a "
                         "dense model): use mesh.data for data parallelism")
    if model_cfg.num_experts % expert:
        raise ValueError(f"mesh.expert={expert} must divide model.num_experts="
                         f"{model_cfg.num_experts}")
    if model_cfg.moe_dropless:
        raise ValueError(f"model.moe_dropless=True with mesh.expert={expert} is not supported "
                         "(grouped matmuls over one device's tokens): set moe_dropless=False "
                         "(capacity_factor) or mesh.expert=1")


def check_context_parallel(settings: TrainSettings, model_cfg: ModelConfig) -> None:
    """``mesh.context > 1`` (`jaxformer.parallel.context`): what ring attention cannot run,
    refused naming the field, before compilation."""
    n = settings.mesh.context
    if n == 1:
        return
    name = f"mesh.context={n}"
    if model_cfg.attention_impl not in ("xla", "chunked", "auto"):  # auto: ring attention runs
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
    lengths = {"seq_len": settings.data.seq_len}
    if model_cfg.family == "encoder_decoder":
        lengths["target_len"] = settings.data.target_len
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


def position_lengths(data: DataSettings | ml_collections.ConfigDict, model_cfg: ModelConfig
                     ) -> dict[str, int]:
    """The row lengths of ``data`` that index a learned position table of ``model_cfg``
    (``{"seq_len": …}``, and ``target_len`` for an encoder-decoder); {} for other positions."""
    if model_cfg.position != "learned":
        return {}
    lengths = {"seq_len": data.seq_len}
    if model_cfg.family == "encoder_decoder":
        lengths["target_len"] = data.target_len
    return lengths


def _check_data(config: ml_collections.ConfigDict, settings: TrainSettings, resolved: bool) -> None:
    """The data section, and how it fits the model: row lengths within a learned position table,
    string labels within the classifier's classes, a tokenizer to be trained within the vocabulary
    (one read from a file is checked when it is read)."""
    data, model_cfg = settings.data, settings.model
    objective = settings.objective_spec
    legacy = config.data.task if "task" in config.data else None  # LEGACY_KEYS: not in DataSettings
    if legacy is not None and legacy != objective.data_task:
        raise ValueError(f"data.task={legacy!r} does not fit objective.name={objective.name!r}, "
                         f"whose data task is {objective.data_task!r}; remove data.task (it is "
                         "derived from objective.name)")
    inputs = inputs_of(model_cfg)  # text or images (`jaxformer.train.inputs`)
    inputs.check_data(data, objective)
    _check_label_names(data, settings)
    if not inputs.needs_tokenizer:  # the rest checks text rows and their tokenizer
        return
    for key, n in position_lengths(data, model_cfg).items():  # init_from's table: resolve_config
        if n > model_cfg.max_len:  # has fitted the lengths to it (it cannot grow)
            raise ValueError(f"data.{key}={n} exceeds model.max_len={model_cfg.max_len}, the "
                             f"learned position table; lower data.{key} or raise model.max_len")
    options = settings.objective_options
    pairs = options.sentence_pairs if isinstance(options, MLMOptions) else "none"
    if pairs != "none" and (not model_cfg.nsp_head or model_cfg.type_vocab_size < 2):
        raise ValueError(f"objective.sentence_pairs={pairs!r} trains on [CLS] A [SEP] B [SEP] rows "
                         f"with a pair label: set model.nsp_head=True (got {model_cfg.nsp_head}) "
                         f"and model.type_vocab_size=2 (got {model_cfg.type_vocab_size})")
    tok = data.tokenizer
    if not tok.path and (resolved or not settings.init_from):  # else init_from's may be used
        check_vocabulary(tok.vocab_size, model_cfg, f"data.tokenizer.vocab_size={tok.vocab_size}")


def _check_label_names(data: DataSettings, settings: TrainSettings) -> None:
    """String labels within the classifier's classes."""
    model_cfg, names = settings.model, data.label_names
    if (names and predicts_labels(model_cfg, settings.objective.name)
            and len(names) > model_cfg.num_classes):
        raise ValueError(f"data.label_names has {len(names)} labels {names} but model.num_classes="
                         f"{model_cfg.num_classes}; set model.num_classes={len(names)}")
