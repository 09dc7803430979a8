"""BART (Lewis et al. 2020) ↔ jaxformer ``family="encoder_decoder"``, post-LN.

HF names (``BartForConditionalGeneration``, prefixed with ``model.``): the ``shared`` token table
(``encoder.embed_tokens`` / ``decoder.embed_tokens`` are tied copies, scaled by sqrt(d_model) when
``scale_embedding``); per stack ``{encoder,decoder}.embed_positions`` `[max_position_embeddings + 2,
D]` (position ``p`` reads row ``p + 2``: ``ModelConfig.position_offset=2``) and
``layernorm_embedding``; ``layers.{i}.self_attn.{q,k,v,out}_proj`` + ``self_attn_layer_norm``,
decoder ``encoder_attn.*`` + ``encoder_attn_layer_norm``, ``fc1``/``fc2`` + ``final_layer_norm``
(post-LN: LayerNorm(x + Sublayer(x)), eps 1e-5, no final stack norm). ``lm_head`` is tied to
``shared``; the buffer ``final_logits_bias`` `[1, V]` is our ``lm_head/bias``.

mBART-style variants (``normalize_before``, ``add_final_layer_norm``) and stacks of different
widths (encoder vs decoder heads or FFN size) have no jaxformer equivalent and are refused.
Generation starts the decoder from ``decoder_start_token_id`` (BART: 2, ``</s>``), which
`jaxformer.decode` takes as ``decoder_start_id``.
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
    layer_norm,
    leftover_rule,
    linear,
    require,
    reshape,
)

MODEL_TYPE = "bart"
OFFSET = 2  # BartLearnedPositionalEmbedding.offset
NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, not a config entry
BUFFERS = re.compile(r"^(model\.)?(encoder|decoder)\.embed_tokens\.weight$")
# BartConfig's token ids (fairseq's dictionary: <s> 0, <pad> 1, </s> 2): exports write them unless
# the source's config.json gives others.
TOKEN_IDS = {"bos_token_id": 0, "pad_token_id": 1, "eos_token_id": 2,
             "decoder_start_token_id": 2, "forced_eos_token_id": 2}
UNSUPPORTED = ("normalize_before", "add_final_layer_norm", "static_position_embeddings",
               "add_bias_logits")


def _prefix(tensors) -> str:
    return "model." if any(k.startswith("model.") for k in tensors) else ""


def _same(hf: Mapping, encoder_key: str, decoder_key: str) -> int:
    if hf[encoder_key] != hf[decoder_key]:
        raise ValueError(f"BART {decoder_key}={hf[decoder_key]} differs from {encoder_key}="
                         f"{hf[encoder_key]}: jaxformer's encoder and decoder share one value")
    return hf[encoder_key]


def config_from_hf(hf: Mapping, tensors: Mapping[str, np.ndarray], *, head: str | None,
                   num_classes: int | None) -> tuple[dict, str]:
    """``config.json`` (+ tensors: is ``lm_head`` tied?) → (ModelConfig kwargs, name prefix)."""
    if head not in (None, "lm"):
        raise ValueError(f"head={head!r} is not available for BART; only 'lm'")
    arch = (hf.get("architectures") or ["BartForConditionalGeneration"])[0]
    if arch not in ("BartForConditionalGeneration", "BartModel"):
        raise ValueError(f"architectures={[arch]} is not supported for BART; supported: "
                         "BartForConditionalGeneration (or a BartModel backbone)")
    for flag in UNSUPPORTED:
        if hf.get(flag):
            raise ValueError(f"BART {flag}={hf[flag]!r} is not supported (an mBART-style or old "
                             "BART variant with no jaxformer equivalent)")
    if hf.get("normalize_embedding") is False:
        raise ValueError("BART normalize_embedding=False is not supported (jaxformer's BART has "
                         "layernorm_embedding)")
    prefix = _prefix(tensors)
    tied = is_tied(tensors, "lm_head.weight", f"{prefix}shared.weight")
    cfg = dict(
        family="encoder_decoder", vocab_size=hf["vocab_size"], d_model=hf["d_model"],
        num_heads=_same(hf, "encoder_attention_heads", "decoder_attention_heads"),
        d_ff=_same(hf, "encoder_ffn_dim", "decoder_ffn_dim"), num_layers=hf["encoder_layers"],
        num_encoder_layers=hf["encoder_layers"], num_decoder_layers=hf["decoder_layers"],
        max_len=hf["max_position_embeddings"], position="learned", position_offset=OFFSET,
        norm="layer", norm_position="post", norm_eps=NORM_EPS, embedding_norm=True,
        activation=from_hf_activation(hf.get("activation_function", "gelu"),
                                      "activation_function"),
        use_bias=True, tie_embeddings=tied, scale_embeddings=bool(hf.get("scale_embedding")),
        lm_head_bias=True, head="lm", dropout_rate=hf.get("dropout", 0.1),
        attention_dropout_rate=hf.get("attention_dropout", 0.0),
        ffn_dropout_rate=hf.get("activation_dropout", 0.0), init_scheme="normal",
        init_std=hf.get("init_std", 0.02))
    return cfg, prefix


def _attention(param: str, tensor: str, cfg: ModelConfig) -> list[Rule]:
    d, h, dh = cfg.d_model, cfg.num_heads, cfg.head_dim
    out = []
    for name, hf_name in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
        out += dense_rules(f"{param}/{name}", f"{tensor}.{hf_name}", (d,), (h, dh))
    return out + dense_rules(f"{param}/out", f"{tensor}.out_proj", (h, dh), (d,))


def rules(cfg: ModelConfig, prefix: str = "model.", *, export: bool = False) -> list[Rule]:
    """Rules for every parameter of ``cfg`` (unrolled layout)."""
    d, f, v = cfg.d_model, cfg.d_ff, cfg.vocab_size
    out = [copy("token_embed/embedding", f"{prefix}shared.weight", (v, d)),
           reshape("lm_head/bias", "final_logits_bias", (v,), (1, v))]
    stacks = (("encoder", cfg.num_encoder_layers, False), ("decoder", cfg.num_decoder_layers, True))
    for stack, n, cross in stacks:
        s = f"{prefix}{stack}."
        out += [copy(f"{stack}_embed/pos_embedding", f"{s}embed_positions.weight",
                     (cfg.max_len + cfg.position_offset, d)),
                *layer_norm(f"{stack}_embed/norm", f"{s}layernorm_embedding", d)]
        for i in range(n):
            b, t = f"{stack}/layer_{i}/", f"{s}layers.{i}."
            out += [*_attention(f"{b}self_attn", f"{t}self_attn", cfg),
                    *layer_norm(f"{b}self_attn_norm", f"{t}self_attn_layer_norm", d)]
            if cross:
                out += [*_attention(f"{b}cross_attn", f"{t}encoder_attn", cfg),
                        *layer_norm(f"{b}cross_attn_norm", f"{t}encoder_attn_layer_norm", d)]
            out += [*dense_rules(f"{b}ffn/wi", f"{t}fc1", (d,), (f,)),
                    *dense_rules(f"{b}ffn/wo", f"{t}fc2", (f,), (d,)),
                    *layer_norm(f"{b}ffn_norm", f"{t}final_layer_norm", d)]
    if not cfg.tie_embeddings:
        out.append(linear("lm_head/kernel", "lm_head.weight", (d,), (v,)))
    return out


# What a checkpoint tensor no rule used is: "ignore", "drop" or "unknown" (mapping.leftover_rule).
leftover = leftover_rule(BUFFERS)


def config_to_hf(cfg: ModelConfig) -> tuple[dict, str]:
    """ModelConfig → (``config.json`` dict, "model."); ValueError if not BART-shaped."""
    require(cfg, "BART", family="encoder_decoder", position="learned", position_offset=OFFSET,
            norm="layer", norm_bias=True, norm_position="post", norm_eps=NORM_EPS,
            embedding_norm=True, use_bias=True, gated_ffn=False, num_kv_heads=cfg.num_heads,
            head_dim=cfg.d_model // cfg.num_heads, attention_scale=None, lm_head_bias=True,
            rescale_tied_logits=False, type_vocab_size=0, head="lm",
            activation=tuple(TO_HF_ACTIVATIONS))
    hf = {
        "model_type": MODEL_TYPE, "architectures": ["BartForConditionalGeneration"],
        "vocab_size": cfg.vocab_size, "d_model": cfg.d_model,
        "encoder_layers": cfg.num_encoder_layers, "decoder_layers": cfg.num_decoder_layers,
        "encoder_attention_heads": cfg.num_heads, "decoder_attention_heads": cfg.num_heads,
        "encoder_ffn_dim": cfg.d_ff, "decoder_ffn_dim": cfg.d_ff,
        "max_position_embeddings": cfg.max_len,
        "activation_function": TO_HF_ACTIVATIONS[cfg.activation], "dropout": cfg.dropout_rate,
        "attention_dropout": cfg.attention_dropout_rate,
        "activation_dropout": cfg.ffn_dropout_rate, "init_std": cfg.init_std,
        "scale_embedding": cfg.scale_embeddings, "tie_word_embeddings": cfg.tie_embeddings,
        "is_encoder_decoder": True, "dtype": "float32",
    }
    return hf, "model."
