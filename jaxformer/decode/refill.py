"""Continuous batching at segment granularity: a finished row takes the next waiting prompt.

`jaxformer.decode.generate_batches` decodes fixed batches: a batch runs until its longest row ends,
so on a set whose outputs end at very different lengths (EOS early for some inputs) most rows of a
batch idle through most of its steps. Here the ``B`` rows of one running batch (a *pool*) are
refilled instead: decoding runs ``segment`` steps at a time (one jitted `lax.while_loop`, stopping
early when every row is done); between segments the host collects the rows that finished and puts
waiting prompts in their place, so the batch stays full while the queue lasts.

How a prompt joins a running pool. All rows share the cache's slot index ``I`` (the model writes
every row's next token at slot ``I``), and a row's history sits in the slots just before it. A new
prompt is prefilled on its own (`steps.start` on a batch of new rows, its prompt right-aligned in
``P`` slots) and its ``P`` slots are copied into its row at ``I − P … I − 1``; the row's other slots
are cleared (invalid, never attended). Positions travel with the slots (`positions`, RoPE-rotated
keys), so the row then continues exactly as it would alone: every row sees only its own valid
slots, causally. The cache has a fixed ``S = P + max_new_tokens + segment`` slots; before a segment,
the slots older than the oldest running row's first slot are dead for every row, and the slot axis
is rolled so that this row starts at slot 0 (`_compact`), which keeps ``I + segment ≤ S``.

Greedy results equal generating each prompt alone (as `generate_batches`'); sampled rows draw from
``fold_in(rng, segment number)``, so a row's sample depends on the rows around it. Beam search and
``no_repeat_ngram_size`` are not refilled (`generate_batches` decodes them). Compiled programs: one
segment loop and one refill, for the pool's shape.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxformer.decode import steps
from jaxformer.decode.cache import NO_BATCH_AXIS, cache_batch_axes, cache_slot_axes, grow_slots
from jaxformer.decode.sampling import sample
from jaxformer.models import Model

Array = jnp.ndarray


def _slot_last(x: Array, batch_axis: int, slot_axis: int) -> Array:
    """``x`` with its batch axis first and its slot axis last."""
    return jnp.moveaxis(x, (batch_axis, slot_axis), (0, -1))


def _slot_back(x: Array, batch_axis: int, slot_axis: int) -> Array:
    return jnp.moveaxis(x, (0, -1), (batch_axis, slot_axis))


def _rows(take: Array, ndim: int) -> Array:
    """`[B]` bool → broadcastable against a batch-first array of ``ndim`` axes."""
    return take.reshape(take.shape + (1,) * (ndim - 1))


def splice(pool_leaf: Array, fresh_leaf: Array, batch_axis: int, slot_axis: int, *,
           take: Array, index: Array, prefix: int) -> Array:
    """Rows ``take`` `[B]` of a pool cache leaf replaced by a fresh prefill's: its first ``prefix``
    slots go to slots ``index − prefix … index − 1``, the row's other slots are cleared (zero:
    invalid); a leaf without slot axis (cross-attention keys/values) is replaced whole."""
    if batch_axis == NO_BATCH_AXIS:  # the scalar slot index: the pool's
        return pool_leaf
    if slot_axis == NO_BATCH_AXIS:
        rows = _rows(take, pool_leaf.ndim)
        b = jnp.moveaxis(pool_leaf, batch_axis, 0)
        f = jnp.moveaxis(fresh_leaf, batch_axis, 0).astype(b.dtype)
        return jnp.moveaxis(jnp.where(rows, f, b), 0, batch_axis)
    b = _slot_last(pool_leaf, batch_axis, slot_axis)
    f = _slot_last(fresh_leaf, batch_axis, slot_axis)[..., :prefix].astype(b.dtype)
    new = lax.dynamic_update_slice_in_dim(jnp.zeros_like(b), f, index - prefix, axis=b.ndim - 1)
    return _slot_back(jnp.where(_rows(take, b.ndim), new, b), batch_axis, slot_axis)


def _compact(pool: dict, slot_axes: Any, prefix: int) -> dict:
    """Roll every cache leaf's slot axis so that the oldest running row's first slot becomes slot
    0 (the slots before it are dead for every running row) and move the index with it; the index
    stays at least ``prefix`` (a new prompt's slots fit before it)."""
    cache = pool["state"]["cache"]
    shift = jnp.min(jnp.where(pool["done"], cache["index"] - prefix, pool["first_slot"]))

    def rolled(pool):
        cache = jax.tree.map(lambda x, ax: x if ax == NO_BATCH_AXIS else jnp.roll(x, -shift, ax),
                             pool["state"]["cache"], slot_axes)
        cache = {**cache, "index": cache["index"] - shift}
        return {**pool, "state": {**pool["state"], "cache": cache},
                "first_slot": pool["first_slot"] - shift}

    return lax.cond(shift > 0, rolled, lambda pool: pool, pool)


def empty_pool(model: Model, params: Any, batch_size: int, width: int, slots: int,
               config) -> dict:
    """A pool of ``batch_size`` finished rows (nothing running) whose cache has ``slots`` slots and
    its index at the prompt width (a prompt's ``P`` slots fit before it); ``width``: the padded
    prompt (source) width of every prompt."""
    family = model.cfg.family
    prefix = width if family == "decoder" else 1

    def fresh(p):
        s = _fresh(model, p, jnp.zeros((batch_size, width), jnp.int32),
                   jnp.ones((batch_size,), jnp.int32), config)
        return {"logits": s.logits, "state": s.state, "positions": s.positions}

    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(fresh, params))
    slot_axes = cache_slot_axes(model, batch_size, None if family == "decoder" else width)
    state = {**zeros["state"], "cache": grow_slots(zeros["state"]["cache"], slot_axes, slots)}
    state["cache"]["index"] = jnp.int32(prefix)
    n = config.max_new_tokens
    return {"state": state, "logits": zeros["logits"], "positions": zeros["positions"],
            "t": jnp.zeros((batch_size,), jnp.int32), "done": jnp.ones((batch_size,), bool),
            "first_slot": jnp.zeros((batch_size,), jnp.int32),
            "tokens": jnp.full((batch_size, n), config.pad_id, jnp.int32)}


