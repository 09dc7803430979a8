"""The model fields that the block, stack, input and head functions of `jaxformer.ops` read.

Those functions take a `jaxformer.config.ModelConfig` and read its fields (``cfg.norm``,
``cfg.dropout_rate``, …). `jaxformer.config` sits above ops (it validates against the ops' tables:
activations, attention implementations, RoPE scalings, remat policies), so ops never import it, not
even for a type hint: `ModelFields` declares what they read, and any object with those attributes
serves (``isinstance(ModelConfig(), ModelFields)``; tests/test_config.py checks that every
``cfg.<name>`` read in ``jaxformer/ops`` is declared here).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from jaxformer.ops.positions import RopeScaling


@runtime_checkable
class ModelFields(Protocol):
    """The `jaxformer.config.ModelConfig` fields ops read (their meaning: ModelConfig's docs)."""

    # sizes
    vocab_size: int
    d_model: int
    head_dim: int | None
    num_kv_heads: int | None
    max_len: int
    type_vocab_size: int
    # norms, activations, positions
    norm: str
    norm_eps: float
    norm_position: str
    activation: str
    position: str
    position_offset: int
    rope_theta: float
    rope: RopeScaling | None
    # ModernBERT's alternating global / local layers
    local_attention: int | None
    global_attn_every_n_layers: int
    local_rope_theta: float | None
    first_attn_norm: bool
    # embeddings and heads
    embedding_norm: bool
    scale_embeddings: bool
    tie_embeddings: bool
    rescale_tied_logits: bool
    lm_head_bias: bool
    mlm_transform: bool
    pooling: str
    pooler: bool
    pooler_activation: str
    # attention
    attention_scale: float | None
    attention_chunk_size: int
    attention_kernel: str
    # regularisation and computation
    dropout_rate: float
    attention_dropout_rate: float
    ffn_dropout_rate: float
    dtype: str
    scan_layers: bool
    remat_policy: str
    # mixture of experts (`jaxformer.ops.moe`)
    experts_per_token: int
    capacity_factor: float
    moe_dropless: bool
    norm_topk_prob: bool
    router_jitter_noise: float
