"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B) ↔ jaxformer ``family="decoder"`` with MoE FFNs.

Qwen2's graph (`jaxformer.convert.hf_llama`: q/k/v-only biases) with the ``mlp`` of every
``decoder_sparse_step``-th layer a sparse block: ``gate`` (`[E, D]` router) → top-``num_experts_per_tok``
of its softmax (renormalised only with ``norm_topk_prob``) → ``experts.{j}``:
``down_proj(silu(gate_proj x) ⊙ up_proj x)`` (our ``wi``, ``wi_gate``, ``wo`` at ``moe_d_ff`` =
``moe_intermediate_size``), plus a ``shared_expert`` FFN every token runs, scaled by
``sigmoid(shared_expert_gate x)`` (our ``num_shared_experts`` = shared width / moe_d_ff and
``shared_expert_gate``). Other layers keep Qwen2's dense ``mlp`` (``intermediate_size``). Imports
are dropless. Checkpoints use the per-expert layout (what transformers 5 writes).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from jaxformer.config import ModelConfig
from jaxformer.convert import hf_llama
from jaxformer.convert.hf_mixtral import experts
from jaxformer.convert.mapping import Rule, experts_linear, leftover_rule, linear, require

MODEL_TYPES = ("qwen2_moe",)
CLASS_PREFIX = "Qwen2Moe"


def config_from_hf(hf: Mapping, tensors: Mapping[str, np.ndarray], *, head: str | None,
                   num_classes: int | None) -> tuple[dict, str]:
    """``config.json`` → (ModelConfig kwargs, name prefix); ValueError naming the HF field for
    what jaxformer cannot express."""
    if hf.get("mlp_only_layers"):
        raise ValueError(f"config.json mlp_only_layers={hf['mlp_only_layers']} is not supported; "
                         "jaxformer places MoE layers by decoder_sparse_step (moe_every) only")
    if not hf.get("qkv_bias", True):
        raise ValueError("config.json qkv_bias=False is not supported for Qwen2-MoE")
    moe_f, shared = hf["moe_intermediate_size"], hf["shared_expert_intermediate_size"]
    if shared % moe_f:
        raise ValueError(f"config.json shared_expert_intermediate_size={shared} is not supported: "
                         f"must be a multiple of moe_intermediate_size={moe_f} (num_shared_experts)")
    cfg, prefix = hf_llama.config_from_hf(dict(hf, model_type="qwen2"), tensors, head=head,
                                          num_classes=num_classes)
    cfg.update(num_experts=hf["num_experts"], experts_per_token=hf["num_experts_per_tok"],
               moe_every=hf.get("decoder_sparse_step", 1), moe_d_ff=moe_f,
               num_shared_experts=shared // moe_f, shared_expert_gate=True,
               norm_topk_prob=bool(hf.get("norm_topk_prob", False)), moe_dropless=True,
               router_aux_loss_weight=float(hf.get("router_aux_loss_coef", 0.001)))
    return cfg, prefix


def rules(cfg: ModelConfig, prefix: str, *, export: bool = False) -> list[Rule]:
    """Rules for every parameter of ``cfg`` (unrolled layout): Qwen2's, the MoE layers' FFN replaced."""
    moe_ffn = tuple(f"decoder/layer_{i}/ffn/" for i in range(cfg.num_layers) if cfg.moe_layer(i))
    out = [r for r in hf_llama.rules(cfg, prefix, export=export)
           if not any(p.startswith(moe_ffn) for p in r.params)]
    d, f, e = cfg.d_model, cfg.moe_d_ff, cfg.num_experts
    s = cfg.num_shared_experts * f
    for i in range(cfg.num_layers):
        if not cfg.moe_layer(i):
            continue
        m, t = f"decoder/layer_{i}/ffn/", f"{prefix}layers.{i}.mlp."
        out += [
            linear(f"{m}router/kernel", f"{t}gate.weight", (d,), (e,)),
            experts_linear(f"{m}wi/kernel", experts(t, "gate_proj", e), (d,), (f,)),
            experts_linear(f"{m}wi_gate/kernel", experts(t, "up_proj", e), (d,), (f,)),
            experts_linear(f"{m}wo/kernel", experts(t, "down_proj", e), (f,), (d,)),
            linear(f"{m}shared/wi/kernel", f"{t}shared_expert.gate_proj.weight", (d,), (s,)),
            linear(f"{m}shared/wi_gate/kernel", f"{t}shared_expert.up_proj.weight", (d,), (s,)),
            linear(f"{m}shared/wo/kernel", f"{t}shared_expert.down_proj.weight", (s,), (d,)),
            linear(f"{m}shared_gate/kernel", f"{t}shared_expert_gate.weight", (d,), (1,)),
        ]
    return out


leftover = leftover_rule(hf_llama.BUFFERS, hf_llama.HEAD_TENSORS)


def config_to_hf(cfg: ModelConfig) -> tuple[dict, str]:
    """ModelConfig → (``config.json`` dict, tensor-name prefix); ValueError if not Qwen2-MoE-shaped."""
    require(cfg, CLASS_PREFIX, use_bias=False, qkv_bias=True, shared_expert_gate=True,
            activation="silu", head=("lm", "none"), sliding_window=None)
    hf, prefix = hf_llama.config_to_hf(cfg.replace(num_experts=0, num_shared_experts=0,
                                                   shared_expert_gate=False))
    hf.update(model_type="qwen2_moe", architectures=[CLASS_PREFIX + hf_llama.ARCHITECTURES[cfg.head]],
              num_experts=cfg.num_experts, num_experts_per_tok=cfg.experts_per_token,
              decoder_sparse_step=cfg.moe_every, moe_intermediate_size=cfg.moe_d_ff,
              shared_expert_intermediate_size=cfg.num_shared_experts * cfg.moe_d_ff,
              norm_topk_prob=cfg.norm_topk_prob, router_aux_loss_coef=cfg.router_aux_loss_weight,
              mlp_only_layers=[], qkv_bias=True, output_router_logits=False)
    return hf, prefix


def is_qwen2_moe(cfg: ModelConfig) -> bool:
    """Whether ``cfg`` exports as Qwen2-MoE: a RoPE decoder with MoE FFNs and gated shared experts."""
    return (cfg.family == "decoder" and cfg.position == "rope" and cfg.num_experts > 0
            and cfg.shared_expert_gate)
