"""Llama (Touvron et al. 2023), Mistral (Jiang et al. 2023) and Qwen2 ↔ jaxformer ``family="decoder"``.

One graph with three sets of options. HF names (``LlamaForCausalLM`` prefixes them with ``model.``;
``LlamaModel`` does not): ``embed_tokens`` table; ``layers.{i}.input_layernorm`` (RMSNorm) →
``self_attn.{q,k,v,o}_proj`` (``nn.Linear``, `[out, in]`; K/V with ``num_key_value_heads``, GQA) →
``post_attention_layernorm`` → ``mlp.down_proj(act(gate_proj x) ⊙ up_proj x)`` (SwiGLU, Shazeer
2020: our ``wi`` = gate, ``wi_gate`` = up); final ``norm``; ``lm_head`` (untied unless
``tie_word_embeddings``). A ``ForSequenceClassification``'s ``score`` imports as our
``classifier`` (pooling "last"; its bias, which HF's lacks, starts at 0); it is not exported. RoPE in
the half-split layout of `jaxformer.ops.positions.apply_rope` (HF's ``rotate_half``), so q/k weights
are copied as they are; attention scaled by 1/√Dh.

==========  ========================================================================================
variant     options
==========  ========================================================================================
llama       no biases, or ``attention_bias`` and ``mlp_bias`` together (= our ``use_bias``)
mistral     ``sliding_window`` (= ours; Mistral 7B v0.1: 4096), no biases
qwen2       q/k/v biases only (= our ``qkv_bias``); its per-layer ``use_sliding_window`` is refused
==========  ========================================================================================

RoPE scaling (``rope_scaling``, in transformers 5 ``rope_parameters`` with ``rope_theta`` inside):
"default", "linear", "dynamic", "llama3" and "yarn" are imported
(`jaxformer.ops.positions.RopeScaling`); anything else is refused naming the field. Exports write
both spellings.
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
    dense,
    from_hf_activation,
    is_tied,
    leftover_rule,
    linear,
    num_labels,
    require,
)

MODEL_TYPES = ("llama", "mistral", "qwen2")
HEADS = ("lm", "classify", "none")
ARCHITECTURES = {"lm": "ForCausalLM", "none": "Model"}  # the heads that export
CLASS_PREFIX = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2"}
BUFFERS = re.compile(r"\.rotary_emb\.inv_freq$")  # RoPE tables saved by old transformers
HEAD_TENSORS = re.compile(r"^(lm_head|score)\.")
# HF rope_type → ours. HF's "dynamic" keeps the frequencies of the longest call so far (a state of
# the module); ours are those of each call, the same for one forward or one generation from start.
ROPE_TYPES = {"default": "none", "linear": "linear", "dynamic": "dynamic", "llama3": "llama3",
              "yarn": "yarn"}


def _prefix(keys) -> str:
    return "model." if any(k.startswith("model.") for k in keys) else ""


def _rope_fields(hf: Mapping) -> dict:
    """``rope_theta`` + ``rope_scaling`` (transformers 4) or ``rope_parameters`` (5) → our
    ``rope_*`` fields; ValueError naming the HF field for what we cannot compute."""
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if any(isinstance(v, Mapping) for v in params.values()):
        raise ValueError(f"config.json rope_parameters per layer type ({sorted(params)}) are not "
                         "supported; one RoPE for all layers is")
    factor = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if factor != 1.0:
        raise ValueError(f"config.json partial_rotary_factor={factor} is not supported (RoPE "
                         "rotates the whole head)")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ValueError(f"config.json rope_scaling type {kind!r} is not supported; supported: "
                         f"{sorted(ROPE_TYPES)}")
    out = {"rope_theta": float(params.get("rope_theta", hf.get("rope_theta", 10_000.0))),
           "rope_scaling": ROPE_TYPES[kind]}
    if kind == "default":
        return out
    original = params.get("original_max_position_embeddings") or hf.get(
        "original_max_position_embeddings") or hf.get("max_position_embeddings")
    if kind == "dynamic":  # HF scales beyond max_position_embeddings, whatever else is stated
        original = hf.get("max_position_embeddings", 2048)
    factor = params.get("factor")
    if factor is None and kind == "yarn":  # HF: the ratio of the context lengths
        factor = hf["max_position_embeddings"] / original
    out.update(rope_scaling_factor=float(factor), rope_original_max_len=int(original))
    if kind == "llama3":
        out.update(rope_low_freq_factor=float(params["low_freq_factor"]),
                   rope_high_freq_factor=float(params["high_freq_factor"]))
    if kind == "yarn":
        if params.get("truncate", True) is False:
            raise ValueError("config.json rope_scaling truncate=False is not supported (YaRN's "
                             "correction range is floored / ceiled)")
        out.update(rope_beta_fast=float(params.get("beta_fast") or 32.0),
                   rope_beta_slow=float(params.get("beta_slow") or 1.0),
                   rope_attention_factor=_yarn_attention_factor(params, factor))
    return out


def _yarn_attention_factor(params: Mapping, factor: float) -> float | None:
    """HF's YaRN temperature: ``attention_factor``, else DeepSeek's ``mscale`` ratio, else None
    (ours computes the paper's default 0.1 ln(factor) + 1)."""
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")
    if mscale and mscale_all and factor > 1:
        return float((0.1 * mscale * np.log(factor) + 1) / (0.1 * mscale_all * np.log(factor) + 1))
    return None


def _bias_fields(hf: Mapping) -> dict:
    """Which dense layers have biases: (use_bias, qkv_bias)."""
    if hf["model_type"] == "qwen2":
        return {"use_bias": False, "qkv_bias": True}
    attn, mlp = bool(hf.get("attention_bias", False)), bool(hf.get("mlp_bias", False))
    if attn != mlp:
        raise ValueError(f"config.json attention_bias={attn} with mlp_bias={mlp} is not supported: "
                         "jaxformer's use_bias puts biases on both or neither")
    return {"use_bias": attn, "qkv_bias": False}


def _sliding_window(hf: Mapping) -> int | None:
    if hf["model_type"] == "qwen2":
        if hf.get("use_sliding_window"):
            raise ValueError("config.json use_sliding_window=True is not supported for Qwen2 (its "
                             "window applies from layer max_window_layers on); jaxformer's "
                             "sliding_window applies to every layer")
        return None
    window = hf.get("sliding_window")
    return int(window) if window else None


def config_from_hf(hf: Mapping, tensors: Mapping[str, np.ndarray], *, head: str | None,
                   num_classes: int | None) -> tuple[dict, str]:
    """``config.json`` (+ tensors: is the LM head tied?) → (ModelConfig kwargs, name prefix)."""
    prefix = _prefix(tensors)
    if head is None:
        archs = hf.get("architectures") or []
        head = ("classify" if any(a.endswith("ForSequenceClassification") for a in archs)
                else "none" if not prefix else "lm")
    if head not in HEADS:
        raise ValueError(f"head={head!r} is not available for {hf['model_type']}; choose one of "
                         f"{HEADS}")
    d, h = hf["hidden_size"], hf["num_attention_heads"]
    cfg = dict(
        family="decoder", vocab_size=hf["vocab_size"], d_model=d, num_heads=h,
        num_kv_heads=hf.get("num_key_value_heads") or h, head_dim=hf.get("head_dim") or d // h,
        d_ff=hf["intermediate_size"], num_layers=hf["num_hidden_layers"],
        max_len=hf.get("max_position_embeddings", 2048), position="rope", norm="rms",
        norm_position="pre", norm_eps=hf.get("rms_norm_eps", 1e-6),
        activation=from_hf_activation(hf.get("hidden_act", "silu"), "hidden_act"), gated_ffn=True,
        **_bias_fields(hf), **_rope_fields(hf), sliding_window=_sliding_window(hf),
        tie_embeddings=is_tied(tensors, "lm_head.weight", prefix + "embed_tokens.weight"),
        dropout_rate=0.0, attention_dropout_rate=hf.get("attention_dropout", 0.0),
        init_scheme="normal", init_std=hf.get("initializer_range", 0.02), head=head,
        pooling="last", num_classes=num_labels(hf, num_classes))
    return cfg, prefix


def rules(cfg: ModelConfig, prefix: str, *, export: bool = False) -> list[Rule]:
    """Rules for every parameter of ``cfg`` (unrolled layout)."""
    d, h, k, dh, f, p = (cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.d_ff,
                         prefix)
    qkv_bias = cfg.use_bias or cfg.qkv_bias
    out = [copy("token_embed/embedding", f"{p}embed_tokens.weight", (cfg.vocab_size, d))]
    for i in range(cfg.num_layers):
        b, t = f"decoder/layer_{i}/", f"{p}layers.{i}."
        a, m = f"{b}self_attn/", f"{b}ffn/"
        out += [
            *dense(f"{a}query", f"{t}self_attn.q_proj", (d,), (h, dh), qkv_bias),
            *dense(f"{a}key", f"{t}self_attn.k_proj", (d,), (k, dh), qkv_bias),
            *dense(f"{a}value", f"{t}self_attn.v_proj", (d,), (k, dh), qkv_bias),
            *dense(f"{a}out", f"{t}self_attn.o_proj", (h, dh), (d,), cfg.use_bias),
            *dense(f"{m}wi", f"{t}mlp.gate_proj", (d,), (f,), cfg.use_bias),
            *dense(f"{m}wi_gate", f"{t}mlp.up_proj", (d,), (f,), cfg.use_bias),
            *dense(f"{m}wo", f"{t}mlp.down_proj", (f,), (d,), cfg.use_bias),
            copy(f"{b}self_attn_norm/scale", f"{t}input_layernorm.weight", (d,)),
            copy(f"{b}ffn_norm/scale", f"{t}post_attention_layernorm.weight", (d,)),
        ]
    out.append(copy("decoder_norm/scale", f"{p}norm.weight", (d,)))
    if cfg.head == "lm" and not cfg.tie_embeddings:
        out.append(linear("lm_head/kernel", "lm_head.weight", (d,), (cfg.vocab_size,)))
    if cfg.head == "classify":
        out.append(linear("classifier/kernel", "score.weight", (d,), (cfg.num_classes,)))
    return out


# What a checkpoint tensor no rule used is: "ignore", "drop" or "unknown" (mapping.leftover_rule).
leftover = leftover_rule(BUFFERS, HEAD_TENSORS)


def model_type_of(cfg: ModelConfig) -> str:
    """The HF model type that expresses ``cfg``: qwen2 for q/k/v-only biases, mistral for a
    sliding window, else llama."""
    if cfg.qkv_bias and not cfg.use_bias:
        return "qwen2"
    return "mistral" if cfg.sliding_window is not None else "llama"


def _rope_to_hf(cfg: ModelConfig) -> dict:
    """``rope_parameters`` (transformers 5) as a dict; its scaling entries are ``rope_scaling``."""
    if cfg.rope_scaling == "none":
        return {"rope_type": "default", "rope_theta": cfg.rope_theta}
    out = {"rope_type": cfg.rope_scaling, "rope_theta": cfg.rope_theta,
           "factor": cfg.rope_scaling_factor}
    if cfg.rope_scaling in ("llama3", "yarn"):
        out["original_max_position_embeddings"] = cfg.rope_original_max_len
    if cfg.rope_scaling == "llama3":
        out.update(low_freq_factor=cfg.rope_low_freq_factor,
                   high_freq_factor=cfg.rope_high_freq_factor)
    if cfg.rope_scaling == "yarn":
        out.update(beta_fast=cfg.rope_beta_fast, beta_slow=cfg.rope_beta_slow)
        if cfg.rope_attention_factor is not None:
            out["attention_factor"] = cfg.rope_attention_factor
    return out


def config_to_hf(cfg: ModelConfig) -> tuple[dict, str]:
    """ModelConfig → (``config.json`` dict, tensor-name prefix); ValueError if not Llama-shaped."""
    model_type = model_type_of(cfg)
    # head "classify" imports (``score`` → our classifier, its bias 0) but does not export: our
    # classifier has a bias, HF's score none.
    want = dict(family="decoder", position="rope", norm="rms", norm_position="pre",
                embedding_norm=False, gated_ffn=True, attention_scale=None, scale_embeddings=False,
                rescale_tied_logits=False, lm_head_bias=False, type_vocab_size=0,
                permutation_lm=False, head=("lm", "none"), activation=tuple(TO_HF_ACTIVATIONS))
    if cfg.rope_scaling == "dynamic":  # HF scales beyond max_position_embeddings
        want["rope_original_max_len"] = cfg.max_len
    if model_type != "llama":  # Qwen2 and Mistral have no bias options
        want["use_bias"] = False
    if model_type == "qwen2":  # its window is per layer (use_sliding_window), not exported
        want["sliding_window"] = None
    require(cfg, CLASS_PREFIX[model_type], **want)
    rope = _rope_to_hf(cfg)
    hf = {
        "model_type": model_type,
        "architectures": [CLASS_PREFIX[model_type] + ARCHITECTURES[cfg.head]],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
        "hidden_act": TO_HF_ACTIVATIONS[cfg.activation], "max_position_embeddings": cfg.max_len,
        "rms_norm_eps": cfg.norm_eps, "initializer_range": cfg.init_std,
        "tie_word_embeddings": cfg.tie_embeddings, "attention_dropout": cfg.attention_dropout_rate,
        "rope_parameters": rope, "rope_theta": cfg.rope_theta,
        "rope_scaling": None if cfg.rope_scaling == "none" else
        {k: v for k, v in rope.items() if k != "rope_theta"}, "dtype": "float32",
    }
    if model_type == "llama":
        hf.update(attention_bias=cfg.use_bias, mlp_bias=cfg.use_bias)
    if model_type == "mistral":
        hf["sliding_window"] = cfg.sliding_window
    if model_type == "qwen2":
        hf.update(use_sliding_window=False, sliding_window=None,
                  max_window_layers=cfg.num_layers)
    return hf, "model." if cfg.head == "lm" else ""
