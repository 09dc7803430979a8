"""Switch Transformers (Fedus et al. 2022) ↔ jaxformer ``family="encoder_decoder"`` with MoE FFNs.

T5 v1.0's graph (`jaxformer.convert.hf_t5`: relative attention, RMS norms, tied head with the
d_model^-0.5 rescale) whose FFN tensors are named ``layer.{j}.mlp.{wi,wo}`` (dense, ReLU by
``dense_act_fn``) and, in a sparse layer, ``layer.{j}.mlp.router.classifier`` `[E, D]` +
``layer.{j}.mlp.experts.expert_{e}.{wi,wo}`` (our ``ffn/router`` `[D, E]`, ``ffn/wi`` `[E, D, F]`,
``ffn/wo`` `[E, F, D]`).

Routing (HF ``SwitchTransformersTop1Router``, float32): top-1 of the softmax, the gate its
probability (``norm_topk_prob=False``); per sequence, tokens are served in order (``cumsum`` over the
sequence) and those past ``expert_capacity`` go through the residual only, which is our capacity
path with ``experts_per_token=1`` (`jaxformer.ops.moe.positions_in_expert`). HF's capacity is a
count per sequence, ours ``ceil(capacity_factor · length / E)``: imports set ``capacity_factor =
expert_capacity · E / max_len``, so the two agree at ``max_len`` tokens; a shorter call has a
proportionally smaller capacity than HF's fixed count (set ``capacity_factor`` for your lengths, or
``moe_dropless=True`` when HF would drop nothing). Exports write ``expert_capacity = ceil(
capacity_factor · max_len / E)`` (``max_len`` for a dropless model). Padding takes capacity in HF
and none in ours; with right padding this changes no real token's routing.

Sparse layers: HF derives the step from ``num_layers // num_sparse_encoder_layers`` (and likewise
for the decoder; its saved ``*_sparse_step`` are recomputed) and makes layer i sparse when
``i % step == 1`` or the step is 1; ours are every ``moe_every``-th layer. Imports find the
``moe_every`` that gives HF's layers in both stacks, or refuse naming the fields. HF config names:
``num_experts``, ``router_jitter_noise`` (training only), ``router_aux_loss_coef`` →
``router_aux_loss_weight``, ``router_z_loss_coef`` → ``router_z_loss_weight``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np

from jaxformer.config import ModelConfig
from jaxformer.convert import hf_t5
from jaxformer.convert.mapping import TO_HF_ACTIVATIONS, Rule, experts_linear, linear, require

MODEL_TYPE = "switch_transformers"
ARCHITECTURE = "SwitchTransformersForConditionalGeneration"
leftover = hf_t5.leftover


def hf_sparse_layers(num_layers: int, num_sparse: int) -> list[int]:
    """The sparse layers of an HF Switch stack (``SwitchTransformersConfig`` + ``Stack``)."""
    step = num_layers // num_sparse if num_sparse > 0 else num_layers
    return [i for i in range(num_layers) if step > 0 and (i % step == 1 or step == 1)]


def _our_sparse_layers(num_layers: int, moe_every: int) -> list[int]:
    return [i for i in range(num_layers) if (i + 1) % moe_every == 0]


def _moe_every(hf: Mapping) -> int:
    """The ``moe_every`` whose sparse layers are HF's in both stacks; ValueError if none is."""
    enc = hf_sparse_layers(hf["num_layers"], hf["num_sparse_encoder_layers"])
    n_dec = hf.get("num_decoder_layers") or hf["num_layers"]
    dec = hf_sparse_layers(n_dec, hf["num_sparse_decoder_layers"])
    for every in range(1, max(hf["num_layers"], n_dec) + 1):
        if (_our_sparse_layers(hf["num_layers"], every) == enc
                and _our_sparse_layers(n_dec, every) == dec and enc + dec):
            return every
    raise ValueError(f"config.json num_sparse_encoder_layers={hf['num_sparse_encoder_layers']} "
                     f"and num_sparse_decoder_layers={hf['num_sparse_decoder_layers']} make layers "
                     f"{enc} (encoder) and {dec} (decoder) sparse; jaxformer's moe_every makes "
                     "layers i with (i + 1) % moe_every == 0 sparse in both stacks: no value gives "
                     "these")


