"""No-repeat n-gram blocking: forbid a token that would complete an n-gram already generated.

Weak sequence models fall into loops ("y á Moisés y á Moisés …"), and beam search with a strong
length reward makes them longer. Blocking repeated n-grams at decode time is the standard remedy
(Paulus et al. 2018, "A Deep Reinforced Model for Abstractive Summarization", §2.5 for trigrams;
fairseq's ``--no-repeat-ngram-size``, Hugging Face's ``no_repeat_ngram_size``). Here the history is
the *generated* tokens only (not a decoder-only model's prompt).

All functions are pure `jax.numpy` and jit-able; ``length`` may be traced.
"""

from __future__ import annotations

import jax.numpy as jnp

Array = jnp.ndarray


def repeated_ngram_mask(tokens: Array, length: Array | int, n: int, vocab_size: int) -> Array:
    """Tokens that would repeat an n-gram: `[R, N]` generated ids → `[R, V]` bool.

    Row ``r`` has generated ``tokens[r, :length]``; entry ``[r, v]`` is True when appending ``v``
    would create an n-gram that already occurs in that prefix, i.e. some ``j`` with
    ``tokens[r, j : j+n-1] == tokens[r, length-n+1 : length]`` and ``tokens[r, j+n-1] == v``,
    ``j + n - 1 < length``. ``n = 1`` bans every token generated so far; ``n <= 0`` bans nothing.
    """
    rows, width = tokens.shape
    length = jnp.asarray(length, jnp.int32)
    if n <= 0 or width < n:
        return jnp.zeros((rows, vocab_size), bool)
    starts = width - n + 1  # windows j = 0 .. width-n
    j = jnp.arange(starts)
    hit = j[None, :] + n - 1 < length  # the window and the token after it are generated
    for k in range(n - 1):  # window token k equals suffix token k = tokens[length - n + 1 + k]
        suffix_k = jnp.take_along_axis(tokens, jnp.broadcast_to(
            jnp.clip(length - n + 1 + k, 0, width - 1), (rows, 1)), axis=1)
        hit = hit & (tokens[:, k:k + starts] == suffix_k)
    banned = jnp.zeros((rows, vocab_size), jnp.int32)
    banned = banned.at[jnp.arange(rows)[:, None], tokens[:, n - 1:]].max(hit.astype(jnp.int32))
    return banned > 0


def block_repeated_ngrams(logits: Array, tokens: Array, length: Array | int, n: int) -> Array:
    """``logits`` `[R, V]` with −inf where `repeated_ngram_mask` is True (``n <= 0``: unchanged)."""
    if n <= 0:
        return logits
    mask = repeated_ngram_mask(tokens, length, n, logits.shape[-1])
    return jnp.where(mask, jnp.asarray(-jnp.inf, logits.dtype), logits)
