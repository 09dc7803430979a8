"""Mixtral (Jiang et al. 2024) and Qwen2-MoE ↔ jaxformer ``family="decoder"`` with MoE FFNs.

Llama's graph (`jaxformer.convert.hf_llama`: attention, RoPE, norms, head and their tensor names)
with the feed-forward block of every sparse layer replaced by a top-k router over ``E`` SwiGLU
experts (`jaxformer.ops.moe`). HF names of a sparse layer ``model.layers.{i}.`` (nn.Linear,
`[out, in]`; transformers 5 fuses the experts in memory but saves and loads these names):

==========  ===================================================  =====================================
variant     tensors                                              routing (HF's router, float32)
==========  ===================================================  =====================================
mixtral     ``block_sparse_moe.gate`` `[E, D]`;                  softmax over all E logits, top-k,
            ``block_sparse_moe.experts.{e}.w1`` (gate, our       renormalised over the k
            ``wi``), ``w3`` (up, ``wi_gate``), ``w2`` (down,     (= ``norm_topk_prob``); dropless
            ``wo``)
qwen2_moe   ``mlp.gate``; ``mlp.experts.{e}.{gate,up,down}_      softmax, top-k, renormalised iff
            proj``; ``mlp.shared_expert.{gate,up,down}_proj``    ``norm_topk_prob``; dropless; plus
            (our ``ffn/shared``), ``mlp.shared_expert_gate``     sigmoid(x·w) × the shared expert
            `[1, D]` (our ``ffn/shared_gate`` `[D, 1]`)
==========  ===================================================  =====================================

HF runs every routed assignment (no capacity), so imports set ``moe_dropless=True``; a model trained
with a capacity exports as it is (HF then drops nothing). HF config names understood on import:
``num_local_experts`` / ``num_experts`` → ``num_experts``, ``num_experts_per_tok`` →
``experts_per_token``, ``decoder_sparse_step`` → ``moe_every``, ``moe_intermediate_size`` →
``moe_d_ff``, ``shared_expert_intermediate_size`` → ``num_shared_experts`` (its multiple of
``moe_intermediate_size``), ``norm_topk_prob``, ``router_jitter_noise``, ``router_aux_loss_coef`` →
``router_aux_loss_weight``. Qwen2-MoE's ``mlp_only_layers`` (dense layers named one by one) is
refused unless empty: our sparse layers are ``moe_every``'s pattern.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from jaxformer.config import ModelConfig
from jaxformer.convert import hf_llama
from jaxformer.convert.mapping import Rule, experts_linear, linear, require

MODEL_TYPES = ("mixtral", "qwen2_moe")
HEADS = hf_llama.HEADS
CLASS_PREFIX = {"mixtral": "Mixtral", "qwen2_moe": "Qwen2Moe"}
# per model type: (the sparse block's name, the experts' (gate, up, down) tensor names)
MOE_NAMES = {"mixtral": ("block_sparse_moe", ("w1", "w3", "w2")),
             "qwen2_moe": ("mlp", ("gate_proj", "up_proj", "down_proj"))}
leftover = hf_llama.leftover


def _qwen2_moe_fields(hf: Mapping) -> dict:
    if hf.get("mlp_only_layers"):
        raise ValueError(f"config.json mlp_only_layers={hf['mlp_only_layers']} is not supported: "
                         "jaxformer's sparse layers are every decoder_sparse_step-th (moe_every); "
                         "use mlp_only_layers=[]")
    expert, shared = hf["moe_intermediate_size"], hf["shared_expert_intermediate_size"]
    if shared % expert or not shared:
        raise ValueError(f"config.json shared_expert_intermediate_size={shared} is not supported: "
                         f"jaxformer's shared FFN is num_shared_experts × moe_intermediate_size="
                         f"{expert} wide (a positive multiple)")
    return dict(num_experts=hf["num_experts"], moe_every=hf.get("decoder_sparse_step", 1),
                moe_d_ff=expert, num_shared_experts=shared // expert, shared_expert_gate=True,
                norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
                qkv_bias=bool(hf.get("qkv_bias", True)))


def config_from_hf(hf: Mapping, tensors: Mapping[str, np.ndarray], *, head: str | None,
                   num_classes: int | None) -> tuple[dict, str]:
    """``config.json`` → (ModelConfig kwargs, name prefix): Llama's fields, then the router's."""
    kind = hf["model_type"]
    # Qwen2-MoE's attention is Qwen2's (q/k/v biases, its sliding-window refusal)
    cfg, prefix = hf_llama.config_from_hf({**hf, "model_type": "qwen2" if kind == "qwen2_moe"
                                           else kind}, tensors, head=head, num_classes=num_classes)
    if kind == "mixtral":
        cfg.update(num_experts=hf["num_local_experts"], norm_topk_prob=True)
    else:
        cfg.update(_qwen2_moe_fields(hf))
    cfg.update(experts_per_token=hf["num_experts_per_tok"], moe_dropless=True,
               router_jitter_noise=float(hf.get("router_jitter_noise") or 0.0),
               router_aux_loss_weight=float(hf.get("router_aux_loss_coef", 0.0)),
               router_z_loss_weight=0.0)
    return cfg, prefix


def model_type_of(cfg: ModelConfig) -> str:
    """qwen2_moe for a model with shared experts, else mixtral."""
    return "qwen2_moe" if cfg.num_shared_experts else "mixtral"


def _moe_rules(cfg: ModelConfig, kind: str, b: str, t: str) -> list[Rule]:
    """Layer ``b`` (our path) ↔ ``t`` (HF prefix): router, experts, shared expert and its gate."""
    d, f, e = cfg.d_model, cfg.moe_d_ff, cfg.num_experts
    block, (gate, up, down) = MOE_NAMES[kind]
    m, x = f"{b}ffn/", f"{t}{block}."

    def experts(name):
        return [f"{x}experts.{i}.{name}.weight" for i in range(e)]

    out = [linear(f"{m}router/kernel", f"{x}gate.weight", (d,), (e,)),
           experts_linear(f"{m}wi/kernel", experts(gate), (d,), (f,)),
           experts_linear(f"{m}wi_gate/kernel", experts(up), (d,), (f,)),
           experts_linear(f"{m}wo/kernel", experts(down), (f,), (d,))]
    if cfg.num_shared_experts:
        s = cfg.num_shared_experts * f
        out += [linear(f"{m}shared/wi/kernel", f"{x}shared_expert.gate_proj.weight", (d,), (s,)),
                linear(f"{m}shared/wi_gate/kernel", f"{x}shared_expert.up_proj.weight", (d,), (s,)),
                linear(f"{m}shared/wo/kernel", f"{x}shared_expert.down_proj.weight", (s,), (d,)),
                linear(f"{m}shared_gate/kernel", f"{x}shared_expert_gate.weight", (d,), (1,))]
    return out


def rules(cfg: ModelConfig, prefix: str, *, export: bool = False) -> list[Rule]:
    """Rules for every parameter of ``cfg`` (unrolled layout): `hf_llama.rules` with the dense FFN
    of each sparse layer (`ModelConfig.moe_layer`) replaced."""
    kind = model_type_of(cfg)
    sparse = [i for i in range(cfg.num_layers) if cfg.moe_layer(i)]
    dense_ffn = tuple(f"decoder/layer_{i}/ffn/" for i in sparse)
    out = [r for r in hf_llama.rules(cfg, prefix, export=export)
           if not r.params[0].startswith(dense_ffn)]
    for i in sparse:
        out += _moe_rules(cfg, kind, f"decoder/layer_{i}/", f"{prefix}layers.{i}.")
    return out


def config_to_hf(cfg: ModelConfig) -> tuple[dict, str]:
    """ModelConfig → (``config.json`` dict, tensor-name prefix); ValueError naming the fields a
    Mixtral / Qwen2-MoE cannot express."""
    kind = model_type_of(cfg)
    # the attention and the rest as Mistral (no biases, a window) or Qwen2 (q/k/v biases)
    dense, prefix = hf_llama.config_to_hf(cfg.replace(
        num_experts=0, num_shared_experts=0, shared_expert_gate=False,
        qkv_bias=cfg.qkv_bias if kind == "mixtral" else True))
    if kind == "mixtral":
        require(cfg, "Mixtral", use_bias=False, qkv_bias=False, moe_every=1, moe_d_ff=cfg.d_ff,
                norm_topk_prob=True)
        moe = {"num_local_experts": cfg.num_experts, "sliding_window": cfg.sliding_window}
    else:
        require(cfg, "Qwen2Moe", use_bias=False, shared_expert_gate=True)
        moe = {"num_experts": cfg.num_experts, "decoder_sparse_step": cfg.moe_every,
               "moe_intermediate_size": cfg.moe_d_ff, "mlp_only_layers": [],
               "shared_expert_intermediate_size": cfg.num_shared_experts * cfg.moe_d_ff,
               "norm_topk_prob": cfg.norm_topk_prob, "qkv_bias": cfg.qkv_bias}
    for key in ("attention_bias", "mlp_bias"):
        dense.pop(key, None)
    return {**dense, **moe, "model_type": kind,
            "architectures": [CLASS_PREFIX[kind] + hf_llama.ARCHITECTURES[cfg.head]],
            "num_experts_per_tok": cfg.experts_per_token,
            "router_jitter_noise": cfg.router_jitter_noise,
            "router_aux_loss_coef": cfg.router_aux_loss_weight, "output_router_logits": False}, prefix
