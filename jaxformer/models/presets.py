"""Published architectures as `ModelConfig` keyword sets, plus CPU-sized variants: "tiny" (2 layers
of width 64, for tests) and "mini" (4 layers of width 128, T5 3 per stack, no dropout: the
``configs/*_tiny.py`` runs, which override only what differs).

Parameter counts (tested) equal the published models at the same vocabulary:
GPT-2 small 124,439,808; BERT-base-uncased 109,482,240 (with pooler, without MLM head);
T5-small v1.0 60,506,624; ALBERT-base v2 11,683,584 (Lan et al. 2019: E = 128 factorised embedding,
one block shared by the 12 layers; with pooler, without MLM head); GPT-2 medium 354,823,168;
T5-base v1.0 222,903,552; GPT-2 large 774,030,080; GPT-2 XL 1,557,611,200; BERT-large-uncased
335,141,888 (with pooler, without MLM head); T5-large v1.0 737,668,096; T5-3B 2,851,598,336;
Llama-2-7B 6,738,415,616 ("llama2_7b"; ``llama_tiny`` is its 2-layer width-64 twin with GQA);
Mixtral-8x7B 46,702,792,704 ("mixtral_8x7b"); Switch-Base-8 619,339,008 ("switch_base_8": HF
google/switch-base-8's layout, tied embeddings; ``switch_tiny`` and ``mixtral_tiny`` are the
tiny twins);
ViT-B/16 86,567,656 and ViT-L/16 304,326,632 (224×224 images, class token, 1000-way classifier, no
pooler: HF ``ViTForImageClassification``; Dosovitskiy et al. 2021 Table 1 rounds them to 86M and
307M — no layout we know of gives 307M for ViT-L: HF and timm count 304.3M; the backbone alone,
without the classifier, is 85,798,656 and 303,301,632).
ModernBERT-base 149,655,232 and -large 395,881,664 (with the MLM head; ours hold layer 0's unused
attention norm besides, d_model more: `jaxformer.models.spec` keeps every layer's tree alike).

The GPT-2 presets pad the vocabulary of 50,257 to 50,304 rows (``vocab_pad_multiple=128``, as
Megatron does), so that tensor = 2 … 128 divides the vocabulary tables; the padding is masked, so
the function is GPT-2's. Counts of what is stored include the 47 padding rows: GPT-2 small
124,475,904 (= 124,439,808 + 47 · 768), medium 354,871,296 (+ 47 · 1024), large 774,090,240
(+ 47 · 1280), XL 1,557,686,400 (+ 47 · 1600); with
``vocab_pad_multiple=1`` they are the published counts. The other presets' vocabularies are left
as published (T5's 32,128 and Llama's 32,000 are multiples of 128 already).

Each family initialises as its reference does (``init_scheme``, rules in
`jaxformer.models.spec.initializer_of`): GPT-2 "gpt2", BERT and ALBERT "bert", T5 "t5" (with
``init_std`` = 1.0, T5's factor), the Vaswani presets "transformer" (tensor2tensor's; embeddings
at d_model^-1/2).

``<name>_bf16`` (gpt2_small … gpt2_xl, bert_base, bert_large, t5_base, t5_large, t5_3b,
llama2_7b, modernbert_base, modernbert_large): the same model computing in bfloat16 with float32
parameters, for GPUs and TPUs, and without attention dropout so that the fused kernels can run it.

Every preset states ``attention_impl="auto"``: the fastest implementation the platform it runs on
(or is compiled for: ``jaxformer-compile --topology``) has for the model, resolved when the model
runs (`ModelConfig.attention_kernel`), so a preset validates on any machine and a checkpoint moves
between them. On a TPU that is splash for GPT and our Pallas flash kernel for BERT and T5
(bidirectional attention; T5's relative bias), on a CUDA GPU cuDNN (for the bf16 presets: the
kernels take no attention dropout and cuDNN no float32), on a CPU "xla"
(`jaxformer.ops.kernel_choice.FASTEST`).
"""

from __future__ import annotations

from typing import Any

from jaxformer.config import ModelConfig

