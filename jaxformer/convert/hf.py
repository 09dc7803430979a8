"""Import and export Hugging Face GPT-2, BERT, ALBERT, RoBERTa, DistilBERT, T5 / mT5, BART,
Llama / Mistral / Qwen2, Mixtral / Qwen2-MoE, Switch Transformers, ModernBERT and ViT checkpoints.

    cfg_dict, params, tokenizer = load_hf("path/to/hf_model")           # → jaxformer
    save_hf(cfg_dict, params, "path/to/out")                              # → from_pretrained-able

``params`` is the parameter dict exactly as ``build_model(cfg).init(key)`` structures it (host
NumPy float32 arrays; place them with ``jax.device_put``), in the
unrolled (``layer_0 …``) or, with ``scan_layers=True``, the scanned (``layers`` with a leading layer
axis) layout. The per-architecture name/layout rules live in `hf_gpt2`, `hf_bert`, `hf_albert`,
`hf_roberta`, `hf_distilbert`, `hf_t5`, `hf_bart`, `hf_llama`, `hf_mixtral`, `hf_modernbert` and
`hf_vit`.

Tokenizers: ``load_hf`` returns what `jaxformer.convert.hf_io.find_tokenizer` finds (T5's
``spiece.model``; else the Hugging Face tokenizer, read by
`jaxformer.data.fast_tokenizer.FastTokenizer` as ``AutoTokenizer`` reads it; or None);
``save_hf(..., tokenizer=…)`` writes a tokenizer for ``AutoTokenizer`` next to the exported weights
(`jaxformer.convert.hf_tokenizer`), or copies a directory's tokenizer files.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

import jax
import numpy as np

from jaxformer.config import ModelConfig, exported_fields
from jaxformer.convert import (
    hf_albert,
    hf_bart,
    hf_bert,
    hf_distilbert,
    hf_gpt2,
    hf_llama,
    hf_mixtral,
    hf_modernbert,
    hf_qwen2_moe,
    hf_roberta,
    hf_switch,
    hf_t5,
    hf_vit,
)
from jaxformer.convert.hf_io import (
    copy_tokenizer_files,
    find_tokenizer,
    read_config,
    read_tensors,
    write_model,
)
from jaxformer.convert.hf_tokenizer import write_hf_tokenizer
from jaxformer.convert.mapping import (
    Renamed,
    apply_export,
    apply_import,
    flatten,
    stack_layers,
    unflatten,
    unstack_layers,
)
from jaxformer.data.fast_tokenizer import FastTokenizer
from jaxformer.data.tokenizer import Tokenizer
from jaxformer.models import build_model
from jaxformer.models.head_parts import is_head_module
from jaxformer.models.module import Transformer
from jaxformer.models.vocab_padding import fit_vocab

log = logging.getLogger(__name__)
CONVERTERS: dict[str, ModuleType] = {"gpt2": hf_gpt2, "bert": hf_bert, "albert": hf_albert,
                                     "t5": hf_t5, "mt5": hf_t5,  # mT5: T5 v1.1's graph
                                     "roberta": hf_roberta, "distilbert": hf_distilbert,
                                     "bart": hf_bart, **dict.fromkeys(hf_llama.MODEL_TYPES, hf_llama),
                                     "mixtral": hf_mixtral, "qwen2_moe": hf_qwen2_moe,
                                     hf_switch.MODEL_TYPE: hf_switch, "vit": hf_vit,
                                     "modernbert": hf_modernbert}
BY_FAMILY: dict[str, ModuleType] = {"decoder": hf_gpt2, "encoder": hf_bert,
                                    "encoder_decoder": hf_t5}


def export_converter(cfg: ModelConfig) -> ModuleType:
    """The converter a model exports with: by family, and within it by the options only one
    architecture has: ModernBERT for an encoder with RoPE, ALBERT for an encoder with
    ``embedding_size`` or ``share_layers``, RoBERTa
    for one with ``position_offset`` (its padding row), DistilBERT for one without token types;
    Qwen2-MoE for a decoder with RoPE and MoE FFNs with gated shared experts, Mixtral for one
    without shared experts, Llama / Mistral / Qwen2 for one without; BART
    for an encoder-decoder with learned positions (T5's are relative); Switch Transformers for
    one with MoE FFNs; ViT for an encoder of images."""
    if cfg.image_size is not None:  # the Vision Transformer
        return hf_vit
    if cfg.family == "encoder" and cfg.position == "rope":  # ModernBERT
        return hf_modernbert
    if cfg.family == "encoder" and (cfg.embedding_size is not None or cfg.share_layers):
        return hf_albert
    if cfg.family == "encoder" and cfg.position_offset:
        return hf_roberta
    if cfg.family == "encoder" and not cfg.type_vocab_size:
        return hf_distilbert
    if hf_qwen2_moe.is_qwen2_moe(cfg):
        return hf_qwen2_moe
    if hf_mixtral.is_mixtral(cfg):
        return hf_mixtral
    if cfg.family == "decoder" and cfg.position == "rope":
        return hf_llama
    if cfg.family == "encoder_decoder" and cfg.position == "learned":
        return hf_bart
    if cfg.family == "encoder_decoder" and cfg.num_experts:
        return hf_switch
    return BY_FAMILY[cfg.family]
# The ModelConfig fields a Hugging Face config cannot express (`jaxformer.config.exported_fields`:
# HF T5 has one dropout rate, no init scale of ours, no attention implementation): exports store
# them under this config.json key and imports restore them, so export → import gives back the same
# config. Parameters are unaffected.
JAXFORMER_KEY = "jaxformer_config"


def param_shapes(model_cfg: ModelConfig) -> dict[str, jax.ShapeDtypeStruct]:
    """Flat ``{path: ShapeDtypeStruct}`` of ``build_model(model_cfg).init(key)`` (no FLOPs)."""
    return flatten(build_model(model_cfg).abstract())


def _init_subset(model_cfg: ModelConfig, paths: list[str], seed: int) -> dict[str, np.ndarray]:
    """The values ``build_model(model_cfg).init(jax.random.key(seed))`` gives ``paths`` (only those are
    computed: the rest is dead code to XLA)."""
    model = build_model(model_cfg)

    def init(key):
        flat = flatten(model.init(key))
        return {p: flat[p] for p in paths}

    return {p: np.asarray(x) for p, x in jax.jit(init)(jax.random.key(seed)).items()}


def _read_hf(directory: str | os.PathLike, head: str | None, num_classes: int | None
             ) -> tuple[str, ModuleType, Mapping[str, np.ndarray], dict[str, Any], str]:
    """(model_type, its converter, tensors by name (read lazily), ModelConfig fields, tensor name
    prefix)."""
    hf_config = read_config(directory)
    model_type = hf_config["model_type"]
    if model_type not in CONVERTERS:
        raise ValueError(f"model_type={model_type!r} in {directory}/config.json is not supported; "
                         f"supported: {sorted(CONVERTERS)}")
    conv = CONVERTERS[model_type]
    tensors = read_tensors(directory)
    if hasattr(conv, "canonical_name"):
        tensors = Renamed(tensors, conv.canonical_name)
    fields, prefix = conv.config_from_hf(hf_config, tensors, head=head, num_classes=num_classes)
    stored = hf_config.get(JAXFORMER_KEY)
    if isinstance(stored, Mapping):  # our own export: its dropout / init / attention settings
        fields.update({k: stored[k] for k in exported_fields() if k in stored})
    fields = ModelConfig.from_dict(dict(fields, scan_layers=False)).to_dict()
    return model_type, conv, tensors, fields, prefix


def hf_model_config(directory: str | os.PathLike, *, head: str | None = None,
                    num_classes: int | None = None) -> dict[str, Any]:
    """The ModelConfig fields of a local Hugging Face model directory (``head`` and
    ``num_classes`` as in `load_hf`), without reading its weights."""
    return _read_hf(directory, head, num_classes)[3]


def load_hf(directory: str | os.PathLike, *, scan_layers: bool = False, head: str | None = None,
            num_classes: int | None = None, seed: int = 0, vocab_pad_multiple: int = 1
            ) -> tuple[dict[str, Any], dict, str | None]:
    """Read a local Hugging Face directory (a `CONVERTERS` model type).

    Args:
      directory: holds ``config.json`` and ``model.safetensors`` (or sharded safetensors, or
        ``pytorch_model.bin``, which needs torch).
      scan_layers: return the scanned layout (and ``scan_layers=True`` in the config).
      head: jaxformer head to build; default from the checkpoint's architecture (GPT-2 "lm" or
        "none"; BERT "mlm" / "classify" / "token_classify" / "none"; RoBERTa and DistilBERT "mlm" /
        "classify" / "none"; T5 and BART "lm"; Llama "lm" / "classify" / "none"). A head the
        checkpoint lacks (e.g. "classify" on a BertForMaskedLM checkpoint) is initialised as
        ``build_model(model_cfg).init(jax.random.key(seed))`` would; unused checkpoint heads are dropped.
      num_classes: classes of a classification head (default: the checkpoint's ``num_labels``).
      vocab_pad_multiple: pad the vocabulary tables with zero rows to a multiple of this (and set
        it in the config; `jaxformer.models.vocab_padding`): the same function, shapes a
        tensor-parallel mesh divides.

    Returns:
      (ModelConfig fields as a dict, params pytree of NumPy arrays, the tokenizer file or None:
      `jaxformer.convert.hf_io.find_tokenizer`, which `Tokenizer.load` reads).
    """
    model_type, conv, tensors, fields, prefix = _read_hf(directory, head, num_classes)
    model_cfg = ModelConfig.from_dict(fields)
    # Head parameters the checkpoint lacks entirely are initialised below, not read.
    rules = [r for r in conv.rules(model_cfg, prefix)
             if any(t in tensors for t in r.tensors)
             or any(not is_head_module(p) for p in r.params)]
    flat, used = apply_import(rules, tensors)

    leftover = {name: conv.leftover(name, model_cfg) for name in sorted(set(tensors) - used)}
    dropped = [name for name, kind in leftover.items() if kind == "drop"]
    unknown = [name for name, kind in leftover.items() if kind == "unknown"]
    if unknown:
        raise ValueError(f"{len(unknown)} checkpoint tensors have no place in the jaxformer "
                         f"{model_type} model (unsupported variant?): {unknown[:8]}")
    if dropped:
        log.warning("head=%r: dropping checkpoint tensors %s", model_cfg.head, dropped)

    expected = param_shapes(model_cfg)
    for path, x in flat.items():
        if path not in expected or tuple(expected[path].shape) != x.shape:
            want = tuple(expected[path].shape) if path in expected else "no such parameter"
            raise ValueError(f"converted parameter {path!r} has shape {x.shape}; the model "
                             f"expects {want}")
    missing = sorted(set(expected) - set(flat))
    if missing:
        bad = [p for p in missing if not is_head_module(p)]
        if bad:
            raise ValueError(f"the checkpoint does not provide parameters {bad[:8]}")
        log.warning("head=%r: initialising %s (seed %d)", model_cfg.head, missing, seed)
        flat.update(_init_subset(model_cfg, missing, seed))

    padded = model_cfg.replace(scan_layers=scan_layers, vocab_pad_multiple=vocab_pad_multiple)
    params = unflatten(fit_vocab(flat, model_cfg, padded))
    if scan_layers:
        params = stack_layers(params)
    return padded.to_dict(), params, find_tokenizer(directory)


def from_hf(directory: str | os.PathLike, **kwargs) -> Transformer:
    """The NNX model (`jaxformer.models.Transformer`) of a local Hugging Face directory, holding its
    weights; ``kwargs`` as `load_hf` (``scan_layers``, ``head``, ``num_classes``, ``seed``,
    ``vocab_pad_multiple``)."""
    cfg, params, _ = load_hf(directory, **kwargs)
    return Transformer(ModelConfig.from_dict(cfg), params=params)


def _host_params(params: Mapping) -> dict[str, np.ndarray]:
    """Any params pytree (``{"params": ...}`` or bare, scanned or unrolled) → flat unrolled
    ``{path: float32 NumPy array}``."""
    if set(params) == {"params"}:
        params = params["params"]
    params = jax.tree.map(lambda x: np.asarray(jax.device_get(x), np.float32), dict(params))
    return flatten(unstack_layers(_as_dict(params)))


def _as_dict(tree):
    return {k: _as_dict(v) for k, v in tree.items()} if isinstance(tree, Mapping) else tree


def save_hf(model_cfg: ModelConfig | Mapping[str, Any], params: Mapping,
            directory: str | os.PathLike, *,
            tokenizer: str | os.PathLike | Tokenizer | FastTokenizer | None = None,
            framing: tuple[Sequence[int], Sequence[int]] | None = None,
            extra_config: Mapping[str, Any] | None = None) -> None:
    """Write ``config.json`` + ``model.safetensors`` (float32) that ``from_pretrained`` loads:
    GPT2LMHeadModel / GPT2Model, BertForMaskedLM / BertForPreTraining /
    BertForSequenceClassification / BertForTokenClassification / BertModel, the Albert twins of
    these (encoders with ``embedding_size`` or ``share_layers``), T5ForConditionalGeneration,
    the RoBERTa / DistilBERT MaskedLM, SequenceClassification and Model classes,
    BartForConditionalGeneration, or {Llama,Mistral,Qwen2}ForCausalLM / ForSequenceClassification /
    Model (decoders with RoPE, `hf_llama.model_type_of`), ViTForImageClassification / ViTModel
    (encoders of images), chosen by `export_converter` and
    ``head``.

    ``tokenizer``: a tokenizer (`Tokenizer.load`'s), or a file it reads (a SentencePiece model, a
    run's stored Hugging Face tokenizer), written as ``tokenizer.json`` + ``tokenizer_config.json``
    (and a SentencePiece model as ``spiece.model``) with the post-processor ``framing`` (the ids
    before and after a text; `jaxformer.convert.hf_tokenizer.write_hf_tokenizer`); or a directory
    whose Hugging Face tokenizer files are copied as they are.
    ``extra_config``: further ``config.json`` entries, e.g. the source model's (token ids, label
    names); the architecture entries derived from ``model_cfg`` take precedence, and the converter's
    ``TOKEN_IDS`` (BART's) fill in the token ids ``extra_config`` leaves out. The settings HF
    configs cannot express (dropout rates per sub-layer, init scales, attention implementation) go
    under ``config.json``'s ``"jaxformer_config"``, which `load_hf` reads back. ValueError for
    configs with no HF equivalent or params that do not match the config.
    """
    cfg = model_cfg if isinstance(model_cfg, ModelConfig) else ModelConfig.from_dict(model_cfg)
    conv = export_converter(cfg)
    hf_config, prefix = conv.config_to_hf(cfg)
    if conv is hf_t5:  # an mT5 stays one
        hf_config = hf_t5.keep_source_type(hf_config, (extra_config or {}).get("model_type"), cfg)
    flat = fit_vocab(_host_params(params), cfg, cfg.replace(vocab_pad_multiple=1))  # unpadded
    if cfg.permutation_lm:  # XLNet's query-stream table trains the GPT; the export is the GPT
        flat = {k: v for k, v in flat.items() if not k.startswith("jump_embed/")}
    tensors, used = apply_export(conv.rules(cfg, prefix, export=True), flat)
    unused = sorted(set(flat) - used)
    if unused:
        raise ValueError(f"parameters with no place in the Hugging Face {hf_config['model_type']} "
                         f"model: {unused[:8]}")
    extra = {k: v for k, v in (extra_config or {}).items() if k not in ("torch_dtype", "dtype")}
    if len(extra.get("id2label") or {}) == cfg.num_classes:  # keep the source's label names
        hf_config.update({k: extra[k] for k in ("id2label", "label2id") if k in extra})
    hf_config[JAXFORMER_KEY] = {k: getattr(cfg, k) for k in exported_fields()}
    # The converter's token ids (BART's pad / bos / eos / decoder start) unless the source's say else
    defaults = getattr(conv, "TOKEN_IDS", {})
    write_model(directory, {**defaults, **extra, **hf_config}, tensors)
    if isinstance(tokenizer, (str, os.PathLike)) and os.path.isdir(tokenizer):
        copy_tokenizer_files(tokenizer, directory)  # an imported model's own files
    elif tokenizer is not None:
        if isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = Tokenizer.load(tokenizer)
        write_hf_tokenizer(tokenizer, directory, framing)
