"""RoBERTa (Liu et al. 2019) ↔ jaxformer ``family="encoder"`` with ``position_offset``.

The backbone is BERT's, under the names of `hf_bert` prefixed with ``roberta.`` (none in
``RobertaModel``), with two differences of input: HF numbers the positions of a row from
``pad_token_id + 1`` (``create_position_ids_from_input_ids``), so the position table has
``max_position_embeddings = max_len + pad_token_id + 1`` rows and position ``p`` reads row
``p + pad_token_id + 1`` (``ModelConfig.position_offset``); and there is one token type
(``type_vocab_size=1``). HF gives padding tokens the position ``pad_token_id``; jaxformer counts
``0, 1, …`` along the row (or per packed segment), so the two agree on every non-padding token of
rows that hold no padding token before their end.

Heads: ``lm_head.{dense,layer_norm}`` + ``lm_head.bias`` (MLM; the decoder is tied to the word
embeddings and always applies exact GELU, RobertaLMHead); ``classifier.dense`` (+ tanh, our
``pooler``) and ``classifier.out_proj`` (our ``classifier``) on the first token
(RobertaClassificationHead); ``classifier`` on every token (token classification, our
``token_classifier``); ``qa_outputs`` (extractive QA, ``head="span"``); ``pooler.dense`` in
``RobertaModel``.
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
    is_tied,
    labels_config,
    layer_norm,
    leftover_rule,
    linear,
    num_labels,
    pick_head,
    require,
)

MODEL_TYPE = "roberta"
ARCHITECTURE_HEADS = {"RobertaForMaskedLM": "mlm", "RobertaForSequenceClassification": "classify",
                      "RobertaForTokenClassification": "token_classify",
                      "RobertaForQuestionAnswering": "span", "RobertaModel": "none"}
HEADS = ("mlm", "classify", "token_classify", "span", "none")
# a config.json naming no architecture: the head of the first of these tensors present
HEAD_BY_TENSOR = (("lm_head.bias", "mlm"), ("classifier.dense.weight", "classify"),
                        ("classifier.weight", "token_classify"), ("qa_outputs.weight", "span"))
BUFFERS = re.compile(r"(^|\.)embeddings\.(position_ids|token_type_ids)$|^lm_head\.decoder\.bias$")
HEAD_TENSORS = re.compile(r"^(lm_head|classifier|qa_outputs)\.|(^|\.)pooler\.")
canonical_name = hf_bert.canonical_name
TOKEN_IDS = {"bos_token_id": 0, "eos_token_id": 2}  # RobertaConfig's, unless the source says else


def config_from_hf(hf: Mapping, tensors: Mapping[str, np.ndarray], *, head: str | None,
                   num_classes: int | None) -> tuple[dict, str]:
    """``config.json`` (+ tensor names, for the heads present) → (ModelConfig kwargs, prefix)."""
    hf_bert.check_variant(hf, "RoBERTa")
    head = pick_head(hf, tensors, head, model="RoBERTa", architecture_heads=ARCHITECTURE_HEADS,
                     heads=HEADS, by_tensor=HEAD_BY_TENSOR)
    prefix = "roberta." if any(k.startswith("roberta.") for k in tensors) else ""
    fields = hf_bert.backbone_fields(hf)
    if head == "mlm" and fields["activation"] != "gelu":
        raise ValueError(f"RoBERTa hidden_act={hf.get('hidden_act')!r} with the MLM head is not "
                         "supported: RobertaLMHead always applies exact GELU, jaxformer's MLM "
                         "transform applies hidden_act")
    offset = int(hf.get("pad_token_id", 1)) + 1
    rows = hf["max_position_embeddings"]
    if rows <= offset:
        raise ValueError(f"RoBERTa max_position_embeddings={rows} leaves no position after the "
                         f"{offset} rows before position 0 (pad_token_id + 1)")
    pooler = head == "classify" or (head == "none" and f"{prefix}pooler.dense.weight" in tensors)
    fields.update(
        max_len=rows - offset, position_offset=offset, type_vocab_size=hf.get("type_vocab_size", 2),
        head=head, pooler=pooler, pooler_activation="tanh",
        tie_embeddings=is_tied(tensors, "lm_head.decoder.weight",
                               f"{prefix}embeddings.word_embeddings.weight"),
        num_classes=num_labels(hf, num_classes))
    return fields, prefix


def rules(cfg: ModelConfig, prefix: str, *, export: bool = False) -> list[Rule]:
    """Rules for every parameter of ``cfg`` (unrolled layout)."""
    d, v = cfg.d_model, cfg.vocab_size
    out = hf_bert.backbone_rules(cfg, prefix)
    if cfg.head == "mlm":
        out += [*hf_bert.dense_rules("mlm_head/dense", "lm_head.dense", (d,), (d,)),
                *layer_norm("mlm_head/norm", "lm_head.layer_norm", d),
                copy("mlm_head/decoder/bias", "lm_head.bias", (v,))]
        if not cfg.tie_embeddings:
            out.append(linear("mlm_head/decoder/kernel", "lm_head.decoder.weight", (d,), (v,)))
    elif cfg.head == "classify":
        out += [*hf_bert.dense_rules("pooler", "classifier.dense", (d,), (d,)),
                *hf_bert.dense_rules("classifier", "classifier.out_proj", (d,), (cfg.num_classes,))]
    elif cfg.head == "token_classify":
        out += hf_bert.dense_rules("token_classifier", "classifier", (d,), (cfg.num_classes,))
    elif cfg.head == "span":
        out += hf_bert.dense_rules("qa_outputs", "qa_outputs", (d,), (2,))
    elif cfg.pooler:  # head == "none": RobertaModel's pooler
        out += hf_bert.dense_rules("pooler", f"{prefix}pooler.dense", (d,), (d,))
    return out


# What a checkpoint tensor no rule used is: "ignore", "drop" or "unknown" (mapping.leftover_rule).
leftover = leftover_rule(BUFFERS, HEAD_TENSORS, ("lm_head.decoder.weight",), "mlm")


def config_to_hf(cfg: ModelConfig) -> tuple[dict, str]:
    """ModelConfig → (``config.json`` dict, tensor-name prefix); ValueError if not RoBERTa-shaped."""
    want = dict(family="encoder", position="learned", norm="layer", norm_bias=True,
                norm_position="post", embedding_norm=True, use_bias=True, gated_ffn=False,
                num_kv_heads=cfg.num_heads, head_dim=cfg.d_model // cfg.num_heads,
                attention_scale=None, scale_embeddings=False, pooling="first", nsp_head=False,
                activation=tuple(TO_HF_ACTIVATIONS), head=HEADS)
    if cfg.head == "mlm":
        want.update(mlm_transform=True, lm_head_bias=True, rescale_tied_logits=False,
                    activation="gelu")
    if cfg.head == "classify":
        want.update(pooler=True, pooler_activation="tanh")
    require(cfg, "RoBERTa", **want)
    if cfg.position_offset < 1 or cfg.type_vocab_size < 1:
        raise ValueError("this model config has no Hugging Face RoBERTa equivalent: it needs "
                         f"position_offset >= 1 (pad_token_id + 1; got {cfg.position_offset}) and "
                         f"type_vocab_size >= 1 (got {cfg.type_vocab_size})")
    arch = {v: k for k, v in ARCHITECTURE_HEADS.items()}[cfg.head]
    hf = {
        "model_type": MODEL_TYPE, "architectures": [arch], "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "intermediate_size": cfg.d_ff,
        "hidden_act": TO_HF_ACTIVATIONS[cfg.activation], "hidden_dropout_prob": cfg.dropout_rate,
        "attention_probs_dropout_prob": cfg.attention_dropout_rate,
        "max_position_embeddings": cfg.max_len + cfg.position_offset,
        "type_vocab_size": cfg.type_vocab_size, "initializer_range": cfg.init_std,
        "layer_norm_eps": cfg.norm_eps, "position_embedding_type": "absolute",
        "tie_word_embeddings": cfg.tie_embeddings, "pad_token_id": cfg.position_offset - 1,
        "dtype": "float32",
    }
    if cfg.head in ("classify", "token_classify"):
        hf.update(labels_config(cfg.num_classes))
    return hf, "" if cfg.head == "none" else "roberta."