_GPT2 = dict(family="decoder", position="learned", norm="layer", norm_position="pre", norm_eps=1e-5,
             activation="gelu_tanh", use_bias=True, tie_embeddings=True, dropout_rate=0.1,
             attention_dropout_rate=0.1, init_scheme="gpt2")
_BERT = dict(family="encoder", position="learned", norm="layer", norm_position="post", norm_eps=1e-12,
             activation="gelu", use_bias=True, embedding_norm=True, type_vocab_size=2, head="mlm",
             mlm_transform=True, lm_head_bias=True, pooler=True, pooling="first",
             dropout_rate=0.1, attention_dropout_rate=0.1, init_scheme="bert")
# ALBERT v2: BERT's layout with a factorised embedding, one shared block, gelu_new and no dropout.
_ALBERT = dict(_BERT, activation="gelu_tanh", share_layers=True, dropout_rate=0.0,
               attention_dropout_rate=0.0)
_T5_V1_0 = dict(family="encoder_decoder", position="relative", norm="rms", norm_position="pre",
                norm_eps=1e-6, activation="relu", use_bias=False, attention_scale=1.0,
                tie_embeddings=True, rescale_tied_logits=True, relative_num_buckets=32,
                relative_max_distance=128, dropout_rate=0.1, attention_dropout_rate=0.1,
                ffn_dropout_rate=0.1, init_scheme="t5", init_std=1.0)
# Llama 2 (Touvron et al. 2023 §2.2): pre-RMSNorm, SwiGLU, RoPE, no biases, untied head; HF's
# initializer_range 0.02 for every weight, no dropout. Mistral / Qwen2 add sliding_window / qkv_bias.
_LLAMA = dict(family="decoder", position="rope", norm="rms", norm_position="pre", norm_eps=1e-5,
              activation="silu", gated_ffn=True, use_bias=False, tie_embeddings=False,
              rope_theta=10_000.0, dropout_rate=0.0, attention_dropout_rate=0.0,
              init_scheme="normal", init_std=0.02)
# ModernBERT (Warner et al. 2024; HF ModernBertConfig): pre-LN without biases, GeGLU, RoPE with θ
# 160,000 on the global layers (every third) and 10,000 on the local ones (window 128), layer 0
# without its attention norm, the MLM head's dense + norm and its decoder bias; no dropout.
_MODERNBERT = dict(family="encoder", position="rope", rope_theta=160_000.0, local_rope_theta=10_000.0,
                   local_attention=128, global_attn_every_n_layers=3, first_attn_norm=False,
                   norm="layer", norm_bias=False, norm_eps=1e-5, norm_position="pre",
                   embedding_norm=True, activation="gelu", gated_ffn=True, use_bias=False,
                   type_vocab_size=0, head="mlm", mlm_transform=True, lm_head_bias=True,
                   pooling="first", dropout_rate=0.0, attention_dropout_rate=0.0,
                   init_scheme="bert", init_std=0.02)
_BF16 = dict(dtype="bfloat16", param_dtype="float32", attention_dropout_rate=0.0)
_VASWANI = dict(family="encoder_decoder", position="sinusoidal", norm="layer", norm_position="post",
                norm_eps=1e-6, activation="relu", use_bias=True, tie_embeddings=True,
                scale_embeddings=True, dropout_rate=0.1, attention_dropout_rate=0.0,
                init_scheme="transformer", init_std=1.0, embed_init_std=512 ** -0.5)
# ViT (Dosovitskiy et al. 2021, Table 1), as HF's google/vit-*-patch16-224 configs: pre-LN (eps
# 1e-12), exact GELU, class token read by a 1000-way classifier after the final norm, no pooler, no
# dropout, truncated-normal init at 0.02. No vocabulary (images in place of tokens).
_VIT = dict(family="encoder", image_size=224, patch_size=16, num_channels=3, class_token=True,
            position="learned", norm="layer", norm_position="pre", norm_eps=1e-12, activation="gelu",
            use_bias=True, head="classify", num_classes=1000, pooling="first", pooler=False,
            dropout_rate=0.0, attention_dropout_rate=0.0, init_scheme="bert")

# The configs' CPU-sized models: minutes per thousand steps on a laptop CPU.
_MINI = dict(vocab_size=2048, d_model=128, num_heads=4, d_ff=512, num_layers=4, max_len=128,
             dropout_rate=0.0, attention_dropout_rate=0.0)

