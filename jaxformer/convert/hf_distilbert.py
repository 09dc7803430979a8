"""DistilBERT (Sanh et al. 2019) ↔ jaxformer ``family="encoder"`` without token types.

HF names (prefixed with ``distilbert.`` except in ``DistilBertModel``):
``embeddings.{word,position}_embeddings`` + ``embeddings.LayerNorm``;
``transformer.layer.{i}.attention.{q,k,v,out}_lin``, ``sa_layer_norm``, ``ffn.lin{1,2}``,
``output_layer_norm`` (post-LN, every LayerNorm at eps 1e-12, fixed in HF). No token types and no
pooler. Heads: ``vocab_transform`` → activation → ``vocab_layer_norm`` → ``vocab_projector``
(tied to the word embeddings, with a bias) for MLM; ``pre_classifier`` → ReLU → ``classifier`` on
the first token for sequence classification (our ``pooler`` with ``pooler_activation="relu"``,
then ``classifier``); ``classifier`` on every token (token classification) and ``qa_outputs``
(extractive QA, ``head="span"``). Checkpoints with ``sinusoidal_pos_embds`` store their fixed table in
``position_embeddings``: it is imported as a learned table (same function; fine-tuning may change
it, which HF's frozen table would not).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from jaxformer.config import ModelConfig
from jaxformer.convert.hf_bert import dense_rules
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
    pick_head,
    require,
)

MODEL_TYPE = "distilbert"
ARCHITECTURE_HEADS = {"DistilBertForMaskedLM": "mlm",
                      "DistilBertForSequenceClassification": "classify",
                      "DistilBertForTokenClassification": "token_classify",
                      "DistilBertForQuestionAnswering": "span", "DistilBertModel": "none"}
HEADS = ("mlm", "classify", "token_classify", "span", "none")
# a config.json naming no architecture: the head of the first of these tensors present
HEAD_BY_TENSOR = (("vocab_projector.bias", "mlm"), ("pre_classifier.weight", "classify"),
                        ("qa_outputs.weight", "span"), ("classifier.weight", "token_classify"))
NORM_EPS = 1e-12  # HF DistilBERT's LayerNorms: not a config entry
BUFFERS = re.compile(r"(^|\.)embeddings\.position_ids$")
HEAD_TENSORS = re.compile(r"^(vocab_transform|vocab_layer_norm|vocab_projector|pre_classifier|"
                          r"classifier|qa_outputs)\.")


def config_from_hf(hf: Mapping, tensors: Mapping[str, np.ndarray], *, head: str | None,
                   num_classes: int | None) -> tuple[dict, str]:
    """``config.json`` (+ tensor names, for the heads present) → (ModelConfig kwargs, prefix)."""
    head = pick_head(hf, tensors, head, model="DistilBERT", architecture_heads=ARCHITECTURE_HEADS,
                     heads=HEADS, by_tensor=HEAD_BY_TENSOR)
    prefix = "distilbert." if any(k.startswith("distilbert.") for k in tensors) else ""
    cfg = dict(
        family="encoder", vocab_size=hf["vocab_size"], d_model=hf["dim"], num_heads=hf["n_heads"],
        d_ff=hf["hidden_dim"], num_layers=hf["n_layers"], max_len=hf["max_position_embeddings"],
        position="learned", norm="layer", norm_position="post", norm_eps=NORM_EPS,
        embedding_norm=True, activation=from_hf_activation(hf.get("activation", "gelu"),
                                                           "activation"),
        use_bias=True, type_vocab_size=0, head=head, mlm_transform=True, lm_head_bias=True,
        pooler=head == "classify", pooler_activation="relu", pooling="first",
        tie_embeddings=is_tied(tensors, "vocab_projector.weight",
                               f"{prefix}embeddings.word_embeddings.weight"),
        num_classes=num_labels(hf, num_classes), dropout_rate=hf.get("dropout", 0.1),
        attention_dropout_rate=hf.get("attention_dropout", 0.1), init_scheme="bert",
        init_std=hf.get("initializer_range", 0.02))
    return cfg, prefix


def rules(cfg: ModelConfig, prefix: str, *, export: bool = False) -> list[Rule]:
    """Rules for every parameter of ``cfg`` (unrolled layout)."""
    d, h, dh, f, v = cfg.d_model, cfg.num_heads, cfg.head_dim, cfg.d_ff, cfg.vocab_size
    e = f"{prefix}embeddings."
    out = [copy("token_embed/embedding", f"{e}word_embeddings.weight", (v, d)),
           copy("embed/pos_embedding", f"{e}position_embeddings.weight", (cfg.max_len, d)),
           *layer_norm("embed/norm", f"{e}LayerNorm", d)]
    for i in range(cfg.num_layers):
        b, t = f"encoder/layer_{i}/", f"{prefix}transformer.layer.{i}."
        for name, hf_name in (("query", "q_lin"), ("key", "k_lin"), ("value", "v_lin")):
            out += dense_rules(f"{b}self_attn/{name}", f"{t}attention.{hf_name}", (d,), (h, dh))
        out += [*dense_rules(f"{b}self_attn/out", f"{t}attention.out_lin", (h, dh), (d,)),
                *layer_norm(f"{b}self_attn_norm", f"{t}sa_layer_norm", d),
                *dense_rules(f"{b}ffn/wi", f"{t}ffn.lin1", (d,), (f,)),
                *dense_rules(f"{b}ffn/wo", f"{t}ffn.lin2", (f,), (d,)),
                *layer_norm(f"{b}ffn_norm", f"{t}output_layer_norm", d)]
    if cfg.head == "mlm":
        out += [*dense_rules("mlm_head/dense", "vocab_transform", (d,), (d,)),
                *layer_norm("mlm_head/norm", "vocab_layer_norm", d),
                copy("mlm_head/decoder/bias", "vocab_projector.bias", (v,))]
        if not cfg.tie_embeddings:
            out.append(linear("mlm_head/decoder/kernel", "vocab_projector.weight", (d,), (v,)))
    elif cfg.head == "classify":
        out += [*dense_rules("pooler", "pre_classifier", (d,), (d,)),
                *dense_rules("classifier", "classifier", (d,), (cfg.num_classes,))]
    elif cfg.head == "token_classify":
        out += dense_rules("token_classifier", "classifier", (d,), (cfg.num_classes,))
    elif cfg.head == "span":
        out += dense_rules("qa_outputs", "qa_outputs", (d,), (2,))
    return out


# What a checkpoint tensor no rule used is: "ignore", "drop" or "unknown" (mapping.leftover_rule).
leftover = leftover_rule(BUFFERS, HEAD_TENSORS, ("vocab_projector.weight",), "mlm")


def config_to_hf(cfg: ModelConfig) -> tuple[dict, str]:
    """ModelConfig → (``config.json`` dict, prefix); ValueError if not DistilBERT-shaped."""
    want = dict(family="encoder", position="learned", position_offset=0, norm="layer",
                norm_bias=True, norm_position="post", norm_eps=NORM_EPS, embedding_norm=True,
                use_bias=True, gated_ffn=False, num_kv_heads=cfg.num_heads,
                head_dim=cfg.d_model // cfg.num_heads, attention_scale=None,
                scale_embeddings=False, type_vocab_size=0, pooling="first", nsp_head=False,
                activation=tuple(TO_HF_ACTIVATIONS), head=HEADS)
    if cfg.head == "mlm":
        want.update(mlm_transform=True, lm_head_bias=True, rescale_tied_logits=False)
    if cfg.head == "classify":
        want.update(pooler=True, pooler_activation="relu")
    if cfg.head == "none":
        want.update(pooler=False)
    require(cfg, "DistilBERT", **want)
    arch = {v: k for k, v in ARCHITECTURE_HEADS.items()}[cfg.head]
    hf = {
        "model_type": MODEL_TYPE, "architectures": [arch], "vocab_size": cfg.vocab_size,
        "dim": cfg.d_model, "n_layers": cfg.num_layers, "n_heads": cfg.num_heads,
        "hidden_dim": cfg.d_ff, "activation": TO_HF_ACTIVATIONS[cfg.activation],
        "dropout": cfg.dropout_rate, "attention_dropout": cfg.attention_dropout_rate,
        "max_position_embeddings": cfg.max_len, "sinusoidal_pos_embds": False,
        "initializer_range": cfg.init_std, "tie_word_embeddings": cfg.tie_embeddings,
        "pad_token_id": 0, "dtype": "float32",
    }
    if cfg.head in ("classify", "token_classify"):
        hf.update(labels_config(cfg.num_classes))
    return hf, "" if cfg.head == "none" else "distilbert."
