"""Token-by-token decoding (greedy or sampled) as one `lax.while_loop`.

Each iteration picks a token per row from the current logits (``choose``), records it with its
log-probability under the model, and feeds it through one cached model step. A row is finished once
it emits ``eos_id`` (the EOS is kept; later slots get ``pad_id`` and log-prob 0); the loop stops
when every row is finished or after ``max_new_tokens`` tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxformer.decode.ngram import block_repeated_ngrams

Array = jnp.ndarray
StepFn = Callable[..., tuple[Array, Any]]
GrowFn = Callable[[Any, int], Any]


class DecodeResult(NamedTuple):
    """Generated continuations.

    Attributes:
      tokens: `[B, N]` int32 generated ids (EOS included; ``pad_id`` after it).
      log_probs: `[B, N]` float32 log p(token | prefix) under the model (untempered, unfiltered);
        0 after EOS.
      lengths: `[B]` int32 number of generated tokens, EOS included.
      scores: `[B]` float32 sequence score: the sum of ``log_probs`` (beam: length-penalised).
    """

    tokens: Array
    log_probs: Array
    lengths: Array
    scores: Array

    def sequences(self, strip_eos_id: int | None = None) -> list[list[int]]:
        """Host lists of the generated ids, ``lengths`` long (EOS dropped if its id is given)."""
        tokens, lengths = jax.device_get((self.tokens, self.lengths))
        out = []
        for row, n in zip(tokens.tolist(), lengths.tolist()):
            row = row[:n]
            if strip_eos_id is not None and row and row[-1] == strip_eos_id:
                row = row[:-1]
            out.append(row)
        return out


def token_log_probs(logits: Array, tokens: Array) -> Array:
    """log softmax(logits)[token]: `[..., V]`, `[...]` → `[...]` float32."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]


def segmented_loop(cond: Callable[[dict], Array], body_for: Callable[[int], Callable[[dict], dict]],
                   carry: dict, ends: Sequence[int], grow: GrowFn | None) -> dict:
    """``lax.while_loop(cond, body, carry)`` over steps ``carry["i"]``, cut at ``ends``: before the
    steps up to ``end``, ``grow(carry["state"], end)`` makes room for them in the cache, and
    ``body_for(end)`` runs them (one compiled loop per segment; the cache's size is static in
    each). ``grow`` None: one segment, the state as it is."""
    for end in ends:
        if grow is not None:
            carry = {**carry, "state": grow(carry["state"], end)}
        carry = lax.while_loop(lambda c, end=end: jnp.logical_and(c["i"] < end, cond(c)),
                               body_for(end), carry)
    return carry


def decode_loop(
    step_fn: StepFn,
    logits: Array,
    state: Any,
    positions: Array,
    choose: Callable[[jax.Array, Array], Array],
    *,
    max_new_tokens: int,
    eos_id: int | None,
    pad_id: int,
    rng: jax.Array | None = None,
    no_repeat_ngram_size: int = 0,
    ends: Sequence[int] | None = None,
    grow: GrowFn | None = None,
) -> DecodeResult:
    """Generate up to ``max_new_tokens`` tokens per row.

    Args:
      step_fn: ``(state, tokens [B], positions [B]) → (logits [B, V], state)`` (one cached step).
      logits: `[B, V]` logits of the first token to generate.
      state: decode state passed through ``step_fn``.
      positions: `[B]` position of the first generated token.
      choose: ``(rng, logits [B, V]) → tokens [B]`` (argmax, or `sampling.sample`).
      eos_id: id that ends a row (None: rows run to ``max_new_tokens``).
      rng: key for ``choose``; step ``i`` uses ``fold_in(rng, i)``.
      no_repeat_ngram_size: ``choose`` never picks a token that repeats an n-gram of the row's
        generated tokens (`jaxformer.decode.ngram`; 0 = off). Log-probs stay the model's.
      ends, grow: the cache's growth (`jaxformer.decode.steps.DecodeStart`, `segmented_loop`);
        None: the state's cache already fits all ``max_new_tokens`` steps.
    """
    b = logits.shape[0]
    rng = jax.random.key(0) if rng is None else rng
    carry = dict(
        i=jnp.zeros((), jnp.int32), logits=logits, state=state, positions=positions,
        tokens=jnp.full((b, max_new_tokens), pad_id, jnp.int32),
        log_probs=jnp.zeros((b, max_new_tokens), jnp.float32),
        lengths=jnp.zeros((b,), jnp.int32), done=jnp.zeros((b,), bool))

    def cond(c):
        return jnp.logical_and(c["i"] < max_new_tokens, ~jnp.all(c["done"]))

    def body(c):
        i, done = c["i"], c["done"]
        allowed = block_repeated_ngrams(c["logits"], c["tokens"], i, no_repeat_ngram_size)
        tok = choose(jax.random.fold_in(rng, i), allowed).astype(jnp.int32)
        lp = token_log_probs(c["logits"], tok)
        tok = jnp.where(done, pad_id, tok)
        lp = jnp.where(done, 0.0, lp)
        tokens = lax.dynamic_update_slice_in_dim(c["tokens"], tok[:, None], i, axis=1)
        log_probs = lax.dynamic_update_slice_in_dim(c["log_probs"], lp[:, None], i, axis=1)
        lengths = c["lengths"] + (~done).astype(jnp.int32)
        if eos_id is not None:
            done = jnp.logical_or(done, tok == eos_id)
        logits, state = step_fn(c["state"], tok, c["positions"])
        return dict(i=i + 1, logits=logits, state=state, positions=c["positions"] + 1,
                    tokens=tokens, log_probs=log_probs, lengths=lengths, done=done)

    out = segmented_loop(cond, lambda _: body, carry, ends or (max_new_tokens,), grow)
    return DecodeResult(out["tokens"], out["log_probs"], out["lengths"],
                        jnp.sum(out["log_probs"], axis=-1))
