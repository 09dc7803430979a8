"""Pure functions (jax.numpy in, jax.numpy out; no parameters held): import and use directly.

Shapes in docstrings, and in the names of arrays inside the attention kernels (``q_BxLxHxDh``, as
nanodo writes ``x_BxLxD``): ``B`` batch, ``L`` length (of the queries / the sequence computed on),
``S`` length of the attended-to keys and values (the encoder output in cross-attention, the cache's
slots when decoding), ``D`` d_model, ``H`` heads, ``K`` kv heads, ``G = H // K``, ``Dh`` head_dim,
``F`` d_ff, ``V`` vocab, ``C`` classes. The data pipeline and the objectives use the same ``L``.
"""

from jaxformer.ops.activations import ACTIVATIONS, get_activation
from jaxformer.ops.attention import dot_product_attention
from jaxformer.ops.blocks import (
    attention_sublayer,
    decoder_block,
    encoder_block,
    transformer_block,
)
from jaxformer.ops.dense import dense
from jaxformer.ops.dropout import dropout, token_dropout
from jaxformer.ops.embedding import attend, check_token_ids, embed
from jaxformer.ops.ffn import ffn
from jaxformer.ops.heads import (
    HeadInputs,
    classify,
    lm_head_inputs,
    lm_logits,
    mask_padded_vocab,
    mlm_head_inputs,
    mlm_logits,
    pool,
    pooled,
)
from jaxformer.ops.inputs import embed_inputs, embed_tokens
from jaxformer.ops.losses import (
    blockwise_cross_entropy,
    cross_entropy_with_integer_labels,
    weighted_accuracy,
    weighted_blockwise_cross_entropy,
    weighted_cross_entropy,
)
from jaxformer.ops.masks import (
    causal_mask,
    causal_mask_from_positions,
    combine_masks,
    key_padding_mask,
    make_attention_mask,
    padding_mask,
    prefix_lm_mask,
    segment_mask,
    sliding_window_mask,
)
from jaxformer.ops.norms import layer_norm, normalize, rms_norm
from jaxformer.ops.positions import (
    RopeScaling,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    lookup_positions,
    relative_position_bias,
    relative_position_bucket,
    rope_frequencies,
    sinusoidal,
    sinusoidal_table,
)
from jaxformer.ops.stack import run_stack

__all__ = [
    "ACTIVATIONS", "get_activation", "dot_product_attention", "attention_sublayer", "decoder_block",
    "encoder_block", "transformer_block", "dense", "dropout", "token_dropout", "attend",
    "check_token_ids", "embed", "ffn", "cross_entropy_with_integer_labels", "weighted_accuracy",
    "weighted_cross_entropy", "blockwise_cross_entropy", "weighted_blockwise_cross_entropy",
    "causal_mask", "causal_mask_from_positions", "combine_masks",
    "key_padding_mask", "make_attention_mask", "padding_mask", "prefix_lm_mask", "segment_mask",
    "sliding_window_mask",
    "layer_norm", "normalize", "rms_norm", "apply_rope", "RopeScaling", "rope_frequencies",
    "lookup_positions", "alibi_bias", "alibi_slopes",
    "relative_position_bias", "relative_position_bucket", "sinusoidal", "sinusoidal_table",
    "classify", "lm_logits", "mask_padded_vocab", "mlm_logits", "pool", "pooled", "embed_inputs",
    "HeadInputs", "lm_head_inputs", "mlm_head_inputs",
    "embed_tokens", "run_stack",
]