PRESETS: dict[str, dict[str, Any]] = {
    "gpt2_small": dict(_GPT2, vocab_size=50257, d_model=768, num_heads=12, d_ff=3072, num_layers=12,
                       max_len=1024, vocab_pad_multiple=128),
    "gpt2_medium": dict(_GPT2, vocab_size=50257, d_model=1024, num_heads=16, d_ff=4096,
                        num_layers=24, max_len=1024, vocab_pad_multiple=128),
    # Radford et al. 2019 Table 2 (HF gpt2-large, gpt2-xl): 774,030,080 and 1,557,611,200 at 50,257.
    "gpt2_large": dict(_GPT2, vocab_size=50257, d_model=1280, num_heads=20, d_ff=5120,
                       num_layers=36, max_len=1024, vocab_pad_multiple=128),
    "gpt2_xl": dict(_GPT2, vocab_size=50257, d_model=1600, num_heads=25, d_ff=6400, num_layers=48,
                    max_len=1024, vocab_pad_multiple=128),
    "gpt_tiny": dict(_GPT2, vocab_size=512, d_model=64, num_heads=4, d_ff=256, num_layers=2,
                     max_len=128),
    "gpt_mini": dict(_GPT2, **_MINI),
    "bert_base": dict(_BERT, vocab_size=30522, d_model=768, num_heads=12, d_ff=3072, num_layers=12,
                      max_len=512),
    # Devlin et al. 2019 §3 BERT-LARGE (L=24, H=1024, A=16; HF bert-large-uncased): 335,141,888.
    "bert_large": dict(_BERT, vocab_size=30522, d_model=1024, num_heads=16, d_ff=4096,
                       num_layers=24, max_len=512),
    "bert_tiny": dict(_BERT, vocab_size=512, d_model=64, num_heads=4, d_ff=256, num_layers=2,
                      max_len=128),
    "bert_mini": dict(_BERT, **_MINI),
    "albert_base_v2": dict(_ALBERT, vocab_size=30000, embedding_size=128, d_model=768, num_heads=12,
                           d_ff=3072, num_layers=12, max_len=512),
    "albert_tiny": dict(_ALBERT, vocab_size=512, embedding_size=16, d_model=64, num_heads=4, d_ff=256,
                        num_layers=2, max_len=128),
    "t5_small": dict(_T5_V1_0, vocab_size=32128, d_model=512, num_heads=8, d_ff=2048, num_layers=6,
                     max_len=512),
    "t5_base": dict(_T5_V1_0, vocab_size=32128, d_model=768, num_heads=12, d_ff=3072, num_layers=12,
                    max_len=512),
    # Raffel et al. 2020 §3.7 (HF t5-large, t5-3b): 737,668,096 and 2,851,598,336. T5-3B's
    # attention is 32 heads of 128 (inner 4,096 ≠ d_model 1,024), its FFN 16,384 wide.
    "t5_large": dict(_T5_V1_0, vocab_size=32128, d_model=1024, num_heads=16, d_ff=4096,
                     num_layers=24, max_len=512),
    "t5_3b": dict(_T5_V1_0, vocab_size=32128, d_model=1024, num_heads=32, head_dim=128,
                  d_ff=16384, num_layers=24, max_len=512),
    "t5_tiny": dict(_T5_V1_0, vocab_size=512, d_model=64, num_heads=4, d_ff=256, num_layers=2,
                    max_len=128),
    "t5_mini": dict(_T5_V1_0, **dict(_MINI, num_layers=3, ffn_dropout_rate=0.0)),
    "llama2_7b": dict(_LLAMA, vocab_size=32000, d_model=4096, num_heads=32, d_ff=11008,
                      num_layers=32, max_len=4096),
    "llama_tiny": dict(_LLAMA, vocab_size=512, d_model=64, num_heads=4, num_kv_heads=2, d_ff=192,
                       num_layers=2, max_len=128),
    # ModernBERT-base / -large (HF ModernBertForMaskedLM): 149,655,232 and 395,881,664 with the MLM
    # head (149M / 395M as published); ours store layer 0's unused attention norm too (+ d_model).
    "modernbert_base": dict(_MODERNBERT, vocab_size=50368, d_model=768, num_heads=12, d_ff=1152,
                            num_layers=22, max_len=8192),
    "modernbert_large": dict(_MODERNBERT, vocab_size=50368, d_model=1024, num_heads=16, d_ff=2624,
                             num_layers=28, max_len=8192),
    "modernbert_tiny": dict(_MODERNBERT, vocab_size=512, d_model=64, num_heads=4, d_ff=128,
                            num_layers=3, max_len=128, local_attention=16),
    "transformer_base": dict(_VASWANI, vocab_size=37000, d_model=512, num_heads=8, d_ff=2048,
                             num_layers=6, max_len=512),
    "transformer_tiny": dict(_VASWANI, vocab_size=512, d_model=64, num_heads=4, d_ff=256,
                             num_layers=2, max_len=128, embed_init_std=64 ** -0.5),
    # ViT-B/16 and ViT-L/16 at 224 px, 1000 classes: 86,567,656 and 304,326,632 parameters (HF
    # ViTForImageClassification; the paper's Table 1 says 86M and 307M); `vit_digits`: 8×8 grey digits.
    "vit_base_16": dict(_VIT, d_model=768, num_heads=12, d_ff=3072, num_layers=12),
    "vit_large_16": dict(_VIT, d_model=1024, num_heads=16, d_ff=4096, num_layers=24),
    "vit_digits": dict(_VIT, image_size=8, patch_size=2, num_channels=1, num_classes=10, d_model=64,
                     num_heads=4, d_ff=256, num_layers=2),
}
PRESETS.update({f"{name}_bf16": dict(PRESETS[name], **_BF16)
                for name in ("gpt2_small", "gpt2_medium", "gpt2_large", "gpt2_xl", "bert_base",
                             "bert_large", "t5_base", "t5_large", "t5_3b", "llama2_7b",
                             "modernbert_base", "modernbert_large")})