def config_from_hf(hf: Mapping, tensors: Mapping[str, np.ndarray], *, head: str | None,
                   num_classes: int | None) -> tuple[dict, str]:
    """``config.json`` → (ModelConfig kwargs, ""): T5's fields, then the router's."""
    for field, want in (("router_bias", False), ("router_dtype", "float32")):
        if hf.get(field, want) != want:
            raise ValueError(f"config.json {field}={hf[field]!r} is not supported: jaxformer's "
                             f"router has no bias and runs in float32 ({field}={want!r})")
    cfg, prefix = hf_t5.config_from_hf({**hf, "feed_forward_proj": hf.get("dense_act_fn", "relu")},
                                       tensors, head=head, num_classes=num_classes)
    e = hf["num_experts"]
    cfg.update(num_experts=e, experts_per_token=1, norm_topk_prob=False, moe_every=_moe_every(hf),
               capacity_factor=hf["expert_capacity"] * e / cfg["max_len"], moe_dropless=False,
               router_jitter_noise=float(hf.get("router_jitter_noise", 0.0)),
               router_aux_loss_weight=float(hf.get("router_aux_loss_coef", 0.0)),
               router_z_loss_weight=float(hf.get("router_z_loss_coef", 0.0)))
    return cfg, prefix


def _renamed(rule: Rule) -> Rule:
    return dataclasses.replace(rule, tensors=tuple(n.replace(".DenseReluDense.", ".mlp.")
                                                   for n in rule.tensors))


def rules(cfg: ModelConfig, prefix: str = "", *, export: bool = False) -> list[Rule]:
    """`hf_t5.rules` under Switch's FFN names, the FFN of each sparse layer replaced by the router
    and the experts."""
    d, f, e = cfg.d_model, cfg.moe_d_ff, cfg.num_experts
    sparse = [(stack, i, 2 if stack == "decoder" else 1)
              for stack, n in (("encoder", cfg.num_encoder_layers), ("decoder", cfg.num_decoder_layers))
              for i in range(n) if cfg.moe_layer(i)]
    dense_ffn = tuple(f"{stack}/layer_{i}/ffn/" for stack, i, _ in sparse)
    out = [_renamed(r) for r in hf_t5.rules(cfg, prefix, export=export)
           if not r.params[0].startswith(dense_ffn)]
    for stack, i, j in sparse:
        m, x = f"{stack}/layer_{i}/ffn/", f"{stack}.block.{i}.layer.{j}.mlp."

        def experts(name, x=x):
            return [f"{x}experts.expert_{k}.{name}.weight" for k in range(e)]

        out += [linear(f"{m}router/kernel", f"{x}router.classifier.weight", (d,), (e,)),
                experts_linear(f"{m}wi/kernel", experts("wi"), (d,), (f,)),
                experts_linear(f"{m}wo/kernel", experts("wo"), (f,), (d,))]
    return out


def _num_sparse(num_layers: int, moe_every: int) -> int:
    """HF's ``num_sparse_*_layers`` that makes our sparse layers sparse (the largest: the count of
    them when that works); ValueError if none does."""
    ours = _our_sparse_layers(num_layers, moe_every)
    for n in range(num_layers, 0, -1):
        if hf_sparse_layers(num_layers, n) == ours:
            return n
    raise ValueError(f"this model config has no Hugging Face SwitchTransformers equivalent: "
                     f"moe_every={moe_every} with {num_layers} layers makes layers {ours} sparse, "
                     "which no num_sparse_*_layers gives (HF: i % step == 1)")


def config_to_hf(cfg: ModelConfig) -> tuple[dict, str]:
    """ModelConfig → (``config.json`` dict, ""); ValueError naming what a Switch Transformer
    cannot express."""
    require(cfg, "SwitchTransformers", experts_per_token=1, norm_topk_prob=False, gated_ffn=False,
            moe_d_ff=cfg.d_ff, num_shared_experts=0)
    t5, prefix = hf_t5.config_to_hf(cfg.replace(num_experts=0))
    t5.pop("feed_forward_proj")
    e = cfg.num_experts
    capacity = cfg.max_len if cfg.moe_dropless else math.ceil(cfg.capacity_factor * cfg.max_len / e)
    return {**t5, "model_type": MODEL_TYPE, "architectures": [ARCHITECTURE],
            "dense_act_fn": TO_HF_ACTIVATIONS[cfg.activation], "num_experts": e,
            "expert_capacity": capacity,
            "num_sparse_encoder_layers": _num_sparse(cfg.num_encoder_layers, cfg.moe_every),
            "num_sparse_decoder_layers": _num_sparse(cfg.num_decoder_layers, cfg.moe_every),
            "router_bias": False, "router_dtype": "float32", "router_ignore_padding_tokens": False,
            "router_jitter_noise": cfg.router_jitter_noise,
            "router_aux_loss_coef": cfg.router_aux_loss_weight,
            "router_z_loss_coef": cfg.router_z_loss_weight}, prefix
