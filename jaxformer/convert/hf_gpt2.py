"""GPT-2 (Radford et al. 2019) ↔ jaxformer ``family="decoder"``.

HF names (``GPT2LMHeadModel`` prefixes them with ``transformer.``; ``GPT2Model`` and the
original OpenAI upload do not): ``wte``/``wpe`` tables, ``h.{i}.ln_1`` → attention (fused
``c_attn`` `[D, 3D]` = q|k|v, ``c_proj``) → ``ln_2`` → ``mlp.c_fc``/``mlp.c_proj``; final
``ln_f``; ``lm_head`` tied to ``wte`` unless ``tie_word_embeddings`` is false. ``Conv1D``
weights are stored `[in, out]`. Pre-LN, learned positions, ``gelu_new`` (= our ``gelu_tanh``),
attention scaled by 1/√Dh (``scale_attn_weights``).
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
    fused,
    is_tied,
    layer_norm,
    leftover_rule,
    linear,
    num_labels,
    require,
)

MODEL_TYPE = "gpt2"
HEADS = ("lm", "classify", "none")
BUFFERS = re.compile(r"(^|\.)attn\.(bias|masked_bias)$")  # causal-mask buffers
HEAD_TENSORS = re.compile(r"^(lm_head|score)\.")


def _prefix(keys) -> str:
    return "transformer." if any(k.startswith("transformer.") for k in keys) else ""


def config_from_hf(hf: Mapping, tensors: Mapping[str, np.ndarray], *, head: str | None,
                   num_classes: int | None) -> tuple[dict, str]:
    """``config.json`` (+ tensors: is the LM head tied?) → (ModelConfig kwargs, name prefix)."""
    for flag in ("scale_attn_by_inverse_layer_idx", "add_cross_attention"):
        if hf.get(flag):
            raise ValueError(f"GPT-2 with {flag}=True is not supported (no jaxformer equivalent)")
    if head is None:  # the original OpenAI upload says GPT2LMHeadModel over GPT2Model names
        head = "none" if hf.get("architectures") == ["GPT2Model"] else "lm"
    if head not in HEADS:
        raise ValueError(f"head={head!r} is not available for GPT-2; choose one of {HEADS}")
    prefix = _prefix(tensors)
    d = hf["n_embd"]
    cfg = dict(
        family="decoder", vocab_size=hf["vocab_size"], d_model=d, num_heads=hf["n_head"],
        d_ff=hf.get("n_inner") or 4 * d, num_layers=hf["n_layer"], max_len=hf["n_positions"],
        position="learned", norm="layer", norm_position="pre",
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        activation=from_hf_activation(hf.get("activation_function", "gelu_new"),
                                      "activation_function"),
        use_bias=True, attention_scale=None if hf.get("scale_attn_weights", True) else 1.0,
        tie_embeddings=is_tied(tensors, "lm_head.weight", prefix + "wte.weight"),
        dropout_rate=hf.get("resid_pdrop", 0.1), attention_dropout_rate=hf.get("attn_pdrop", 0.1),
        init_scheme="gpt2", init_std=hf.get("initializer_range", 0.02), head=head, pooling="last",
        num_classes=num_labels(hf, num_classes))
    return cfg, prefix


def rules(cfg: ModelConfig, prefix: str, *, export: bool = False) -> list[Rule]:
    """Rules for every parameter of ``cfg`` (unrolled layout)."""
    d, h, dh, f, p = cfg.d_model, cfg.num_heads, cfg.head_dim, cfg.d_ff, prefix
    out = [copy("token_embed/embedding", f"{p}wte.weight", (cfg.vocab_size, d)),
           copy("embed/pos_embedding", f"{p}wpe.weight", (cfg.max_len, d))]
    for i in range(cfg.num_layers):
        b, t = f"decoder/layer_{i}/", f"{p}h.{i}."
        qkv = [f"{b}self_attn/{n}" for n in ("query", "key", "value")]
        out += [
            fused([f"{q}/kernel" for q in qkv], f"{t}attn.c_attn.weight", (d,), (h, dh)),
            fused([f"{q}/bias" for q in qkv], f"{t}attn.c_attn.bias", (), (h, dh)),
            linear(f"{b}self_attn/out/kernel", f"{t}attn.c_proj.weight", (h, dh), (d,),
                   transposed=False),
            copy(f"{b}self_attn/out/bias", f"{t}attn.c_proj.bias", (d,)),
            linear(f"{b}ffn/wi/kernel", f"{t}mlp.c_fc.weight", (d,), (f,), transposed=False),
            copy(f"{b}ffn/wi/bias", f"{t}mlp.c_fc.bias", (f,)),
            linear(f"{b}ffn/wo/kernel", f"{t}mlp.c_proj.weight", (f,), (d,), transposed=False),
            copy(f"{b}ffn/wo/bias", f"{t}mlp.c_proj.bias", (d,)),
            *layer_norm(f"{b}self_attn_norm", f"{t}ln_1", d),
            *layer_norm(f"{b}ffn_norm", f"{t}ln_2", d),
        ]
    out += layer_norm("decoder_norm", f"{p}ln_f", d)
    if cfg.head == "lm" and not cfg.tie_embeddings:
        out.append(linear("lm_head/kernel", "lm_head.weight", (d,), (cfg.vocab_size,)))
    return out


# What a checkpoint tensor no rule used is: "ignore", "drop" or "unknown" (mapping.leftover_rule).
leftover = leftover_rule(BUFFERS, HEAD_TENSORS)


def config_to_hf(cfg: ModelConfig) -> tuple[dict, str]:
    """ModelConfig → (``config.json`` dict, tensor-name prefix); ValueError if not GPT-2-shaped."""
    require(cfg, "GPT-2", family="decoder", position="learned", norm="layer", norm_bias=True,
            norm_position="pre", embedding_norm=False, use_bias=True, gated_ffn=False,
            num_kv_heads=cfg.num_heads, head_dim=cfg.d_model // cfg.num_heads,
            attention_scale=(None, 1.0), scale_embeddings=False, rescale_tied_logits=False,
            lm_head_bias=False, type_vocab_size=0, head=("lm", "none"), position_offset=0,
            activation=tuple(TO_HF_ACTIVATIONS))
    lm = cfg.head == "lm"
    hf = {
        "model_type": MODEL_TYPE, "architectures": ["GPT2LMHeadModel" if lm else "GPT2Model"],
        "vocab_size": cfg.vocab_size, "n_positions": cfg.max_len, "n_embd": cfg.d_model,
        "n_layer": cfg.num_layers, "n_head": cfg.num_heads, "n_inner": cfg.d_ff,
        "activation_function": TO_HF_ACTIVATIONS[cfg.activation],
        "resid_pdrop": cfg.dropout_rate, "embd_pdrop": cfg.dropout_rate,
        "attn_pdrop": cfg.attention_dropout_rate, "layer_norm_epsilon": cfg.norm_eps,
        "initializer_range": cfg.init_std, "scale_attn_weights": cfg.attention_scale is None,
        "tie_word_embeddings": cfg.tie_embeddings, "dtype": "float32",
    }
    return hf, "transformer." if lm else ""
