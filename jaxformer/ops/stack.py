"""A stack of `transformer_block`s over a parameter pytree: unrolled or scanned, optionally remat.

Layouts (as `jaxformer.models.spec.stack_spec` builds them): unrolled ``{"layer_0": block, …}``,
or scanned ``{"layers": block}`` with every leaf stacked on a leading ``layers`` axis, or shared
``{"shared": block}`` (ALBERT's cross-layer sharing, Lan et al. 2019: one block applied
``num_layers`` times, by `jax.lax.scan` with ``cfg.scan_layers``, else a loop). Scanning
(`jax.lax.scan`) compiles one layer instead of ``num_layers``; both compute the same function.
``cfg.remat_policy`` wraps each block in `jax.checkpoint` (Chen et al. 2016): "full" saves nothing,
"dots" saves matmul outputs. This is the one layer loop of the library: the models
(`jaxformer.models.forward`) run every stack, decoding included (`stack_cache`), through `run_stack`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxformer.ops.blocks import ACTIVATION_AXES, Constrain, transformer_block, two_stream_block
from jaxformer.ops.model_fields import ModelFields
from jaxformer.ops.moe import RouterStats

Array = jnp.ndarray

REMAT_POLICIES = {
    "full": None,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_with_no_batch_dims": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


def has_dropout(cfg: ModelFields) -> bool:
    """Whether a block drops anything (residual, attention or FFN dropout)."""
    return bool(cfg.dropout_rate or cfg.attention_dropout_rate or cfg.ffn_dropout_rate)


def stack_block(params: dict, x: Array, *, cfg: ModelFields, constrain: Constrain | None = None,
                two_stream: dict | None = None, **kwargs
                ) -> tuple[Array, dict | None, RouterStats | None]:
    """`transformer_block` on the residual stream `[B, L, D]` cast to ``cfg.dtype`` and pinned to
    ``ACTIVATION_AXES`` on the way in and out (the output only when not decoding).

    ``two_stream`` (XLNet's permutation LM): ``{"content_mask", "query_mask", "query_positions"}``
    of `two_stream_block`; ``x`` is then the pair (content stream, query stream), each `[B, L, D]`,
    and so is the output. Returns (output, new cache or None, MoE `RouterStats` or None)."""
    pin = constrain or (lambda a, _: a)
    if two_stream is not None:
        h, g = (pin(s.astype(jnp.dtype(cfg.dtype)), ACTIVATION_AXES) for s in x)
        h, g = two_stream_block(params, h, g, cfg=cfg, constrain=constrain, **two_stream,
                                positions=kwargs.get("positions"),
                                segment_ids=kwargs.get("segment_ids"),
                                dropout_rng=kwargs.get("dropout_rng"))
        return (pin(h, ACTIVATION_AXES), pin(g, ACTIVATION_AXES)), None, None
    x = pin(x.astype(jnp.dtype(cfg.dtype)), ACTIVATION_AXES)
    y, cache, stats = transformer_block(params, x, cfg=cfg, constrain=constrain, **kwargs)
    return (y if cache is not None else pin(y, ACTIVATION_AXES)), cache, stats


def mean_stats(stats: list[RouterStats]) -> RouterStats | None:
    """The mean of MoE layers' `RouterStats` (None without any)."""
    if not stats:
        return None
    return jax.tree.map(lambda *a: sum(a) / len(a), *stats)


def run_stack(params: dict, x: Array, *, cfg: ModelFields, num_layers: int, causal: bool = False,
              dropout_rng: jax.Array | None = None, constrain: Constrain | None = None,
              cache: dict | None = None, cache_index: Array | None = None,
              router_stats: bool = False, **inputs):
    """``num_layers`` blocks in order, `[B, L, D]` → `[B, L, D]`; with a ``two_stream`` input (see
    `stack_block`) the pair (content, query stream) → the pair; with a decoding ``cache``
    (`stack_cache`'s layout) the pair (`[B, L, D]`, the updated cache).

    Args:
      params: ``{"layers": stacked}`` (scanned), ``{"layer_0": …, "layer_{N-1}": …}`` or
        ``{"shared": block}`` (one block for every layer).
      causal: causal self-attention (decoders).
      dropout_rng: enables dropout; layer ``i`` uses ``split(dropout_rng, num_layers)[i]`` in both
        layouts, so a scanned stack equals its unrolled layout with dropout on too.
      cache, cache_index: per-layer decoding caches laid out like ``params`` (``{"layers": …}``
        with a leading ``layers`` axis, scanned with the parameters, or ``{"layer_i": …}``), each
        ``{"self": …, "cross"?: (k, v)}`` of `jaxformer.ops.blocks.transformer_block`; the new
        tokens are written at slot ``cache_index``. The cross-attention keys/values are computed
        on a call that passes ``encoder_out`` and read from the cache on the others.
      router_stats: return (that output, the mean `jaxformer.ops.moe.RouterStats` of the stack's
        MoE layers, None without any).
      inputs: `transformer_block` arrays shared by the layers (``positions``, ``segment_ids``,
        ``bias``, ``encoder_out``, ``encoder_segment_ids``, ``local_mask``; None when absent).
        Each block gets its ``layer_index`` (a traced scalar when scanned). They are explicit
        arguments of the rematerialised block, so the block compiles once per stack.
    """
    shared = params.get("shared")
    scanned = "layers" in params or (shared is not None and cfg.scan_layers)
    if cache is not None and shared is not None:
        raise ValueError("model.share_layers=True stacks do not decode (encoder family only)")

    def block(p, h, rng, c, index, shared, layer):
        kwargs = {}
        if c is not None:
            kwargs = dict(cache=c["self"], cache_index=index)
            if "cross" in c and shared.get("encoder_out") is None:  # later steps: cached k/v
                kwargs["cross_kv"] = c["cross"]
        h, new, stats = stack_block(p, h, cfg=cfg, causal=causal, dropout_rng=rng,
                                    constrain=constrain, layer_index=layer, **shared, **kwargs)
        return h, None if c is None else {k: new[k] for k in c}, stats

    if cfg.remat_policy != "none":
        block = jax.checkpoint(block, policy=REMAT_POLICIES[cfg.remat_policy],
                               prevent_cse=not scanned)
    rngs = None if dropout_rng is None else jax.random.split(dropout_rng, num_layers)
    done = lambda out, stats: (out, mean_stats(stats)) if router_stats else out  # noqa: E731
    # a scanned block's `layer_index`, where a layer's kind depends on it (other programs unchanged)
    per_layer = cfg.local_attention is not None or not cfg.first_attn_norm
    layers = jnp.arange(num_layers, dtype=jnp.int32) if per_layer else None
    if scanned and shared is not None:
        def shared_body(h, xs):
            h, _, stats = block(shared, h, xs[0], None, None, inputs, xs[1])
            return h, stats

        x, stats = lax.scan(shared_body, x, (rngs, layers), length=num_layers)
        return done(x, [] if stats is None else [jax.tree.map(lambda a: a.mean(0), stats)])
    if scanned:
        def body(h, prc):
            h, new, stats = block(prc[0], h, prc[1], prc[2], cache_index, inputs, prc[3])
            return h, (new, stats)

        with jax.named_scope("layers"):
            x, (new_cache, stats) = lax.scan(body, x, (params["layers"], rngs,
                                                       None if cache is None else cache["layers"],
                                                       layers))
        stats = [] if stats is None else [jax.tree.map(lambda a: a.mean(0), stats)]
        return done(x if cache is None else (x, {"layers": new_cache}), stats)
    new_cache, stats = {}, []
    for i in range(num_layers):
        name = f"layer_{i}"
        p = params[name] if shared is None else shared
        with jax.named_scope(name):
            x, new_cache[name], layer_stats = block(
                p, x, None if rngs is None else rngs[i], None if cache is None else cache[name],
                cache_index, inputs, i if per_layer else None)
        stats += [] if layer_stats is None else [layer_stats]
    return done(x if cache is None else (x, new_cache), stats)


def stack_cache(cfg: ModelFields, num_layers: int, batch_size: int, slots: int,
                source_length: int | None = None) -> dict:
    """A zero decoding cache for one stack, laid out as `run_stack` reads it: per layer
    ``{"self": {"key", "value": [B, K, S, Dh], "valid": [B, S] bool}}`` (heads-major, as
    `jaxformer.ops.blocks` stores it), plus ``"cross": (k, v)`` `[B, K, S_src, Dh]` each when
    ``source_length`` is given (a decoder with cross-attention); ``{"layers": …}`` with a leading
    ``layers`` axis when ``cfg.scan_layers``, else ``{"layer_i": …}``. Dtype: ``cfg.dtype``."""
    dtype = jnp.dtype(cfg.dtype)
    lead = (num_layers,) if cfg.scan_layers else ()

    def zeros(*shape, dtype=dtype):
        return jnp.zeros(lead + shape, dtype)

    def layer():
        kv = (batch_size, cfg.num_kv_heads, slots, cfg.head_dim)
        c = {"self": {"key": zeros(*kv), "value": zeros(*kv),
                      "valid": zeros(batch_size, slots, dtype=bool)}}
        if source_length is not None:
            ckv = (batch_size, cfg.num_kv_heads, source_length, cfg.head_dim)
            c["cross"] = (zeros(*ckv), zeros(*ckv))
        return c

    if cfg.scan_layers:
        return {"layers": layer()}
    return {f"layer_{i}": layer() for i in range(num_layers)}
