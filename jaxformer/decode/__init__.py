"""Generation: KV-cache helpers, greedy / sampled decoding, beam search, and the user-facing API."""

from jaxformer.decode.api import (
    GenerationConfig,
    encode_prompts,
    generate,
    generate_batches,
    generate_padded,
    generate_text,
)
from jaxformer.decode.beam import BeamResult, beam_search, length_penalty
from jaxformer.decode.cache import (
    cache_batch_axes,
    cache_slot_axes,
    grow_slots,
    init_cache,
)
from jaxformer.decode.ngram import block_repeated_ngrams, repeated_ngram_mask
from jaxformer.decode.sampling import (
    apply_temperature,
    argmax,
    sample,
    top_k_filter,
    top_k_top_p_filter,
    top_p_filter,
)
from jaxformer.decode.search import DecodeResult, decode_loop

__all__ = [
    "GenerationConfig", "encode_prompts", "generate", "generate_batches", "generate_padded",
    "generate_text",
    "BeamResult", "beam_search", "length_penalty",
    "block_repeated_ngrams", "repeated_ngram_mask",
    "cache_batch_axes", "cache_slot_axes", "grow_slots",
    "init_cache",
    "apply_temperature", "argmax", "sample", "top_k_filter", "top_k_top_p_filter", "top_p_filter",
    "DecodeResult", "decode_loop",
]
