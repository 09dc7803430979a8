"""Mixtral (Jiang et al. 2024) ↔ jaxformer ``family="decoder"`` with MoE FFNs (`jaxformer.ops.moe`).

Mistral's graph (`jaxformer.convert.hf_llama`: attention, norms, RoPE, untied ``lm_head``) with
each ``mlp`` replaced by ``block_sparse_moe``: ``gate`` (`[E, D]` router) → top-``num_experts_per_tok``
of its softmax, renormalised over the chosen (our ``norm_topk_prob``) → ``experts.{j}``:
``w2(silu(w1 x) ⊙ w3 x)`` (our ``wi`` = w1, ``wi_gate`` = w3, ``wo`` = w2, stacked on the expert
axis). HF computes every assignment: imports are dropless (``moe_dropless=True``). The checkpoint
layout is the hub's per-expert one, which transformers 5 also writes (it fuses the experts into
``gate_up_proj`` in memory only).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from jaxformer.config import ModelConfig
from jaxformer.convert import hf_llama
from jaxformer.convert.mapping import Rule, experts_linear, leftover_rule, require

MODEL_TYPES = ("mixtral",)
CLASS_PREFIX = "Mixtral"


def config_from_hf(hf: Mapping, tensors: Mapping[str, np.ndarray], *, head: str | None,
                   num_classes: int | None) -> tuple[dict, str]:
    """``config.json`` → (ModelConfig kwargs, name prefix): Mistral's fields and the experts'."""
    cfg, prefix = hf_llama.config_from_hf(dict(hf, model_type="mistral"), tensors, head=head,
                                          num_classes=num_classes)
    cfg.update(num_experts=hf["num_local_experts"], experts_per_token=hf["num_experts_per_tok"],
               norm_topk_prob=True, moe_dropless=True,
               router_aux_loss_weight=float(hf.get("router_aux_loss_coef", 0.02)),
               router_jitter_noise=float(hf.get("router_jitter_noise") or 0.0))
    return cfg, prefix


def experts(prefix: str, name: str, e: int) -> list[str]:
    """The ``e`` experts' tensor names ``{prefix}experts.{j}.{name}.weight``."""
    return [f"{prefix}experts.{j}.{name}.weight" for j in range(e)]


def rules(cfg: ModelConfig, prefix: str, *, export: bool = False) -> list[Rule]:
    """Rules for every parameter of ``cfg`` (unrolled layout): Llama's, the FFN's replaced."""
    out = [r for r in hf_llama.rules(cfg, prefix, export=export)
           if not any("/ffn/" in p for p in r.params)]
    d, f, e = cfg.d_model, cfg.moe_d_ff, cfg.num_experts
    for i in range(cfg.num_layers):
        m, t = f"decoder/layer_{i}/ffn/", f"{prefix}layers.{i}.block_sparse_moe."
        out += [
            Rule((f"{m}router/kernel",), (f"{t}gate.weight",), ((d, e),), ((e, d),),
                 lambda w: (w.T,), lambda k: (k.T,)),
            experts_linear(f"{m}wi/kernel", experts(t, "w1", e), (d,), (f,)),
            experts_linear(f"{m}wi_gate/kernel", experts(t, "w3", e), (d,), (f,)),
            experts_linear(f"{m}wo/kernel", experts(t, "w2", e), (f,), (d,)),
        ]
    return out


leftover = leftover_rule(hf_llama.BUFFERS, hf_llama.HEAD_TENSORS)


def config_to_hf(cfg: ModelConfig) -> tuple[dict, str]:
    """ModelConfig → (``config.json`` dict, tensor-name prefix); ValueError if not Mixtral-shaped."""
    require(cfg, CLASS_PREFIX, use_bias=False, qkv_bias=False, moe_every=1, norm_topk_prob=True,
            num_shared_experts=0, activation="silu", head=("lm", "none"))
    if cfg.moe_d_ff != cfg.d_ff:
        raise ValueError(f"model.moe_d_ff={cfg.moe_d_ff} has no Hugging Face Mixtral equivalent: "
                         f"its experts are intermediate_size = d_ff={cfg.d_ff} wide")
    hf, prefix = hf_llama.config_to_hf(cfg.replace(num_experts=0))
    for key in ("attention_bias", "mlp_bias"):  # Llama's; Mixtral has no bias options
        hf.pop(key, None)
    hf.update(model_type="mixtral", architectures=[CLASS_PREFIX + hf_llama.ARCHITECTURES[cfg.head]],
              sliding_window=cfg.sliding_window, num_local_experts=cfg.num_experts,
              num_experts_per_tok=cfg.experts_per_token,
              router_aux_loss_coef=cfg.router_aux_loss_weight,
              router_jitter_noise=cfg.router_jitter_noise, output_router_logits=False)
    return hf, prefix


def is_mixtral(cfg: ModelConfig) -> bool:
    """Whether ``cfg`` exports as Mixtral: a RoPE decoder with MoE FFNs."""
    return cfg.family == "decoder" and cfg.position == "rope" and cfg.num_experts > 0
