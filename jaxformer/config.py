"""The one validated model configuration type.

Configs are written as `ml_collections.ConfigDict` (``configs/<name>.py: get_config()``) and read into
`ModelConfig` with `ModelConfig.from_dict`, which rejects unknown keys, non-positive sizes and
inconsistent head counts with a `ValueError` naming the field, before anything is compiled.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from jaxformer.ops.activations import ACTIVATIONS

FAMILIES = ("encoder", "decoder", "encoder_decoder")
POSITIONS = ("sinusoidal", "learned", "rope", "relative", "none")
NORMS = ("layer", "rms")
NORM_POSITIONS = ("pre", "post")
HEADS = ("lm", "mlm", "classify", "token_classify", "none")
POOLINGS = ("first", "last", "mean", "max")
REMAT_POLICIES = ("none", "full", "dots", "dots_with_no_batch_dims")
ATTENTION_IMPLS = ("xla", "chunked")
DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of any of the three families. Shapes in docstrings use these names.

    Attributes (the less obvious ones):
      family: "encoder" (BERT), "decoder" (GPT) or "encoder_decoder" (T5 / Vaswani).
      num_kv_heads: key/value heads (< num_heads for GQA, 1 for MQA); default num_heads.
      head_dim: per-head width; default d_model // num_heads (T5 allows it to differ).
      num_layers: layers of the single stack; for encoder_decoder the default of both stacks.
      position: "sinusoidal" (Vaswani), "learned" (BERT/GPT-2), "rope", "relative" (T5 buckets,
        one table per stack shared by its layers) or "none".
      norm_position: "pre" (GPT-2, T5; adds a final norm) or "post" (Vaswani, BERT:
        LayerNorm(x + Sublayer(x))).
      embedding_norm: LayerNorm right after the embeddings (BERT).
      gated_ffn: GLU-style FFN (SwiGLU with activation="silu", GEGLU with "gelu"/"gelu_tanh").
      target_token_dropout_rate: encoder-decoder only: during training, zero the embedding of
        each decoder input token with this probability ("word dropout", Gal & Ghahramani 2016;
        Sennrich & Zhang 2019), so the decoder must lean on the source instead of its own prefix.
      attention_scale: logits multiplier; None = 1/sqrt(head_dim), T5 uses 1.0.
      scale_embeddings: multiply token embeddings by sqrt(d_model) (Vaswani §3.4).
      tie_embeddings: output projection = token embedding transposed.
      rescale_tied_logits: multiply hidden states by d_model^-0.5 before a tied unembedding (T5).
      type_vocab_size: token-type (segment A/B) embeddings, 2 for BERT, 0 for none.
      head: output head: "lm" (next token / decoder), "mlm", "classify" (sequence),
        "token_classify", "none" (backbone output: hidden states, plus the pooled vector when pooler=True).
      pooling: which token the sequence classifier reads ("first" = [CLS], "last" = final
        non-padding token for causal models, "mean", "max" = per-feature max over the tokens).
      pooler: BERT's dense+tanh over the pooled token.
      mlm_transform: BERT's dense+activation+LayerNorm before the MLM decoder.
      dtype / param_dtype: compute and storage dtypes.
      scan_layers / remat_policy: `nn.scan` over layers; activation checkpointing policy.
      attention_impl: "xla" or "chunked" (memory-efficient online softmax).
    """

    family: str = "decoder"
    vocab_size: int = 32_000
    d_model: int = 512
    num_heads: int = 8
    num_kv_heads: int | None = None
    head_dim: int | None = None
    d_ff: int = 2048
    num_layers: int = 6
    num_encoder_layers: int | None = None
    num_decoder_layers: int | None = None
    max_len: int = 512
    position: str = "learned"
    rope_theta: float = 10_000.0
    relative_num_buckets: int = 32
    relative_max_distance: int = 128
    norm: str = "layer"
    norm_position: str = "pre"
    norm_eps: float = 1e-6
    norm_bias: bool = True
    embedding_norm: bool = False
    activation: str = "gelu"
    gated_ffn: bool = False
    use_bias: bool = True
    attention_scale: float | None = None
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    ffn_dropout_rate: float = 0.0
    target_token_dropout_rate: float = 0.0
    tie_embeddings: bool = True
    scale_embeddings: bool = False
    rescale_tied_logits: bool = False
    lm_head_bias: bool = False
    type_vocab_size: int = 0
    head: str = "lm"
    num_classes: int = 2
    pooling: str = "first"
    pooler: bool = False
    mlm_transform: bool = False
    nsp_head: bool = False
    init_std: float = 0.02
    embed_init_std: float | None = None
    dtype: str = "float32"
    param_dtype: str = "float32"
    scan_layers: bool = False
    remat_policy: str = "none"
    attention_impl: str = "xla"
    attention_chunk_size: int = 512

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
                           ("dtype", DTYPES), ("param_dtype", DTYPES),
                           ("activation", tuple(ACTIVATIONS))]:
            if getattr(self, f) not in choices:
                bad(f, getattr(self, f), f"choose one of {choices}")
        for f in ["vocab_size", "d_model", "num_heads", "num_kv_heads", "head_dim", "d_ff",
                  "num_layers", "num_encoder_layers", "num_decoder_layers", "max_len",
                  "relative_num_buckets", "relative_max_distance", "num_classes",
                  "attention_chunk_size"]:
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
        if self.rescale_tied_logits and not self.tie_embeddings:
            bad("rescale_tied_logits", True, "only applies when tie_embeddings=True")
        if self.family == "decoder" and self.head == "classify" and self.pooling == "first":
            bad("pooling", self.pooling, "a causal decoder's first token sees no other token; "
                "use 'last' (final non-padding token) or 'mean'")
        if self.nsp_head and not (self.family == "encoder" and self.head == "mlm"):
            bad("nsp_head", True, "next-sentence prediction needs family='encoder', head='mlm'")

    # ----------------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelConfig:
        """Build from a mapping (e.g. ``config.model`` of a ConfigDict); unknown keys are errors."""
        if hasattr(d, "to_dict"):
            d = d.to_dict()
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown model config keys {unknown}; valid keys are {sorted(names)}")
        return cls(**dict(d))

    def replace(self, **kw) -> ModelConfig:
        return dataclasses.replace(self, **kw)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def causal(self) -> bool:
        return self.family == "decoder"