# Mixture of experts (issue 62; jaxformer.ops.moe). Switch-Base-8 (Fedus et al. 2022; HF
# google/switch-base-8): T5-base v1.0 with 8 top-1 experts in every other FFN of both stacks, router
# jitter 0.01, α = 0.01 (the paper's), ST-MoE's z-loss 0.001. Mixtral 8x7B (Jiang et al. 2024; HF
# mistralai/Mixtral-8x7B-v0.1): Mistral-7B's layout (GQA 8 kv heads, RoPE θ 1e6) with 8 SwiGLU
# experts per layer, top-2 renormalised, dropless, HF's router_aux_loss_coef 0.02.
_SWITCH = dict(num_experts=8, experts_per_token=1, moe_every=2, capacity_factor=1.25,
               router_jitter_noise=0.01, router_aux_loss_weight=0.01, router_z_loss_weight=0.001)
_MIXTRAL = dict(_LLAMA, num_kv_heads=8, rope_theta=1_000_000.0, num_experts=8, experts_per_token=2,
                moe_dropless=True, router_aux_loss_weight=0.02)
PRESETS.update({
    "switch_base_8": dict(PRESETS["t5_base"], **_SWITCH),
    "switch_tiny": dict(PRESETS["t5_tiny"], **_SWITCH),
    "mixtral_8x7b": dict(_MIXTRAL, vocab_size=32000, d_model=4096, num_heads=32, d_ff=14336,
                         num_layers=32, max_len=32768),
    "mixtral_tiny": dict(_MIXTRAL, vocab_size=512, d_model=64, num_heads=4, num_kv_heads=2, d_ff=192,
                         num_layers=2, max_len=128),
})
PRESETS["mixtral_8x7b_bf16"] = dict(PRESETS["mixtral_8x7b"], **_BF16)
PRESETS = {name: dict(kw, attention_impl="auto") for name, kw in PRESETS.items()}


def preset(name: str, **overrides) -> dict[str, Any]:
    """A copy of preset ``name`` with ``overrides`` applied (validated by building a ModelConfig)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    out = dict(PRESETS[name], **overrides)
    ModelConfig.from_dict(out)
    return out
