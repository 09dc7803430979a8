"""BERT (Devlin et al. 2019) ↔ jaxformer ``family="encoder"``.

HF names (prefixed with ``bert.`` except in ``BertModel``): ``embeddings.{word,position,token_type}
_embeddings`` + ``embeddings.LayerNorm``; ``encoder.layer.{i}.attention.self.{query,key,value}``,
``attention.output.{dense,LayerNorm}``, ``intermediate.dense``, ``output.{dense,LayerNorm}``
(post-LN); ``pooler.dense`` (+tanh). Heads: ``cls.predictions.transform.{dense,LayerNorm}`` and
``cls.predictions.bias`` (MLM; decoder tied to the word embeddings), ``cls.seq_relationship``
(NSP), ``classifier`` (sequence / token classification). ``nn.Linear`` weights are `[out, in]`.
Old checkpoints name LayerNorm parameters ``gamma``/``beta``; they are read as ``weight``/``bias``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from jaxformer.config import ModelConfig
from jaxformer.convert.mapping import (
    TO_HF_ACTIVATIONS,
    Rule,
    copy,
    from_hf_activation,
    is_tied,
    labels_config,
    layer_norm,
    leftover_rule,
    linear,
    num_labels,
    require,
    reshape,
)

MODEL_TYPE = "bert"
ARCHITECTURE_HEADS = {"BertForMaskedLM": "mlm", "BertForPreTraining": "mlm",
                      "BertForSequenceClassification": "classify",
                      "BertForTokenClassification": "token_classify",
                      "BertForQuestionAnswering": "span", "BertModel": "none"}
HEADS = ("mlm", "classify", "token_classify", "span", "none")
BUFFERS = re.compile(r"(^|\.)embeddings\.position_ids$|^cls\.predictions\.decoder\.bias$")
HEAD_TENSORS = re.compile(r"^(cls|classifier|qa_outputs)\.|(^|\.)pooler\.")
LEGACY_NAMES = (("LayerNorm.gamma", "LayerNorm.weight"), ("LayerNorm.beta", "LayerNorm.bias"))


def canonical_name(name: str) -> str:
    """Old TF-converted names (``LayerNorm.gamma``) → current ones (``LayerNorm.weight``)."""
    for old, new in LEGACY_NAMES:
        name = name.replace(old, new)
    return name


def _pooled_head(cfg: ModelConfig) -> bool:
    """Whether the model has a pooler (`jaxformer.models.spec.model_spec`)."""
    return cfg.pooler and (cfg.head in ("classify", "none") or cfg.nsp_head)


def config_from_hf(hf: Mapping, tensors: Mapping[str, np.ndarray], *, head: str | None,
                   num_classes: int | None) -> tuple[dict, str]:
    """``config.json`` (+ tensor names, for the heads present) → (ModelConfig kwargs, prefix)."""
    check_variant(hf, "BERT")
    prefix = "bert." if any(k.startswith("bert.") for k in tensors) else ""
    arch = (hf.get("architectures") or [""])[0]
    if head is None:
        if arch in ARCHITECTURE_HEADS:
            head = ARCHITECTURE_HEADS[arch]
        elif "cls.predictions.bias" in tensors:
            head = "mlm"
        elif "classifier.weight" in tensors:
            raise ValueError(f"cannot tell sequence from token classification for architecture "
                             f"{arch!r}; pass head='classify' or head='token_classify'")
        else:
            head = "none"
    if head not in HEADS:
        raise ValueError(f"head={head!r} is not available for BERT; choose one of {HEADS}")
    # bert-base-* say BertForMaskedLM but also store the NSP head: only BertForPreTraining keeps it.
    nsp = (head == "mlm" and "cls.seq_relationship.weight" in tensors
           and arch != "BertForMaskedLM")
    has_pooler = f"{prefix}pooler.dense.weight" in tensors
    pooler = head == "classify" or nsp or (head == "none" and has_pooler)
    cfg = dict(
        backbone_fields(hf), max_len=hf["max_position_embeddings"],
        type_vocab_size=hf.get("type_vocab_size", 2), head=head, nsp_head=nsp, pooler=pooler,
        tie_embeddings=is_tied(tensors, "cls.predictions.decoder.weight",
                               f"{prefix}embeddings.word_embeddings.weight"),
        num_classes=num_labels(hf, num_classes))
    return cfg, prefix


def backbone_fields(hf: Mapping) -> dict:
    """The ModelConfig fields of a BERT-style ``config.json`` (BERT, RoBERTa) shared by every
    head: post-LN encoder with an embedding LayerNorm, MLM transform and vocabulary bias."""
    return dict(
        family="encoder", vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
        num_heads=hf["num_attention_heads"], d_ff=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"], position="learned", norm="layer",
        norm_position="post", norm_eps=hf.get("layer_norm_eps", 1e-12), embedding_norm=True,
        activation=from_hf_activation(hf.get("hidden_act", "gelu"), "hidden_act"), use_bias=True,
        mlm_transform=True, lm_head_bias=True, pooling="first",
        dropout_rate=hf.get("hidden_dropout_prob", 0.1),
        attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
        init_scheme="bert", init_std=hf.get("initializer_range", 0.02))


def check_variant(hf: Mapping, arch: str) -> None:
    """ValueError for BERT-style configs jaxformer has no equivalent of."""
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"{arch} position_embedding_type={hf['position_embedding_type']!r} is "
                         "not supported; only 'absolute'")
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise ValueError(f"{arch} as a decoder (is_decoder / add_cross_attention) is not supported")


def dense_rules(param: str, tensor: str, d_in, d_out) -> list[Rule]:
    return [linear(f"{param}/kernel", f"{tensor}.weight", d_in, d_out),
            reshape(f"{param}/bias", f"{tensor}.bias", d_out)]


def backbone_rules(cfg: ModelConfig, prefix: str) -> list[Rule]:
    """Embeddings and encoder layers under ``prefix`` (BERT's names; RoBERTa uses them too)."""
    d, h, dh, f, v = cfg.d_model, cfg.num_heads, cfg.head_dim, cfg.d_ff, cfg.vocab_size
    e = f"{prefix}embeddings."
    out = [copy("token_embed/embedding", f"{e}word_embeddings.weight", (v, d)),
           copy("embed/pos_embedding", f"{e}position_embeddings.weight",
                (cfg.max_len + cfg.position_offset, d)),
           copy("embed/type_embedding", f"{e}token_type_embeddings.weight",
                (cfg.type_vocab_size, d)),
           *layer_norm("embed/norm", f"{e}LayerNorm", d)]
    for i in range(cfg.num_layers):
        b, t = f"encoder/layer_{i}/", f"{prefix}encoder.layer.{i}."
        for name in ("query", "key", "value"):
            out += dense_rules(f"{b}self_attn/{name}", f"{t}attention.self.{name}", (d,), (h, dh))
        out += [*dense_rules(f"{b}self_attn/out", f"{t}attention.output.dense", (h, dh), (d,)),
                *layer_norm(f"{b}self_attn_norm", f"{t}attention.output.LayerNorm", d),
                *dense_rules(f"{b}ffn/wi", f"{t}intermediate.dense", (d,), (f,)),
                *dense_rules(f"{b}ffn/wo", f"{t}output.dense", (f,), (d,)),
                *layer_norm(f"{b}ffn_norm", f"{t}output.LayerNorm", d)]
    return out


def rules(cfg: ModelConfig, prefix: str, *, export: bool = False) -> list[Rule]:
    """Rules for every parameter of ``cfg`` (unrolled layout)."""
    d, v = cfg.d_model, cfg.vocab_size
    out = backbone_rules(cfg, prefix)
    if _pooled_head(cfg):
        out += dense_rules("pooler", f"{prefix}pooler.dense", (d,), (d,))
    if cfg.head == "mlm":
        out += [*dense_rules("mlm_head/dense", "cls.predictions.transform.dense", (d,), (d,)),
                *layer_norm("mlm_head/norm", "cls.predictions.transform.LayerNorm", d),
                copy("mlm_head/decoder/bias", "cls.predictions.bias", (v,))]
        if not cfg.tie_embeddings:
            out.append(linear("mlm_head/decoder/kernel", "cls.predictions.decoder.weight",
                              (d,), (v,)))
        if cfg.nsp_head:
            out += dense_rules("nsp_head", "cls.seq_relationship", (d,), (2,))
    elif cfg.head in ("classify", "token_classify"):
        name = "classifier" if cfg.head == "classify" else "token_classifier"
        out += dense_rules(name, "classifier", (d,), (cfg.num_classes,))
    elif cfg.head == "span":
        out += dense_rules("qa_outputs", "qa_outputs", (d,), (2,))
    return out


# What a checkpoint tensor no rule used is: "ignore", "drop" or "unknown" (mapping.leftover_rule).
leftover = leftover_rule(BUFFERS, HEAD_TENSORS, ("cls.predictions.decoder.weight",), "mlm")


def config_to_hf(cfg: ModelConfig) -> tuple[dict, str]:
    """ModelConfig → (``config.json`` dict, tensor-name prefix); ValueError if not BERT-shaped."""
    want = dict(family="encoder", position="learned", norm="layer", norm_bias=True,
                norm_position="post", embedding_norm=True, use_bias=True, gated_ffn=False,
                num_kv_heads=cfg.num_heads, head_dim=cfg.d_model // cfg.num_heads,
                attention_scale=None, scale_embeddings=False, pooling="first", position_offset=0,
                activation=tuple(TO_HF_ACTIVATIONS), head=HEADS)
    if cfg.head == "mlm":
        want.update(mlm_transform=True, lm_head_bias=True, rescale_tied_logits=False)
    if cfg.head == "classify" or cfg.nsp_head:
        want.update(pooler=True, pooler_activation="tanh")
    require(cfg, "BERT", **want)
    if cfg.type_vocab_size < 1:
        raise ValueError("this model config has no Hugging Face BERT equivalent: "
                         "type_vocab_size=0 (BERT needs token-type embeddings, >= 1)")
    arch = {"mlm": "BertForPreTraining" if cfg.nsp_head else "BertForMaskedLM",
            "classify": "BertForSequenceClassification",
            "token_classify": "BertForTokenClassification", "span": "BertForQuestionAnswering",
            "none": "BertModel"}[cfg.head]
    hf = {
        "model_type": MODEL_TYPE, "architectures": [arch], "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "intermediate_size": cfg.d_ff,
        "hidden_act": TO_HF_ACTIVATIONS[cfg.activation], "hidden_dropout_prob": cfg.dropout_rate,
        "attention_probs_dropout_prob": cfg.attention_dropout_rate,
        "max_position_embeddings": cfg.max_len, "type_vocab_size": cfg.type_vocab_size,
        "initializer_range": cfg.init_std, "layer_norm_eps": cfg.norm_eps,
        "position_embedding_type": "absolute", "tie_word_embeddings": cfg.tie_embeddings,
        "pad_token_id": 0, "dtype": "float32",
    }
    if cfg.head in ("classify", "token_classify"):
        hf.update(labels_config(cfg.num_classes))
    return hf, "" if cfg.head == "none" else "bert."
