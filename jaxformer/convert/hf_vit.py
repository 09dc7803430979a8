"""The Vision Transformer (Dosovitskiy et al. 2021) ↔ jaxformer ``family="encoder"`` with
``image_size`` set.

HF names, as ``save_pretrained`` writes them (prefixed with ``vit.`` except in ``ViTModel``):
``embeddings.cls_token`` `[1, 1, D]`, ``embeddings.position_embeddings`` `[1, N + 1, D]`,
``embeddings.patch_embeddings.projection.{weight,bias}`` (a ``Conv2d`` of kernel = stride = P,
weight `[D, C, P, P]`; ours `[P, P, C, D]` over channels-last patches);
``encoder.layer.{i}.layernorm_before``, ``attention.attention.{query,key,value}``,
``attention.output.dense``, ``layernorm_after``, ``intermediate.dense``, ``output.dense`` (pre-LN);
``layernorm`` (final); ``pooler.dense`` (+ ``pooler_act``, ``ViTModel``); ``classifier``
(``ViTForImageClassification``, on the class token after the final norm). HF takes
``pixel_values`` `[B, C, H, W]`; jaxformer images are `[B, H, W, C]`.
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
    from_hf_activation,
    labels_config,
    layer_norm,
    leftover_rule,
    num_labels,
    pick_head,
    require,
    reshape,
)

MODEL_TYPE = "vit"
ARCHITECTURE_HEADS = {"ViTForImageClassification": "classify", "ViTModel": "none"}
HEADS = ("classify", "none")
BUFFERS = re.compile(r"$^")  # none
HEAD_TENSORS = re.compile(r"^classifier\.|(^|\.)pooler\.")


def patch_projection(param: str, tensor: str, p: int, c: int, d: int) -> Rule:
    """Our `[P, P, C, D]` patch kernel ↔ the ``Conv2d`` weight `[D, C, P, P]`."""
    return Rule((param,), (tensor,), ((p, p, c, d),), ((d, c, p, p),),
                lambda w: (w.transpose(2, 3, 1, 0),), lambda k: (k.transpose(3, 2, 0, 1),))


def config_from_hf(hf: Mapping, tensors: Mapping[str, np.ndarray], *, head: str | None,
                   num_classes: int | None) -> tuple[dict, str]:
    """``config.json`` (+ tensor names) → (ModelConfig kwargs, tensor-name prefix)."""
    if not hf.get("qkv_bias", True):
        raise ValueError("ViT qkv_bias=False is not supported: jaxformer's encoder keeps the biases "
                         "of all its projections together (use_bias)")
    prefix = "vit." if any(k.startswith("vit.") for k in tensors) else ""
    head = pick_head(hf, tensors, head, model="ViT", architecture_heads=ARCHITECTURE_HEADS,
                     heads=HEADS, by_tensor=(("classifier.weight", "classify"),))
    d = hf["hidden_size"]
    pooler = head == "none" and f"{prefix}pooler.dense.weight" in tensors
    if pooler and hf.get("pooler_output_size", d) != d:
        raise ValueError(f"ViT pooler_output_size={hf['pooler_output_size']} != hidden_size={d} is "
                         "not supported")
    size, patch = hf.get("image_size", 224), hf.get("patch_size", 16)
    if isinstance(size, (list, tuple)) or isinstance(patch, (list, tuple)):
        raise ValueError(f"ViT image_size={size!r}, patch_size={patch!r}: only square images and "
                         "patches (one number each) are supported")
    cfg = dict(
        family="encoder", d_model=d, num_heads=hf["num_attention_heads"],
        d_ff=hf["intermediate_size"], num_layers=hf["num_hidden_layers"], position="learned",
        norm="layer", norm_position="pre", norm_eps=hf.get("layer_norm_eps", 1e-12),
        activation=from_hf_activation(hf.get("hidden_act", "gelu"), "hidden_act"), use_bias=True,
        image_size=size, patch_size=patch, num_channels=hf.get("num_channels", 3),
        class_token=True, pooling="first", head=head, pooler=pooler,
        pooler_activation=from_hf_activation(hf.get("pooler_act", "tanh"), "pooler_act"),
        num_classes=num_labels(hf, num_classes),
        dropout_rate=hf.get("hidden_dropout_prob", 0.0),
        attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.0),
        init_scheme="bert", init_std=hf.get("initializer_range", 0.02))
    return cfg, prefix


def rules(cfg: ModelConfig, prefix: str, *, export: bool = False) -> list[Rule]:
    """Rules for every parameter of ``cfg`` (unrolled layout)."""
    del export
    d, h, dh, f = cfg.d_model, cfg.num_heads, cfg.head_dim, cfg.d_ff
    e, n = f"{prefix}embeddings.", cfg.image_length
    out = [reshape("embed/class_embedding", f"{e}cls_token", (d,), (1, 1, d)),
           reshape("embed/pos_embedding", f"{e}position_embeddings", (n, d), (1, n, d)),
           patch_projection("embed/patch_embedding/kernel", f"{e}patch_embeddings.projection.weight",
                            cfg.patch_size, cfg.num_channels, d),
           reshape("embed/patch_embedding/bias", f"{e}patch_embeddings.projection.bias", (d,))]
    for i in range(cfg.num_layers):
        b, t = f"encoder/layer_{i}/", f"{prefix}encoder.layer.{i}."
        for name in ("query", "key", "value"):
            out += dense_rules(f"{b}self_attn/{name}", f"{t}attention.attention.{name}", (d,), (h, dh))
        out += [*layer_norm(f"{b}self_attn_norm", f"{t}layernorm_before", d),
                *dense_rules(f"{b}self_attn/out", f"{t}attention.output.dense", (h, dh), (d,)),
                *layer_norm(f"{b}ffn_norm", f"{t}layernorm_after", d),
                *dense_rules(f"{b}ffn/wi", f"{t}intermediate.dense", (d,), (f,)),
                *dense_rules(f"{b}ffn/wo", f"{t}output.dense", (f,), (d,))]
    out += layer_norm("encoder_norm", f"{prefix}layernorm", d)
    if cfg.pooler:
        out += dense_rules("pooler", f"{prefix}pooler.dense", (d,), (d,))
    if cfg.head == "classify":
        out += dense_rules("classifier", "classifier", (d,), (cfg.num_classes,))
    return out


# What a checkpoint tensor no rule used is: "drop" (a head the model does not have) or "unknown".
leftover = leftover_rule(BUFFERS, HEAD_TENSORS, ())


def config_to_hf(cfg: ModelConfig) -> tuple[dict, str]:
    """ModelConfig → (``config.json`` dict, tensor-name prefix); ValueError if not ViT-shaped."""
    require(cfg, "ViT", family="encoder", position="learned", norm="layer", norm_bias=True,
            norm_position="pre", use_bias=True, gated_ffn=False, num_kv_heads=cfg.num_heads,
            head_dim=cfg.d_model // cfg.num_heads, attention_scale=None, class_token=True,
            pooling="first", activation=tuple(TO_HF_ACTIVATIONS), head=HEADS)
    if cfg.pooler and cfg.head != "none":
        raise ValueError("this model config has no Hugging Face ViT equivalent: pooler=True with "
                         f"head={cfg.head!r} (ViTForImageClassification reads the class token)")
    arch = {"classify": "ViTForImageClassification", "none": "ViTModel"}[cfg.head]
    hf = {
        "model_type": MODEL_TYPE, "architectures": [arch], "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.d_ff, "hidden_act": TO_HF_ACTIVATIONS[cfg.activation],
        "hidden_dropout_prob": cfg.dropout_rate,
        "attention_probs_dropout_prob": cfg.attention_dropout_rate,
        "initializer_range": cfg.init_std, "layer_norm_eps": cfg.norm_eps,
        "image_size": cfg.image_size, "patch_size": cfg.patch_size,
        "num_channels": cfg.num_channels, "qkv_bias": True, "encoder_stride": cfg.patch_size,
        "pooler_output_size": cfg.d_model, "pooler_act": TO_HF_ACTIVATIONS[cfg.pooler_activation],
        "dtype": "float32",
    }
    if cfg.head == "classify":
        hf.update(labels_config(cfg.num_classes))
    return hf, "" if cfg.head == "none" else "vit."