def _fresh(model, params, inputs, lengths, config) -> steps.DecodeStart:
    return steps.start(model, params, inputs, lengths, max_new_tokens=1,
                       decoder_start_id=config.decoder_start_id)


def _refill_impl(model: Model, config, params: Any, pool: dict, inputs: Array,
                 lengths: Array, take: Array) -> dict:
    """Rows ``take`` `[B]` of ``pool`` start the prompts ``inputs`` `[B, P]` (``lengths`` `[B]`;
    other rows' inputs are ignored)."""
    b = inputs.shape[0]
    s = _fresh(model, params, inputs, lengths, config)
    source = None if model.cfg.family == "decoder" else inputs.shape[1]
    cache = pool["state"]["cache"]
    index = cache["index"]
    new_cache = jax.tree.map(
        partial(splice, take=take, index=index, prefix=s.prefix_slots), cache, s.state["cache"],
        cache_batch_axes(model, 1, source), cache_slot_axes(model, b, source))
    state = {**pool["state"], "cache": new_cache}
    if "source_segment_ids" in state:
        state["source_segment_ids"] = jnp.where(take[:, None], s.state["source_segment_ids"],
                                                state["source_segment_ids"])
    pool = {"state": state,
            "logits": jnp.where(take[:, None], s.logits, pool["logits"]),
            "positions": jnp.where(take, s.positions, pool["positions"]),
            "t": jnp.where(take, 0, pool["t"]),
            "done": jnp.where(take, False, pool["done"]),
            "first_slot": jnp.where(take, index - s.prefix_slots, pool["first_slot"]),
            "tokens": jnp.where(take[:, None], config.pad_id, pool["tokens"])}
    return pool


