"""ModernBERT (Warner et al. 2024) ↔ jaxformer ``family="encoder"`` with RoPE.

HF names (prefixed with ``model.`` except in ``ModernBertModel``): ``embeddings.tok_embeddings`` →
``embeddings.norm`` (LayerNorm, biased when ``norm_bias``); ``layers.{i}.attn_norm`` (absent in layer
0: the embedding norm precedes it, our ``first_attn_norm=False``) → ``attn.Wqkv`` (one
``nn.Linear`` `[3·D, D]`: q, k, v rows one after another) → ``attn.Wo``; ``mlp_norm`` →
``mlp.Wo(act(input) ⊙ gate)`` with ``mlp.Wi`` `[2·F, D]` holding the input half (our ``wi``) then
the gate half (``wi_gate``), GeGLU; ``final_norm``. Heads: ``head.{dense,norm}`` (the prediction
head: dense → ``classifier_activation`` → norm) then ``decoder`` (MLM; tied to the token table, its
bias ``decoder_bias``) or ``classifier`` (sequence classification on the ``cls`` token or the
``mean``, token classification on every token). ``nn.Linear`` weights are `[out, in]`.

==========================  =======================================================================
HF                          jaxformer
==========================  =======================================================================
``layer_types``             ``local_attention`` + ``global_attn_every_n_layers`` (layer i global
                            when i % n == 0; other patterns are refused)
``local_attention``         ``local_attention`` (keys within local_attention // 2 either side)
``rope_parameters``         ``rope_theta`` (``full_attention``, HF's global_rope_theta) and
                            ``local_rope_theta`` (``sliding_attention``); "default" RoPE only
attention / mlp /           ``use_bias`` (all three alike, else refused)
classifier bias
``decoder_bias``            ``lm_head_bias``
``classifier_pooling``      ``pooling``: "cls" → "first", "mean" → "mean"
==========================  =======================================================================
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from jaxformer.config import ModelConfig
from jaxformer.convert.mapping import (
    TO_HF_ACTIVATIONS,
    Rule,
    constant,
    copy,
    dense,
    from_hf_activation,
    fused,
    fused_linear,
    is_tied,
    labels_config,
    layer_norm,
    leftover_rule,
    linear,
    num_labels,
    pick_head,
    require,
)

MODEL_TYPE = "modernbert"
ARCHITECTURE_HEADS = {"ModernBertForMaskedLM": "mlm",
                      "ModernBertForSequenceClassification": "classify",
                      "ModernBertForTokenClassification": "token_classify",
                      "ModernBertModel": "none"}
ARCHITECTURES = {h: a for a, h in ARCHITECTURE_HEADS.items()}
HEADS = tuple(ARCHITECTURES)
POOLINGS = {"cls": "first", "mean": "mean"}
BUFFERS = re.compile(r"rotary_emb\.")
HEAD_TENSORS = re.compile(r"^(head|decoder|classifier)\.")
# HF's defaults (50281…) exceed a small vocabulary, where nn.Embedding(padding_idx=…) refuses them.
TOKEN_IDS = {"pad_token_id": 0, "bos_token_id": None, "eos_token_id": None, "cls_token_id": None,
             "sep_token_id": None}


def _rope_thetas(hf: Mapping) -> dict:
    """``rope_parameters`` per layer type (transformers 5) or ``global_rope_theta`` /
    ``local_rope_theta`` (4) → ``rope_theta``, ``local_rope_theta``."""
    params = hf.get("rope_parameters") or {}
    out = {}
    for kind, field, old, default in (("full_attention", "rope_theta", "global_rope_theta", 160_000.0),
                                      ("sliding_attention", "local_rope_theta", "local_rope_theta",
                                       10_000.0)):
        p = params.get(kind) or {}
        if p.get("rope_type", "default") != "default":
            raise ValueError(f"config.json rope_parameters[{kind!r}] rope_type={p['rope_type']!r} is "
                             "not supported; only 'default'")
        out[field] = float(p.get("rope_theta", hf.get(old, default)))
    return out


def _layer_pattern(hf: Mapping) -> dict:
    """``layer_types`` (or transformers 4's ``global_attn_every_n_layers``) → ``local_attention``,
    ``global_attn_every_n_layers``; ValueError for a pattern other than "global every n-th"."""
    n_layers = hf["num_hidden_layers"]
    types = hf.get("layer_types")
    if types is None:
        n = hf.get("global_attn_every_n_layers", 3)
        types = ["sliding_attention" if i % n else "full_attention" for i in range(n_layers)]
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    if len(full) == n_layers:
        return {"local_attention": None, "global_attn_every_n_layers": 1}
    n = full[1] if len(full) > 1 else n_layers
    if types != ["sliding_attention" if i % n else "full_attention" for i in range(n_layers)]:
        raise ValueError(f"config.json layer_types={types} is not supported: jaxformer's layer i "
                         "attends globally when i % global_attn_every_n_layers == 0, locally otherwise")
    return {"local_attention": int(hf.get("local_attention", 128)), "global_attn_every_n_layers": n}


def _use_bias(hf: Mapping) -> bool:
    biases = {k: bool(hf.get(k, False)) for k in ("attention_bias", "mlp_bias", "classifier_bias")}
    if len(set(biases.values())) > 1:
        raise ValueError(f"config.json {biases} is not supported: jaxformer's use_bias puts biases "
                         "on the attention, the MLP and the prediction head alike")
    return biases["attention_bias"]


def config_from_hf(hf: Mapping, tensors: Mapping[str, np.ndarray], *, head: str | None,
                   num_classes: int | None) -> tuple[dict, str]:
    """``config.json`` (+ tensor names) → (ModelConfig kwargs, name prefix)."""
    head = pick_head(hf, tensors, head, model="ModernBERT", architecture_heads=ARCHITECTURE_HEADS,
                     heads=HEADS, by_tensor=(("decoder.bias", "mlm"), ("head.dense.weight", "mlm")))
    prefix = "model." if any(k.startswith("model.") for k in tensors) else ""
    act = from_hf_activation(hf.get("hidden_activation", "gelu"), "hidden_activation")
    if from_hf_activation(hf.get("classifier_activation", "gelu"), "classifier_activation") != act:
        raise ValueError(f"config.json classifier_activation={hf.get('classifier_activation')!r} "
                         f"differs from hidden_activation={hf.get('hidden_activation')!r}: not "
                         "supported (one activation for the MLP and the prediction head)")
    pooling = hf.get("classifier_pooling", "cls")
    if pooling not in POOLINGS:
        raise ValueError(f"config.json classifier_pooling={pooling!r} is not supported; choose one "
                         f"of {sorted(POOLINGS)}")
    cfg = dict(
        family="encoder", vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
        num_heads=hf["num_attention_heads"], d_ff=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"], max_len=hf.get("max_position_embeddings", 8192),
        position="rope", **_rope_thetas(hf), **_layer_pattern(hf), first_attn_norm=False,
        norm="layer", norm_bias=bool(hf.get("norm_bias", False)), norm_eps=hf.get("norm_eps", 1e-5),
        norm_position="pre", embedding_norm=True, activation=act, gated_ffn=True,
        use_bias=_use_bias(hf), type_vocab_size=0, head=head, mlm_transform=head == "mlm",
        prediction_head=head in ("classify", "token_classify"),
        lm_head_bias=bool(hf.get("decoder_bias", True)), pooling=POOLINGS[pooling],
        tie_embeddings=is_tied(tensors, "decoder.weight", f"{prefix}embeddings.tok_embeddings.weight"),
        dropout_rate=hf.get("embedding_dropout", 0.0),
        attention_dropout_rate=hf.get("attention_dropout", 0.0),
        ffn_dropout_rate=hf.get("mlp_dropout", 0.0), init_scheme="bert",
        init_std=hf.get("initializer_range", 0.02), num_classes=num_labels(hf, num_classes))
    return cfg, prefix


def _layer_rules(cfg: ModelConfig, i: int, prefix: str) -> list[Rule]:
    d, h, dh, f, bias = cfg.d_model, cfg.num_heads, cfg.head_dim, cfg.d_ff, cfg.use_bias
    b, t = f"encoder/layer_{i}/", f"{prefix}layers.{i}."
    a, m = f"{b}self_attn/", f"{b}ffn/"
    qkv = [f"{a}{n}/kernel" for n in ("query", "key", "value")]
    out = [fused_linear(qkv, f"{t}attn.Wqkv.weight", (d,), (h, dh)),
           *dense(f"{a}out", f"{t}attn.Wo", (h, dh), (d,), bias),
           fused_linear([f"{m}wi/kernel", f"{m}wi_gate/kernel"], f"{t}mlp.Wi.weight", (d,), (f,)),
           *dense(f"{m}wo", f"{t}mlp.Wo", (f,), (d,), bias),
           *layer_norm(f"{b}ffn_norm", f"{t}mlp_norm", d, bias=cfg.norm_bias)]
    if bias:
        out += [fused([f"{a}{n}/bias" for n in ("query", "key", "value")], f"{t}attn.Wqkv.bias",
                      (), (h, dh)),
                fused([f"{m}wi/bias", f"{m}wi_gate/bias"], f"{t}mlp.Wi.bias", (), (f,))]
    if i or cfg.first_attn_norm:
        return out + layer_norm(f"{b}self_attn_norm", f"{t}attn_norm", d, bias=cfg.norm_bias)
    out.append(constant(f"{b}self_attn_norm/scale", (d,), 1.0))  # unused (`first_attn_norm`)
    return out + ([constant(f"{b}self_attn_norm/bias", (d,), 0.0)] if cfg.norm_bias else [])


def rules(cfg: ModelConfig, prefix: str, *, export: bool = False) -> list[Rule]:
    """Rules for every parameter of ``cfg`` (unrolled layout)."""
    d, v, p = cfg.d_model, cfg.vocab_size, prefix
    out = [copy("token_embed/embedding", f"{p}embeddings.tok_embeddings.weight", (v, d)),
           *layer_norm("embed/norm", f"{p}embeddings.norm", d, bias=cfg.norm_bias)]
    for i in range(cfg.num_layers):
        out += _layer_rules(cfg, i, p)
    out += layer_norm("encoder_norm", f"{p}final_norm", d, bias=cfg.norm_bias)
    transform = {"mlm": "mlm_head", "classify": "prediction_head",
                 "token_classify": "prediction_head"}.get(cfg.head)
    if transform:
        out += [*dense(f"{transform}/dense", "head.dense", (d,), (d,), cfg.use_bias),
                *layer_norm(f"{transform}/norm", "head.norm", d, bias=cfg.norm_bias)]
    if cfg.head == "mlm" and cfg.lm_head_bias:
        out.append(copy("mlm_head/decoder/bias", "decoder.bias", (v,)))
    if cfg.head == "mlm" and not cfg.tie_embeddings:
        out.append(linear("mlm_head/decoder/kernel", "decoder.weight", (d,), (v,)))
    if cfg.head in ("classify", "token_classify"):
        name = "classifier" if cfg.head == "classify" else "token_classifier"
        out += dense(name, "classifier", (d,), (cfg.num_classes,), True)
    return out


# What a checkpoint tensor no rule used is: "ignore", "drop" or "unknown" (mapping.leftover_rule).
leftover = leftover_rule(BUFFERS, HEAD_TENSORS, ("decoder.weight",), "mlm")


def config_to_hf(cfg: ModelConfig) -> tuple[dict, str]:
    """ModelConfig → (``config.json`` dict, tensor-name prefix); ValueError if not ModernBERT-shaped."""
    want = dict(family="encoder", position="rope", rope_scaling="none", norm="layer",
                norm_position="pre", embedding_norm=True, first_attn_norm=False, gated_ffn=True,
                num_kv_heads=cfg.num_heads, head_dim=cfg.d_model // cfg.num_heads,
                attention_scale=None, scale_embeddings=False, type_vocab_size=0, position_offset=0,
                embedding_size=None, share_layers=False, pooler=False, nsp_head=False,
                activation=tuple(TO_HF_ACTIVATIONS), head=HEADS)
    if cfg.head == "mlm":
        want.update(mlm_transform=True, rescale_tied_logits=False)
    if cfg.head in ("classify", "token_classify"):
        want.update(prediction_head=True)
    if cfg.head == "classify":
        want.update(pooling=tuple(POOLINGS.values()))
    require(cfg, "ModernBERT", **want)
    local = cfg.local_attention is not None
    n = cfg.global_attn_every_n_layers if local else 1
    act = TO_HF_ACTIVATIONS[cfg.activation]
    hf = {
        "model_type": MODEL_TYPE, "architectures": [ARCHITECTURES[cfg.head]],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "hidden_activation": act, "classifier_activation": act,
        "max_position_embeddings": cfg.max_len, "norm_eps": cfg.norm_eps,
        "norm_bias": cfg.norm_bias, "attention_bias": cfg.use_bias, "mlp_bias": cfg.use_bias,
        "classifier_bias": cfg.use_bias, "decoder_bias": cfg.lm_head_bias,
        "tie_word_embeddings": cfg.tie_embeddings, "initializer_range": cfg.init_std,
        "layer_types": ["sliding_attention" if i % n else "full_attention"
                        for i in range(cfg.num_layers)],
        "global_attn_every_n_layers": n, "local_attention": cfg.local_attention or 128,
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta},
            "sliding_attention": {"rope_type": "default",
                                  "rope_theta": cfg.local_rope_theta or cfg.rope_theta}},
        "global_rope_theta": cfg.rope_theta, "local_rope_theta": cfg.local_rope_theta or cfg.rope_theta,
        "classifier_pooling": {v: k for k, v in POOLINGS.items()}.get(cfg.pooling, "cls"),
        "embedding_dropout": cfg.dropout_rate, "attention_dropout": cfg.attention_dropout_rate,
        "mlp_dropout": cfg.ffn_dropout_rate, "classifier_dropout": cfg.dropout_rate,
        "dtype": "float32",
    }
    if cfg.head in ("classify", "token_classify"):
        hf.update(labels_config(cfg.num_classes))
    return hf, "" if cfg.head == "none" else "model."
