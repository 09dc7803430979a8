"""ALBERT (Lan et al. 2019) ↔ jaxformer ``family="encoder"`` with ``embedding_size`` (the factorised
embedding) and ``share_layers`` (one block for every layer).

HF names (prefixed with ``albert.`` except in ``AlbertModel``): ``embeddings.{word,position,
token_type}_embeddings`` (E wide) + ``embeddings.LayerNorm`` (E); ``encoder.embedding_hidden_mapping_in``
(E → d_model, our ``embed/projection``); ``encoder.albert_layer_groups.{g}.albert_layers.0.`` with
``attention.{query,key,value,dense,LayerNorm}``, ``ffn``, ``ffn_output`` and
``full_layer_layer_norm`` (post-LN); ``pooler`` (+tanh). Heads: ``predictions.{dense,LayerNorm,bias}``
(MLM: d_model → E, decoder tied to the word embeddings), ``sop_classifier.classifier``
(sentence-order prediction: our ``nsp_head``), ``classifier``. One group (``num_hidden_groups=1``)
is ``share_layers=True``; one group per layer is an unshared stack; ``inner_group_num`` must be 1.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from jaxformer.config import ModelConfig
from jaxformer.convert import hf_bert
from jaxformer.convert.mapping import (
    TO_HF_ACTIVATIONS,
    Rule,
    copy,
    dense,
    from_hf_activation,
    is_tied,
    labels_config,
    layer_norm,
    leftover_rule,
    linear,
    num_labels,
    require,
)

MODEL_TYPE = "albert"
ARCHITECTURE_HEADS = {"AlbertForMaskedLM": "mlm", "AlbertForPreTraining": "mlm",
                      "AlbertForSequenceClassification": "classify",
                      "AlbertForTokenClassification": "token_classify", "AlbertModel": "none"}
HEADS = ("mlm", "classify", "token_classify", "none")
BUFFERS = re.compile(r"(^|\.)embeddings\.(position_ids|token_type_ids)$")
HEAD_TENSORS = re.compile(r"^(predictions|sop_classifier|classifier)\.|(^|\.)pooler\.")
canonical_name = hf_bert.canonical_name  # old TF-converted names: LayerNorm.gamma → .weight


def _pooled_head(cfg: ModelConfig) -> bool:
    """Whether the model has a pooler (`jaxformer.models.spec.model_spec`)."""
    return cfg.pooler and (cfg.head in ("classify", "none") or cfg.nsp_head)


def _head(hf: Mapping, tensors: Mapping, head: str | None) -> str:
    arch = (hf.get("architectures") or [""])[0]
    if head is None:
        if arch in ARCHITECTURE_HEADS:
            head = ARCHITECTURE_HEADS[arch]
        elif "predictions.bias" in tensors:
            head = "mlm"
        elif "classifier.weight" in tensors:
            raise ValueError(f"cannot tell sequence from token classification for architecture "
                             f"{arch!r}; pass head='classify' or head='token_classify'")
        else:
            head = "none"
    if head not in HEADS:
        raise ValueError(f"head={head!r} is not available for ALBERT; choose one of {HEADS}")
    return head


def config_from_hf(hf: Mapping, tensors: Mapping[str, np.ndarray], *, head: str | None,
                   num_classes: int | None) -> tuple[dict, str]:
    """``config.json`` (+ tensor names, for the heads present) → (ModelConfig kwargs, prefix)."""
    layers, groups = hf.get("num_hidden_layers", 12), hf.get("num_hidden_groups", 1)
    if hf.get("inner_group_num", 1) != 1 or groups not in (1, layers):
        raise ValueError(f"ALBERT num_hidden_groups={groups}, inner_group_num="
                         f"{hf.get('inner_group_num')} is not supported: one group shared by all "
                         f"layers (1) or one per layer ({layers}), each of one layer")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"ALBERT position_embedding_type={hf['position_embedding_type']!r} is "
                         "not supported; only 'absolute'")
    prefix = "albert." if any(k.startswith("albert.") for k in tensors) else ""
    head = _head(hf, tensors, head)
    sop = head == "mlm" and "sop_classifier.classifier.weight" in tensors
    has_pooler = f"{prefix}pooler.weight" in tensors
    cfg = dict(
        family="encoder", vocab_size=hf["vocab_size"], embedding_size=hf.get("embedding_size", 128),
        d_model=hf["hidden_size"], num_heads=hf["num_attention_heads"],
        d_ff=hf["intermediate_size"], num_layers=layers, share_layers=groups == 1,
        max_len=hf.get("max_position_embeddings", 512), position="learned", norm="layer",
        norm_position="post", norm_eps=hf.get("layer_norm_eps", 1e-12), embedding_norm=True,
        activation=from_hf_activation(hf.get("hidden_act", "gelu_new"), "hidden_act"),
        use_bias=True, type_vocab_size=hf.get("type_vocab_size", 2), head=head, mlm_transform=True,
        lm_head_bias=True, nsp_head=sop,
        pooler=head == "classify" or sop or (head == "none" and has_pooler), pooling="first",
        tie_embeddings=is_tied(tensors, "predictions.decoder.weight",
                               f"{prefix}embeddings.word_embeddings.weight"),
        num_classes=num_labels(hf, num_classes), dropout_rate=hf.get("hidden_dropout_prob", 0.0),
        attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.0),
        init_scheme="bert", init_std=hf.get("initializer_range", 0.02))
    return cfg, prefix


def _block(b: str, t: str, cfg: ModelConfig) -> list[Rule]:
    """One post-LN layer: our block ``b`` ↔ HF ``t`` (``…albert_layers.0.``)."""
    d, h, dh, f = cfg.d_model, cfg.num_heads, cfg.head_dim, cfg.d_ff
    out = []
    for name in ("query", "key", "value"):
        out += dense(f"{b}self_attn/{name}", f"{t}attention.{name}", (d,), (h, dh))
    return [*out, *dense(f"{b}self_attn/out", f"{t}attention.dense", (h, dh), (d,)),
            *layer_norm(f"{b}self_attn_norm", f"{t}attention.LayerNorm", d),
            *dense(f"{b}ffn/wi", f"{t}ffn", (d,), (f,)),
            *dense(f"{b}ffn/wo", f"{t}ffn_output", (f,), (d,)),
            *layer_norm(f"{b}ffn_norm", f"{t}full_layer_layer_norm", d)]


def _untied_bias(v: int) -> Rule:
    """An untied decoder's bias: read from ``predictions.decoder.bias``, written to it and to the
    unused ``predictions.bias``."""
    return Rule(("mlm_head/decoder/bias",), ("predictions.bias", "predictions.decoder.bias"),
                ((v,),), ((v,), (v,)), lambda _, b: (b,), lambda b: (b, b))


def rules(cfg: ModelConfig, prefix: str, *, export: bool = False) -> list[Rule]:
    """Rules for every parameter of ``cfg`` (unrolled or shared layout)."""
    d, e, v = cfg.d_model, cfg.embedding_size, cfg.vocab_size
    emb = f"{prefix}embeddings."
    out = [copy("token_embed/embedding", f"{emb}word_embeddings.weight", (v, e)),
           copy("embed/pos_embedding", f"{emb}position_embeddings.weight", (cfg.max_len, e)),
           copy("embed/type_embedding", f"{emb}token_type_embeddings.weight",
                (cfg.type_vocab_size, e)),
           *layer_norm("embed/norm", f"{emb}LayerNorm", e),
           *dense("embed/projection", f"{prefix}encoder.embedding_hidden_mapping_in", (e,), (d,))]
    blocks = ["shared"] if cfg.share_layers else [f"layer_{i}" for i in range(cfg.num_layers)]
    for g, name in enumerate(blocks):
        out += _block(f"encoder/{name}/", f"{prefix}encoder.albert_layer_groups.{g}.albert_layers.0.",
                      cfg)
    if _pooled_head(cfg):
        out += dense("pooler", f"{prefix}pooler", (d,), (d,))
    if cfg.head == "mlm":
        out += [*dense("mlm_head/dense", "predictions.dense", (d,), (e,)),
                *layer_norm("mlm_head/norm", "predictions.LayerNorm", e)]
        if cfg.tie_embeddings:
            out.append(copy("mlm_head/decoder/bias", "predictions.bias", (v,)))
        else:  # untied, HF adds predictions.decoder.bias (the one its forward pass reads)
            out += [linear("mlm_head/decoder/kernel", "predictions.decoder.weight", (e,), (v,)),
                    _untied_bias(v)]
        if cfg.nsp_head:
            out += dense("nsp_head", "sop_classifier.classifier", (d,), (2,))
    elif cfg.head in ("classify", "token_classify"):
        name = "classifier" if cfg.head == "classify" else "token_classifier"
        out += dense(name, "classifier", (d,), (cfg.num_classes,))
    return out


# What a checkpoint tensor no rule used is: "ignore", "drop" or "unknown" (mapping.leftover_rule).
leftover = leftover_rule(BUFFERS, HEAD_TENSORS,
                         ("predictions.decoder.weight", "predictions.decoder.bias"), "mlm")


def config_to_hf(cfg: ModelConfig) -> tuple[dict, str]:
    """ModelConfig → (``config.json`` dict, tensor-name prefix); ValueError if not ALBERT-shaped."""
    want = dict(family="encoder", position="learned", norm="layer", norm_bias=True,
                norm_position="post", embedding_norm=True, use_bias=True, gated_ffn=False,
                num_kv_heads=cfg.num_heads, head_dim=cfg.d_model // cfg.num_heads,
                attention_scale=None, scale_embeddings=False, pooling="first", position_offset=0,
                activation=tuple(TO_HF_ACTIVATIONS), head=HEADS)
    if cfg.head == "mlm":
        want.update(mlm_transform=True, lm_head_bias=True, rescale_tied_logits=False)
    if cfg.head == "classify" or cfg.nsp_head:
        want.update(pooler=True, pooler_activation="tanh")
    require(cfg, "ALBERT", **want)
    if cfg.embedding_size is None or cfg.type_vocab_size < 1:
        raise ValueError("this model config has no Hugging Face ALBERT equivalent: ALBERT needs "
                         f"embedding_size (got {cfg.embedding_size!r}) and token-type embeddings "
                         f"(type_vocab_size >= 1, got {cfg.type_vocab_size})")
    arch = {"mlm": "AlbertForPreTraining" if cfg.nsp_head else "AlbertForMaskedLM",
            "classify": "AlbertForSequenceClassification",
            "token_classify": "AlbertForTokenClassification", "none": "AlbertModel"}[cfg.head]
    hf = {
        "model_type": MODEL_TYPE, "architectures": [arch], "vocab_size": cfg.vocab_size,
        "embedding_size": cfg.embedding_size, "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.num_layers,
        "num_hidden_groups": 1 if cfg.share_layers else cfg.num_layers, "inner_group_num": 1,
        "num_attention_heads": cfg.num_heads, "intermediate_size": cfg.d_ff,
        "hidden_act": TO_HF_ACTIVATIONS[cfg.activation], "hidden_dropout_prob": cfg.dropout_rate,
        "attention_probs_dropout_prob": cfg.attention_dropout_rate,
        "classifier_dropout_prob": cfg.dropout_rate,
        "max_position_embeddings": cfg.max_len, "type_vocab_size": cfg.type_vocab_size,
        "initializer_range": cfg.init_std, "layer_norm_eps": cfg.norm_eps,
        "position_embedding_type": "absolute", "tie_word_embeddings": cfg.tie_embeddings,
        "pad_token_id": 0, "dtype": "float32",
    }
    if cfg.head in ("classify", "token_classify"):
        hf.update(labels_config(cfg.num_classes))
    return hf, "" if cfg.head == "none" else "albert."