def _segment_impl(model: Model, config, segment: int, params: Any, pool: dict,
                  rng: Array | None, temperature: Array, top_p: Array) -> dict:
    """Up to ``segment`` decoding steps of every row of ``pool`` (stopping when all are done),
    after compacting its cache (`_compact`)."""
    n, eos, pad = config.max_new_tokens, config.eos_id, config.pad_id
    if config.strategy == "greedy":
        choose = partial(sample, temperature=0.0)
    else:
        choose = partial(sample, temperature=temperature, top_k=config.top_k,
                         top_p=None if config.top_p is None else top_p)
    rng = jax.random.key(0) if rng is None else rng
    b = pool["t"].shape[0]
    rows = jnp.arange(b)
    source = None if model.cfg.family == "decoder" else pool["state"]["source_segment_ids"].shape[1]
    prefix = 1 if source else pool["state"]["cache"]["positions"].shape[1] - n - segment
    pool = _compact(pool, cache_slot_axes(model, b, source), prefix)

    def body(c):
        i, p = c
        done = p["done"]
        tok = jnp.where(done, pad, choose(jax.random.fold_in(rng, i), p["logits"]))
        tok = tok.astype(jnp.int32)
        tokens = p["tokens"].at[rows, jnp.where(done, n, p["t"])].set(tok, mode="drop")
        t = p["t"] + (~done).astype(jnp.int32)
        finished = t >= n if eos is None else jnp.logical_or(tok == eos, t >= n)
        logits, state = steps.step(model, params, p["state"], tok, p["positions"])
        return i + 1, {**p, "state": state, "logits": logits, "tokens": tokens, "t": t,
                       "done": jnp.logical_or(done, finished),
                       "positions": p["positions"] + (~done).astype(jnp.int32)}

    def cond(c):
        return jnp.logical_and(c[0] < segment, ~jnp.all(c[1]["done"]))

    return lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), pool))[1]


_refill_jit = jax.jit(_refill_impl, static_argnums=(0, 1))
_segment_jit = jax.jit(_segment_impl, static_argnums=(0, 1, 2))


def refill_supported(config) -> bool:
    """Whether `generate_refill` decodes ``config`` (greedy or sampling, no n-gram blocking)."""
    return config.strategy != "beam" and not config.no_repeat_ngram_size


def generate_refill(model: Model, params: Any, rows: Sequence[Sequence[int]], config, *,
                    batch_size: int, width: int, pad_rows, program, knobs: tuple[Array, Array],
                    segment: int = 16, rng: jax.Array | None = None) -> list[list[int]]:
    """Generated ids of each of ``rows`` (token-id lists), in order, ``batch_size`` rows decoding at
    once and finished rows refilled every ``segment`` steps (module docstring). ``width``: the
    padded input width of every prompt; ``pad_rows(rows, width)`` → (`[n, width]`, `[n]`) NumPy
    inputs and lengths (checked); ``program``: the config reduced to the compiled program's key,
    ``knobs``: its traced (temperature, top_p)."""
    n_new = config.max_new_tokens
    family = model.cfg.family
    slots = (width if family == "decoder" else 1) + n_new + segment
    pool = empty_pool(model, params, batch_size, width, slots, program)
    queue = deque(range(len(rows)))
    owner: list[int | None] = [None] * batch_size
    out: list[list[int]] = [[] for _ in rows]
    number = 0
    while True:
        done, t, tokens = jax.device_get((pool["done"], pool["t"], pool["tokens"]))
        for r in range(batch_size):
            if owner[r] is not None and done[r]:
                seq = tokens[r, :t[r]].tolist()
                if config.eos_id is not None and seq and seq[-1] == config.eos_id:
                    seq = seq[:-1]
                out[owner[r]] = seq
                owner[r] = None
        take = np.zeros((batch_size,), bool)
        batch = [rows[queue[0]] if queue else rows[0]] * batch_size
        for r in range(batch_size):
            if owner[r] is None and queue:
                owner[r] = queue.popleft()
                batch[r], take[r] = rows[owner[r]], True
        if take.any():
            inputs, lengths = pad_rows(batch, width)
            pool = _refill_jit(model, program, params, pool, jnp.asarray(inputs),
                               jnp.asarray(lengths), jnp.asarray(take))
        if all(o is None for o in owner):
            return out
        key = None if rng is None else jax.random.fold_in(rng, number)
        pool = _segment_jit(model, program, segment, params, pool, key, *knobs)
        number += 1
