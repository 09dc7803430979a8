"""The one validated model configuration type, and what kind of setting each of its fields is.

Configs are written as `ml_collections.ConfigDict` (``configs/<name>.py: get_config()``) and read into
`ModelConfig` with `ModelConfig.from_dict`, which rejects unknown keys, non-positive sizes and
inconsistent head counts with a `ValueError` naming the field, before anything is compiled.

Every field declares its kind and its description where it is declared (``_field(kind, default,
doc)``), and every list of fields is derived from that:

==============  ===================================================  ==========================
kind            what it changes                                      may change when
==============  ===================================================  ==========================
architecture    the parameter tree, or the function it computes      never (refused, by name)
head            the output head and the modules it adds              fine-tuning (fresh head)
regularization  training noise (dropout rates)                       resuming, fine-tuning
init            the scale of freshly initialised parameters          resuming, fine-tuning
compute         how the same function is computed (dtype, remat)     resuming, fine-tuning
layout          how the same parameters are stored (param dtype,     fine-tuning
                scanned or unrolled stack, vocabulary padding)
==============  ===================================================  ==========================

`architecture_fields`, `fine_tuning_fields`, `resumable_fields` and `exported_fields` name them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from jaxformer.ops.activations import ACTIVATIONS
from jaxformer.ops.attention import IMPLEMENTATIONS
from jaxformer.ops.kernel_choice import fastest_attention
from jaxformer.ops.kernel_choice import unsupported as _kernel_cannot_run
from jaxformer.ops.patches import RESIZE_METHODS
from jaxformer.ops.positions import ROPE_SCALINGS, RopeScaling
from jaxformer.ops.stack import REMAT_POLICIES as _REMAT
from jaxformer.settings import setting

FAMILIES = ("encoder", "decoder", "encoder_decoder")
POSITIONS = ("sinusoidal", "learned", "rope", "relative", "alibi", "none")
NORMS = ("layer", "rms")
NORM_POSITIONS = ("pre", "post")
HEADS = ("lm", "mlm", "classify", "token_classify", "span", "none")  # modules: `jaxformer.models.head_parts`
POOLINGS = ("first", "last", "mean", "max")
REMAT_POLICIES = ("none", *_REMAT)  # "none": no activation checkpointing
ATTENTION_IMPLS = ("auto", *IMPLEMENTATIONS)  # "auto": `ModelConfig.attention_kernel`
DTYPES = ("float32", "bfloat16", "float16")
# Fresh-initialisation rules per family (`jaxformer.models.spec.initializer_of` holds them).
INIT_SCHEMES = ("normal", "gpt2", "bert", "t5", "transformer")

ARCHITECTURE, HEAD, REGULARIZATION, INIT, COMPUTE, LAYOUT = (
    "architecture", "head", "regularization", "init", "compute", "layout")
KINDS = (ARCHITECTURE, HEAD, REGULARIZATION, INIT, COMPUTE, LAYOUT)


def _field(kind: str, default: Any, doc: str) -> Any:
    """A `ModelConfig` field of ``kind`` (one of `KINDS`), described by ``doc`` (one line)."""
    assert kind in KINDS, kind
    return setting(default, doc, kind=kind)  # the training config's sections declare keys alike


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of any of the three families. Shapes in docstrings use these names.

    Each field declares its kind and a one-line description (``doc``) where it is declared;
    ``python train.py --config <file> --print_config`` lists them with the config's values.
    """

    # architecture: the parameter tree or the function it computes
    family: str = _field(
        ARCHITECTURE, "decoder", '"encoder" (BERT), "decoder" (GPT) or "encoder_decoder" (T5 / Vaswani)')
    vocab_size: int = _field(
        ARCHITECTURE, 32_000, "token ids are in [0, vocab_size) (>= the tokenizer's ids); the tables' "
        "rows: padded_vocab_size (vocab_pad_multiple)")
    d_model: int = _field(ARCHITECTURE, 512, "width of the hidden states")
    num_heads: int = _field(ARCHITECTURE, 8, "attention (query) heads")
    num_kv_heads: int | None = _field(
        ARCHITECTURE, None, "key/value heads (< num_heads: GQA, 1: MQA); unset = num_heads")
    head_dim: int | None = _field(
        ARCHITECTURE, None, "per-head width; unset = d_model // num_heads (T5 lets it differ)")
    d_ff: int = _field(ARCHITECTURE, 2048, "hidden width of the feed-forward block")
    num_layers: int = _field(
        ARCHITECTURE, 6, "layers of the single stack; for encoder_decoder the default of both stacks")
    num_encoder_layers: int | None = _field(
        ARCHITECTURE, None, "encoder_decoder: encoder layers; unset = num_layers")
    num_decoder_layers: int | None = _field(
        ARCHITECTURE, None, "encoder_decoder: decoder layers; unset = num_layers")
    max_len: int = _field(
        ARCHITECTURE, 512, "longest row the model takes (the size of a learned position table)")
    position_offset: int = _field(
        ARCHITECTURE, 0, "learned positions: table rows before position 0, so position p reads row "
        "p + position_offset (RoBERTa: pad_token_id + 1; BART: 2); the table has max_len + "
        "position_offset rows")
    position: str = _field(
        ARCHITECTURE, "learned", '"sinusoidal" (Vaswani), "learned" (BERT/GPT-2), "rope", "relative" (T5 '
        'buckets, one table per stack), "alibi" (linear biases, Press et al. 2022; no parameters) or '
        '"none"')
    rope_theta: float = _field(ARCHITECTURE, 10_000.0, "RoPE base wavelength (Su et al. 2021)")
    rope_scaling: str = _field(
        ARCHITECTURE, "none", 'RoPE frequency scaling for long contexts: "none", "linear", "dynamic", '
        '"llama3" or "yarn" (jaxformer.ops.positions.RopeScaling; HF rope_scaling / rope_parameters)')
    rope_scaling_factor: float = _field(
        ARCHITECTURE, 1.0, "rope_scaling: how many times the pre-training context is stretched")
    rope_original_max_len: int | None = _field(
        ARCHITECTURE, None, 'rope_scaling "dynamic" / "llama3" / "yarn": the pre-training context length')
    rope_low_freq_factor: float = _field(
        ARCHITECTURE, 1.0, 'rope_scaling "llama3": wavelengths > rope_original_max_len / this are scaled')
    rope_high_freq_factor: float = _field(
        ARCHITECTURE, 4.0, 'rope_scaling "llama3": wavelengths < rope_original_max_len / this are kept')
    rope_beta_fast: float = _field(
        ARCHITECTURE, 32.0, 'rope_scaling "yarn": dimensions turning more often than this are kept')
    rope_beta_slow: float = _field(
        ARCHITECTURE, 1.0, 'rope_scaling "yarn": dimensions turning less often than this are scaled')
    rope_attention_factor: float | None = _field(
        ARCHITECTURE, None, 'rope_scaling "yarn": factor on cos/sin; unset = 0.1 ln(factor) + 1')
    relative_num_buckets: int = _field(ARCHITECTURE, 32, "T5 relative-position buckets")
    relative_max_distance: int = _field(
        ARCHITECTURE, 128, "T5: distance beyond which relative positions share the last bucket")
    norm: str = _field(ARCHITECTURE, "layer", '"layer" (LayerNorm) or "rms" (RMSNorm, T5)')
    norm_position: str = _field(
        ARCHITECTURE, "pre", '"pre" (GPT-2, T5; adds a final norm) or "post" (Vaswani, BERT: LayerNorm(x + '
        "Sublayer(x)))")
    norm_eps: float = _field(ARCHITECTURE, 1e-6, "epsilon of the norms")
    norm_bias: bool = _field(ARCHITECTURE, True, "LayerNorm has a bias (RMSNorm never does)")
    embedding_norm: bool = _field(ARCHITECTURE, False, "LayerNorm right after the embeddings (BERT)")
    activation: str = _field(ARCHITECTURE, "gelu", "feed-forward activation (jaxformer.ops.activations)")
    gated_ffn: bool = _field(
        ARCHITECTURE, False, 'GLU-style FFN: SwiGLU with activation="silu", GEGLU with "gelu"/"gelu_tanh"')
    use_bias: bool = _field(ARCHITECTURE, True, "biases on the dense layers")
    qkv_bias: bool = _field(
        ARCHITECTURE, False, "biases on the query/key/value projections even with use_bias=False (Qwen2)")
    sliding_window: int | None = _field(
        ARCHITECTURE, None, "decoder: each query sees only the last this many positions, itself "
        "included (Mistral; Beltagy et al. 2020 §3.1); unset = all earlier positions")
    attention_scale: float | None = _field(
        ARCHITECTURE, None, "attention logits multiplier; unset = 1/sqrt(head_dim), T5 uses 1.0")
    tie_embeddings: bool = _field(ARCHITECTURE, True, "output projection = token embedding transposed")
    scale_embeddings: bool = _field(
        ARCHITECTURE, False, "multiply token embeddings by sqrt(d_model) (Vaswani §3.4)")
    rescale_tied_logits: bool = _field(
        ARCHITECTURE, False, "multiply hidden states by d_model^-0.5 before a tied unembedding (T5)")
    type_vocab_size: int = _field(
        ARCHITECTURE, 0, "token-type (segment A/B) embeddings: 2 for BERT, 0 for none")
    embedding_size: int | None = _field(
        ARCHITECTURE, None, "encoder: ALBERT's factorised embedding (Lan et al. 2019 §3.1): tables of "
        "this width E, projected E -> d_model; unset = d_model-wide tables, no projection")
    share_layers: bool = _field(
        ARCHITECTURE, False, "encoder: ALBERT's cross-layer sharing: one block's parameters applied "
        "num_layers times (Lan et al. 2019 §3.1)")
    permutation_lm: bool = _field(
        ARCHITECTURE, False, "decoder: add XLNet's query-stream jump_embed table for objective 'plm' "
        "(permutation LM, Yang et al. 2019); without an order the model is the plain GPT")
    # mixture of experts (issue 62; jaxformer.ops.moe): HF / MaxText names where they have one
    num_experts: int = _field(
        ARCHITECTURE, 0, "experts of each MoE feed-forward block (HF num_local_experts / num_experts); "
        "0 = dense FFNs only")
    experts_per_token: int = _field(
        ARCHITECTURE, 2, "k of the top-k router: 1 Switch, 2 Mixtral (HF num_experts_per_tok)")
    moe_every: int = _field(
        ARCHITECTURE, 1, "layer i (from 0) of each stack has the MoE FFN when (i + 1) % moe_every == 0: "
        "1 every layer (Mixtral), 2 every other (Switch; HF decoder_sparse_step)")
    moe_d_ff: int | None = _field(
        ARCHITECTURE, None, "hidden width of each expert (HF moe_intermediate_size); unset = d_ff")
    num_shared_experts: int = _field(
        ARCHITECTURE, 0, "experts every token runs besides the routed ones, as one dense FFN "
        "num_shared_experts * moe_d_ff wide (DeepSeekMoE; Qwen2-MoE's shared expert)")
    shared_expert_gate: bool = _field(
        ARCHITECTURE, False, "Qwen2-MoE: the shared experts' output times sigmoid(x . w), w [d_model, 1]")
    norm_topk_prob: bool | None = _field(
        ARCHITECTURE, None, "gates renormalised over the k chosen experts (Mixtral: softmax over the "
        "chosen logits), else the router's probabilities (Switch, Qwen2-MoE); unset = "
        "experts_per_token > 1")
    capacity_factor: float = _field(
        COMPUTE, 1.25, "expert capacity ceil(capacity_factor * length * k / num_experts) per row; "
        "assignments past it are dropped in order (Switch, GShard); unused with moe_dropless")
    moe_dropless: bool = _field(
        COMPUTE, False, "run every assignment through grouped matmuls (jax.lax.ragged_dot; "
        "MegaBlocks, Mixtral): nothing dropped, = capacity_factor infinite")
    router_jitter_noise: float = _field(
        REGULARIZATION, 0.0, "training: router inputs times uniform noise in [1 - this, 1 + this] "
        "(Switch; HF router_jitter_noise)")
    router_aux_loss_weight: float = _field(
        REGULARIZATION, 0.01, "weight of the load-balancing loss (Switch eq. 4's alpha; HF "
        "router_aux_loss_coef), averaged over the MoE layers")
    router_z_loss_weight: float = _field(
        REGULARIZATION, 0.0, "weight of the router z-loss (ST-MoE: 0.001; HF router_z_loss_coef)")
    # vision transformer (issue 64): images in place of tokens, encoder family (Dosovitskiy et al. 2021)
    image_size: int | None = _field(
        LAYOUT, None, "encoder: square images of this many pixels a side in place of tokens (ViT); the "
        "learned positions are a grid of (image_size / patch_size)^2 rows; fine-tuning at another "
        "size resamples them (position_interpolation, ViT §3.2); unset = a text model")
    patch_size: int = _field(
        ARCHITECTURE, 16, "image_size: side P of the square patches, each one token (a strided P×P "
        "linear projection)")
    num_channels: int = _field(ARCHITECTURE, 3, "image_size: colour channels of the images (last axis)")
    class_token: bool = _field(
        ARCHITECTURE, True, "image_size: a learned class vector before the patches (HF ViT's cls_token; "
        "pooling='first' reads it)")
    position_interpolation: str = _field(
        LAYOUT, "bicubic", 'image_size: how the learned position grid is resampled for another '
        'resolution: "bicubic" (HF ViT\'s interpolate_pos_encoding) or "bilinear"')
    # ModernBERT (Warner et al. 2024): alternating global / local attention, a θ per kind, and
    # no attention norm in layer 0 (HF ModernBertConfig's names; its global_rope_theta is rope_theta)
    local_attention: int | None = _field(
        ARCHITECTURE, None, "encoder: the local layers' window: a query sees the keys within "
        "local_attention // 2 positions either side (ModernBERT: 128); unset = every layer global")
    global_attn_every_n_layers: int = _field(
        ARCHITECTURE, 1, "with local_attention: layer i attends globally when i % this == 0, locally "
        "otherwise (ModernBERT: 3)")
    local_rope_theta: float | None = _field(
        ARCHITECTURE, None, "RoPE base wavelength of the local layers (ModernBERT: 10000; the global "
        "layers use rope_theta, HF's global_rope_theta); unset = rope_theta")
    first_attn_norm: bool = _field(
        ARCHITECTURE, True, "pre-LN: layer 0 normalises its attention input; False: it reads the "
        "embedding norm's output as is (ModernBERT; layer 0's self_attn_norm then goes unused)")
    # head: the output head (a new one starts fresh when fine-tuning)
    lm_head_bias: bool = _field(HEAD, False, "a bias on the LM / MLM output projection")
    head: str = _field(
        HEAD, "lm", 'output head: "lm" (next token / decoder), "mlm", "classify" (sequence), '
        '"token_classify", "span" (extractive QA start/end), "none" (backbone output)')
    num_classes: int = _field(
        HEAD, 2, "classifier outputs; unset = len(data.label_names) when the data names its labels, else 2")
    pooling: str = _field(
        HEAD, "first", 'token the sequence classifier reads: "first" ([CLS]), "last" (final non-padding '
        'token, causal models), "mean", "max"')
    pooler: bool = _field(HEAD, False, "BERT's dense+tanh over the pooled token")
    pooler_activation: str = _field(
        HEAD, "tanh", 'activation after the pooler\'s dense: "tanh" (BERT, RoBERTa\'s classification '
        'head) or "relu" (DistilBERT\'s pre_classifier)')
    mlm_transform: bool = _field(HEAD, False, "BERT's dense+activation+LayerNorm before the MLM decoder")
    nsp_head: bool = _field(HEAD, False, "BERT's next-sentence-prediction head (encoder with head='mlm')")
    prediction_head: bool = _field(
        HEAD, False, "ModernBERT's dense + activation + norm before the classifier (on the pooled "
        "vector) or the token classifier (on every token); mlm_transform is the MLM head's")
    # regularization: training noise only
    dropout_rate: float = _field(REGULARIZATION, 0.1, "dropout on embeddings and sublayer outputs")
    attention_dropout_rate: float = _field(REGULARIZATION, 0.1, "dropout on the attention probabilities")
    ffn_dropout_rate: float = _field(
        REGULARIZATION, 0.0, "dropout inside the feed-forward block, after the activation")
    target_token_dropout_rate: float = _field(
        REGULARIZATION, 0.0, "encoder_decoder, training only: zero each decoder input token's embedding with "
        "this probability (Gal & Ghahramani 2016; Sennrich & Zhang 2019)")
    # initialization: only parameters that start fresh
    init_scheme: str = _field(
        INIT, "normal", 'rules of fresh weights: "normal" (every kernel N(0, init_std)), "gpt2" '
        '(residual output kernels / sqrt(2 n_layer)), "bert" (truncated normal), "t5" (init_std * '
        'fan_in^-1/2), "transformer" (tensor2tensor\'s uniform unit scaling): '
        "jaxformer.models.spec.initializer_of")
    init_std: float = _field(
        INIT, 0.02, "base scale of fresh weights: the kernels' std, or the factor of fan_in^-1/2 "
        'with init_scheme="t5" (HF\'s initializer_factor, 1.0) or "transformer" (t2t\'s gain)')
    embed_init_std: float | None = _field(INIT, None, "std of fresh embedding tables; unset = init_std")
    # compute: how the same function is computed
    dtype: str = _field(COMPUTE, "float32", 'compute dtype: "float32", "bfloat16" or "float16"')
    remat_policy: str = _field(
        COMPUTE, "none", 'activation checkpointing policy per layer ("none" = keep all activations)')
    attention_impl: str = _field(
        COMPUTE, "xla", '"auto" (the fastest the target platform runs for this model: the presets\' '
        'default), "xla", "chunked" (memory-efficient online softmax), "cudnn" (CUDA GPU), "splash" '
        '(TPU) or "splash_interpret" (splash interpreted, CPU tests): jaxformer.ops.attention_kernels')
    attention_chunk_size: int = _field(
        COMPUTE, 512, 'key/value block length of attention_impl="chunked" and of the splash kernels')
    # layout: how the same parameters are stored
    param_dtype: str = _field(LAYOUT, "float32", "storage dtype of the parameters")
    scan_layers: bool = _field(
        LAYOUT, False, "lax.scan over the layers (one compiled layer; parameters stacked on a 'layers' axis)")
    vocab_pad_multiple: int = _field(
        LAYOUT, 1, "the vocabulary tables (token embedding, LM / MLM output kernel and bias) hold "
        "vocab_size rounded up to a multiple of this, so a tensor-parallel mesh divides them "
        "(Megatron's make-vocab-size-divisible-by; 128 covers tensor = 2 ... 128); the padded "
        "logits are masked, so the model computes the same function; 1 = no padding")

    def __post_init__(self):
        if (self.head_dim is None and isinstance(self.num_heads, int) and self.num_heads > 0
                and isinstance(self.d_model, int) and self.d_model > 0
                and self.d_model % self.num_heads):
            raise ValueError(f"model.d_model={self.d_model} is invalid: must be divisible by "
                             f"num_heads={self.num_heads} (or set head_dim explicitly)")
        defaults = {
            "num_kv_heads": self.num_heads,
            "head_dim": self.d_model // self.num_heads if self.num_heads > 0 else None,
            "num_encoder_layers": self.num_layers,
            "num_decoder_layers": self.num_layers,
            "embed_init_std": self.init_std,
            "moe_d_ff": self.d_ff,
            "norm_topk_prob": self.experts_per_token > 1,
        }
        for name, value in defaults.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        self.validate()

    # ----------------------------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise ValueError naming the first offending field."""
        def bad(field, value, want):
            raise ValueError(f"model.{field}={value!r} is invalid: {want}")

        for f, choices in [("family", FAMILIES), ("position", POSITIONS), ("norm", NORMS),
                           ("norm_position", NORM_POSITIONS), ("head", HEADS), ("pooling", POOLINGS),
                           ("remat_policy", REMAT_POLICIES), ("attention_impl", ATTENTION_IMPLS),
                           ("dtype", DTYPES), ("param_dtype", DTYPES), ("init_scheme", INIT_SCHEMES),
                           ("activation", tuple(ACTIVATIONS)),
                           ("pooler_activation", tuple(ACTIVATIONS))]:
            if getattr(self, f) not in choices:
                bad(f, getattr(self, f), f"choose one of {choices}")
        for f in ["vocab_size", "d_model", "num_heads", "num_kv_heads", "head_dim", "d_ff",
                  "num_layers", "num_encoder_layers", "num_decoder_layers", "max_len",
                  "relative_num_buckets", "relative_max_distance", "num_classes",
                  "attention_chunk_size", "vocab_pad_multiple"]:
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                bad(f, v, "must be a positive integer")
        if self.num_heads % self.num_kv_heads:
            bad("num_kv_heads", self.num_kv_heads, f"must divide num_heads={self.num_heads}")
        for f in ["dropout_rate", "attention_dropout_rate", "ffn_dropout_rate",
                  "target_token_dropout_rate"]:
            v = getattr(self, f)
            if not 0.0 <= v < 1.0:
                bad(f, v, "must be in [0, 1)")
        for f in ["init_std", "embed_init_std"]:
            v = getattr(self, f)
            if not v > 0:
                bad(f, v, "must be > 0 (the scale of freshly initialised weights)")
        if not isinstance(self.position_offset, int) or self.position_offset < 0:
            bad("position_offset", self.position_offset, "must be an integer >= 0")
        if self.position_offset and self.position != "learned":
            bad("position_offset", self.position_offset, "offsets rows of a learned position table; "
                f"position={self.position!r} has none (use 0)")
        if self.type_vocab_size < 0:
            bad("type_vocab_size", self.type_vocab_size, "must be >= 0")
        if self.position == "sinusoidal" and self.d_model % 2:
            bad("d_model", self.d_model, "must be even for sinusoidal positions")
        if self.position == "rope" and self.head_dim % 2:
            bad("head_dim", self.head_dim, "must be even for RoPE")
        if self.position == "rope" and not self.rope_theta > 1.0:
            bad("rope_theta", self.rope_theta, "must be > 1 (the RoPE base wavelength)")
        if self.family == "encoder" and self.head == "lm":
            bad("head", self.head, "an encoder-only model has no causal LM head; use 'mlm'")
        if self.family == "encoder_decoder" and self.head != "lm":
            bad("head", self.head, "encoder_decoder models support only 'lm' (T5 casts "
                "classification as text-to-text: the label is the target text)")
        if self.head == "span" and self.family != "encoder":
            bad("head", self.head, "extractive QA reads every token bidirectionally; use "
                "family='encoder' (BERT)")
        if self.rescale_tied_logits and not self.tie_embeddings:
            bad("rescale_tied_logits", True, "only applies when tie_embeddings=True")
        if self.family == "decoder" and self.head == "classify" and self.pooling == "first":
            bad("pooling", self.pooling, "a causal decoder's first token sees no other token; "
                "use 'last' (final non-padding token) or 'mean'")
        if self.nsp_head and not (self.family == "encoder" and self.head == "mlm"):
            bad("nsp_head", True, "next-sentence prediction needs family='encoder', head='mlm'")
        self._validate_albert(bad)
        self._validate_local_attention(bad)
        self._validate_rope_scaling(bad)
        self._validate_moe(bad)
        self._validate_vision(bad)
        w = self.sliding_window
        if w is not None and (not isinstance(w, int) or isinstance(w, bool) or w <= 0):
            bad("sliding_window", w, "must be a positive integer (or unset: full causal attention)")
        if w is not None and self.family != "decoder":
            bad("sliding_window", w, f"is a causal decoder's option, not {self.family!r}'s")
        if w is not None and self.attention_impl not in ("xla", "chunked", "auto"):
            bad("attention_impl", self.attention_impl, "the sliding window is an additive bias; "
                "use 'xla' or 'chunked'")
        if self.permutation_lm and self.family != "decoder":
            bad("permutation_lm", True, "XLNet's two-stream attention runs on family='decoder', "
                f"not {self.family!r}")
        if self.permutation_lm and self.position in ("relative", "alibi"):
            bad("permutation_lm", True, f"the query stream's {self.position} bias is not "
                "implemented; use position='learned', 'rope', 'sinusoidal' or 'none'")
        if self.position == "alibi" and self.attention_impl not in ("xla", "chunked", "auto"):
            bad("position", "alibi", "ALiBi is an additive attention bias, which attention_impl="
                f"{self.attention_impl!r} cannot add; use attention_impl='xla' or 'chunked'")
        kernel_problem = _kernel_cannot_run(
            self.attention_impl, dtype=self.dtype, head_dim=self.head_dim,
            relative_bias=self.position == "relative", local_window=self.local_attention is not None,
            attention_dropout_rate=self.attention_dropout_rate, chunk_size=self.attention_chunk_size)
        if kernel_problem:
            bad(kernel_problem[0], getattr(self, kernel_problem[0]), kernel_problem[1])

    def _validate_local_attention(self, bad) -> None:
        """ModernBERT's alternating global / local layers (`jaxformer.ops.masks.local_window_mask`)."""
        w, n = self.local_attention, self.global_attn_every_n_layers
        if w is not None and (not isinstance(w, int) or isinstance(w, bool) or w < 2):
            bad("local_attention", w, "must be an integer >= 2 (the window; unset: all layers global)")
        if w is not None and self.family != "encoder":
            bad("local_attention", w, f"is the encoder's bidirectional window, not {self.family!r}'s "
                "(a causal decoder's is sliding_window)")
        if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
            bad("global_attn_every_n_layers", n, "must be a positive integer")
        t = self.local_rope_theta
        if t is not None and not (self.position == "rope" and w is not None and t > 1.0):
            bad("local_rope_theta", t, "needs position='rope', local_attention set and a value > 1")
        if not self.first_attn_norm and self.norm_position != "pre":
            bad("first_attn_norm", False, "drops layer 0's pre-LN attention norm; needs "
                "norm_position='pre'")
        if self.prediction_head and self.head not in ("classify", "token_classify"):
            bad("prediction_head", True, f"transforms a classifier's input; head={self.head!r} (the "
                "MLM head's is mlm_transform)")

    def _validate_rope_scaling(self, bad) -> None:
        """RoPE's long-context scalings (`jaxformer.ops.positions.RopeScaling`)."""
        kind = self.rope_scaling
        if kind not in ROPE_SCALINGS:
            bad("rope_scaling", kind, f"choose one of {ROPE_SCALINGS}")
        if kind == "none":
            return
        if self.position != "rope":
            bad("rope_scaling", kind, f"scales RoPE; position={self.position!r}")
        if not self.rope_scaling_factor > 0:
            bad("rope_scaling_factor", self.rope_scaling_factor, "must be > 0")
        m = self.rope_original_max_len
        if kind != "linear" and (not isinstance(m, int) or isinstance(m, bool) or m <= 0):
            bad("rope_original_max_len", m, f"rope_scaling={kind!r} needs the pre-training "
                "context length (a positive integer)")
        if kind == "llama3" and not self.rope_high_freq_factor > self.rope_low_freq_factor > 0:
            bad("rope_high_freq_factor", self.rope_high_freq_factor,
                f"must exceed rope_low_freq_factor={self.rope_low_freq_factor} > 0")
        if kind == "yarn" and not self.rope_beta_fast > self.rope_beta_slow > 0:
            bad("rope_beta_fast", self.rope_beta_fast,
                f"must exceed rope_beta_slow={self.rope_beta_slow} > 0")

    def _validate_moe(self, bad) -> None:
        """Mixture-of-experts fields (`jaxformer.ops.moe`)."""
        for f in ["num_experts", "num_shared_experts"]:
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                bad(f, v, "must be an integer >= 0")
        for f in ["router_aux_loss_weight", "router_z_loss_weight"]:
            if not getattr(self, f) >= 0:
                bad(f, getattr(self, f), "must be >= 0")
        if not self.num_experts:
            return
        if not 1 <= self.experts_per_token <= self.num_experts:
            bad("experts_per_token", self.experts_per_token,
                f"must be in [1, num_experts={self.num_experts}]")
        for f in ["moe_every", "moe_d_ff"]:
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                bad(f, v, "must be a positive integer")
        if not self.capacity_factor > 0:
            bad("capacity_factor", self.capacity_factor, "must be > 0 (or set moe_dropless=True)")
        if not 0.0 <= self.router_jitter_noise < 1.0:
            bad("router_jitter_noise", self.router_jitter_noise, "must be in [0, 1)")
        if self.shared_expert_gate and not self.num_shared_experts:
            bad("shared_expert_gate", True, "gates shared experts: set num_shared_experts >= 1")
        if self.moe_every > 1 and (self.scan_layers or self.share_layers):
            bad("moe_every", self.moe_every, "a scanned or shared stack repeats one block: use "
                "moe_every=1 or set scan_layers=False and share_layers=False")
        if self.permutation_lm:
            bad("num_experts", self.num_experts, "XLNet's two-stream attention has no MoE FFN: "
                "set num_experts=0 or permutation_lm=False")

    def moe_layer(self, index: int) -> bool:
        """Whether layer ``index`` (from 0) of a stack has the MoE FFN (`moe_every`)."""
        return self.num_experts > 0 and (index + 1) % self.moe_every == 0
    def _validate_vision(self, bad) -> None:
        """The Vision Transformer's image input (``image_size`` set) on the encoder family."""
        for f in ("patch_size", "num_channels"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                bad(f, v, "must be a positive integer")
        if self.position_interpolation not in RESIZE_METHODS:
            bad("position_interpolation", self.position_interpolation, f"choose one of {RESIZE_METHODS}")
        size = self.image_size
        if size is None:
            return
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            bad("image_size", size, "must be a positive integer (or unset: a text model)")
        if size % self.patch_size:
            bad("image_size", size, f"must be a multiple of patch_size={self.patch_size} (whole patches)")
        if self.family != "encoder":
            bad("family", self.family, "images (image_size set) feed the encoder family: use 'encoder'")
        if self.head not in ("classify", "none"):
            bad("head", self.head, "an image model has no vocabulary or spans: use 'classify' or 'none'")
        if self.pooling not in ("first", "mean"):
            bad("pooling", self.pooling, "images pool the class token ('first') or the mean of the "
                "patches ('mean')")
        if self.pooling == "first" and not self.class_token:
            bad("pooling", "first", "reads the class token, but class_token=False; use 'mean'")
        if self.position not in ("learned", "sinusoidal", "none"):
            bad("position", self.position, "image models take 'learned' (ViT), 'sinusoidal' or 'none'")
        for f, off in (("type_vocab_size", 0), ("embedding_size", None), ("position_offset", 0),
                       ("embedding_norm", False)):
            if getattr(self, f) != off:
                bad(f, getattr(self, f), f"is a text model's option; use {off!r} with image_size")

    @property
    def image_grid(self) -> tuple[int, int] | None:
        """``(g, g)``, the patch grid of ``image_size`` images (None for a text model)."""
        if self.image_size is None:
            return None
        return (self.image_size // self.patch_size,) * 2

    @property
    def image_length(self) -> int | None:
        """Tokens an image becomes: the patches, plus the class token (None for a text model)."""
        if self.image_size is None:
            return None
        return (self.image_size // self.patch_size) ** 2 + int(self.class_token)

    def _validate_albert(self, bad) -> None:
        """ALBERT's options (factorised embedding, shared layers) exist on the encoder family."""
        e = self.embedding_size
        if e is not None and (not isinstance(e, int) or isinstance(e, bool) or e <= 0):
            bad("embedding_size", e, "must be a positive integer (or unset: no factorisation)")
        for f, on in (("embedding_size", e is not None), ("share_layers", self.share_layers)):
            if on and self.family != "encoder":
                bad(f, getattr(self, f), f"ALBERT's option needs family='encoder', not {self.family!r}")
        if e is not None and self.head == "mlm" and not self.mlm_transform:
            bad("mlm_transform", False, "the MLM decoder of E-wide embeddings needs the "
                "transform's d_model -> embedding_size dense (set mlm_transform=True)")
        if e is not None and self.position == "sinusoidal" and e % 2:
            bad("embedding_size", e, "must be even for sinusoidal positions")

    # ----------------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelConfig:
        """Build from a mapping (e.g. ``config.model`` of a ConfigDict); unknown keys are errors and
        None means "not set": the field's default (derived from other fields where it says so)."""
        if hasattr(d, "to_dict"):
            d = d.to_dict()
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown model config keys {unknown}; valid keys are {sorted(names)}")
        return cls(**{k: v for k, v in d.items() if v is not None})

    def replace(self, **kw) -> ModelConfig:
        return dataclasses.replace(self, **kw)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def rope(self) -> RopeScaling | None:
        """The `RopeScaling` of ``rope_scaling`` and its parameters (None: unscaled)."""
        if self.rope_scaling == "none":
            return None
        return RopeScaling(self.rope_scaling, self.rope_scaling_factor, self.rope_original_max_len,
                           self.rope_low_freq_factor, self.rope_high_freq_factor,
                           self.rope_beta_fast, self.rope_beta_slow, self.rope_attention_factor)

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the vocabulary tables: ``vocab_size`` rounded up to a multiple of
        ``vocab_pad_multiple`` (ids and logits past ``vocab_size`` are padding, never used)."""
        return -(-self.vocab_size // self.vocab_pad_multiple) * self.vocab_pad_multiple

    @property
    def causal(self) -> bool:
        return self.family == "decoder"

    @property
    def attention_kernel(self) -> str:
        """The attention implementation that runs: ``attention_impl``, or for "auto" the fastest the
        target platform runs for this model (`jaxformer.ops.kernel_choice.fastest_attention`:
        the platform of a `target_platform` context, as `jaxformer.compile` sets for a topology,
        else jax's backend). ALiBi and a sliding window (additive biases `validate` keeps off the
        kernels) and XLNet's dense two-stream masks run on "xla"; so does decoding with a KV cache,
        whatever this says."""
        if self.attention_impl != "auto":
            return self.attention_impl
        if self.position == "alibi" or self.sliding_window is not None or self.permutation_lm:
            return "xla"
        return fastest_attention(dtype=self.dtype, head_dim=self.head_dim,
                                 relative_bias=self.position == "relative", causal=self.causal,
                                 local_window=self.local_attention is not None,
                                 attention_dropout_rate=self.attention_dropout_rate,
                                 chunk_size=self.attention_chunk_size)

    def attention_summary(self, context: int = 1) -> str:
        """What computes the attention, for start-up lines and reports: `attention_kernel`
        (``"splash (auto)"``, or ``"xla"`` set explicitly), or ring attention on a mesh whose
        ``context`` axis (`jaxformer.parallel.context`) is larger than 1."""
        if context > 1:
            return f"ring (mesh.context={context})"
        return self.attention_kernel + (" (auto)" if self.attention_impl == "auto" else "")


# --------------------------------------------------------------------------------------------------
# Lists of fields, derived from each field's kind.


def fields_of(*kinds: str) -> tuple[str, ...]:
    """`ModelConfig` field names of the given kinds, in declaration order."""
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown field kinds {sorted(unknown)}; choose from {KINDS}")
    return tuple(f.name for f in dataclasses.fields(ModelConfig) if f.metadata["kind"] in kinds)


def architecture_fields() -> tuple[str, ...]:
    """Fields a checkpoint's parameters are tied to: never changed by resuming or fine-tuning."""
    return fields_of(ARCHITECTURE)


def fine_tuning_fields() -> tuple[str, ...]:
    """Fields a fine-tuning run (``init_from``) may set differently from the pretrained model."""
    return fields_of(*(k for k in KINDS if k != ARCHITECTURE))


def resumable_fields() -> tuple[str, ...]:
    """Fields a resumed run may change: they neither shape the parameters nor change the function
    the parameters compute (only how it is computed, or the training noise)."""
    return fields_of(REGULARIZATION, INIT, COMPUTE)


def exported_fields() -> tuple[str, ...]:
    """Fields a Hugging Face ``config.json`` cannot express (one dropout rate for all, no init
    scale of ours, no attention implementation): `jaxformer.convert.save_hf` stores them apart."""
    return fields_of(REGULARIZATION, INIT, COMPUTE)


def changed_fields(before: ModelConfig, after: ModelConfig, names: Iterable[str]) -> list[str]:
    """``"model.<field>: <before> -> <after>"`` for each of ``names`` whose value differs."""
    return [f"model.{k}: {getattr(before, k)!r} -> {getattr(after, k)!r}" for k in names
            if getattr(before, k) != getattr(after, k)]
