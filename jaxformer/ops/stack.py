"""A stack of `transformer_block`s over a parameter pytree: unrolled or scanned, optionally remat.

Layouts (as `jaxformer.layers.params.stack_spec` builds them): unrolled ``{"layer_0": block, …}``,
or scanned ``{"layers": block}`` with every leaf stacked on a leading ``layers`` axis, or shared
``{"shared": block}`` (ALBERT's cross-layer sharing, Lan et al. 2019: one block applied
``num_layers`` times, by `jax.lax.scan` with ``cfg.scan_layers``, else a loop). Scanning
(`jax.lax.scan`) compiles one layer instead of ``num_layers``; both compute the same function.
``cfg.remat_policy`` wraps each block in `jax.checkpoint` (Chen et al. 2016): "full" saves nothing,
"dots" saves matmul outputs. The Linen `Stack` runs the same blocks through ``nn.scan``/``nn.remat``
with these policies; the NNX models call `run_stack`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxformer.ops.blocks import ACTIVATION_AXES, Constrain, transformer_block, two_stream_block
from jaxformer.ops.settings import ModelSettings

Array = jnp.ndarray

REMAT_POLICIES = {
    "full": None,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_with_no_batch_dims": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


def has_dropout(cfg: ModelSettings) -> bool:
    """Whether a block drops anything (residual, attention or FFN dropout)."""
    return bool(cfg.dropout_rate or cfg.attention_dropout_rate or cfg.ffn_dropout_rate)


def stack_block(params: dict, x: Array, *, cfg: ModelSettings, constrain: Constrain | None = None,
                two_stream: dict | None = None, **kwargs) -> tuple[Array, dict | None]:
    """`transformer_block` on the residual stream `[B, L, D]` cast to ``cfg.dtype`` and pinned to
    ``ACTIVATION_AXES`` on the way in and out (the output only when not decoding).

    ``two_stream`` (XLNet's permutation LM): ``{"content_mask", "query_mask", "query_positions"}``
    of `two_stream_block`; ``x`` is then the pair (content stream, query stream), each `[B, L, D]`,
    and so is the output."""
    pin = constrain or (lambda a, _: a)
    if two_stream is not None:
        h, g = (pin(s.astype(jnp.dtype(cfg.dtype)), ACTIVATION_AXES) for s in x)
        h, g = two_stream_block(params, h, g, cfg=cfg, constrain=constrain, **two_stream,
                                positions=kwargs.get("positions"),
                                segment_ids=kwargs.get("segment_ids"),
                                dropout_rng=kwargs.get("dropout_rng"))
        return (pin(h, ACTIVATION_AXES), pin(g, ACTIVATION_AXES)), None
    x = pin(x.astype(jnp.dtype(cfg.dtype)), ACTIVATION_AXES)
    y, cache = transformer_block(params, x, cfg=cfg, constrain=constrain, **kwargs)
    return (y if cache is not None else pin(y, ACTIVATION_AXES)), cache


def run_stack(params: dict, x: Array, *, cfg: ModelSettings, num_layers: int, causal: bool = False,
              dropout_rng: jax.Array | None = None, constrain: Constrain | None = None,
              **inputs) -> Array:
    """``num_layers`` blocks in order, `[B, L, D]` → `[B, L, D]` (no decoding cache); with a
    ``two_stream`` input (see `stack_block`) the pair (content, query stream) → the pair.

    Args:
      params: ``{"layers": stacked}`` (scanned), ``{"layer_0": …, "layer_{N-1}": …}`` or
        ``{"shared": block}`` (one block for every layer).
      causal: causal self-attention (decoders).
      dropout_rng: enables dropout; layer ``i`` uses ``split(dropout_rng, num_layers)[i]`` in both
        layouts, so a scanned stack equals its unrolled twin with dropout on too.
      inputs: `transformer_block` arrays shared by the layers (``positions``, ``segment_ids``,
        ``bias``, ``encoder_out``, ``encoder_segment_ids``; None when absent). They are explicit
        arguments of the rematerialised block, as in the Linen ``nn.remat(Block)``, so both
        compile to the same program.
    """
    shared = params.get("shared")
    scanned = "layers" in params or (shared is not None and cfg.scan_layers)

    def block(p, h, rng, shared):
        return stack_block(p, h, cfg=cfg, causal=causal, dropout_rng=rng, constrain=constrain,
                           **shared)[0]

    if cfg.remat_policy != "none":
        block = jax.checkpoint(block, policy=REMAT_POLICIES[cfg.remat_policy],
                               prevent_cse=not scanned)
    rngs = None if dropout_rng is None else jax.random.split(dropout_rng, num_layers)
    if scanned and shared is not None:
        body = lambda h, rng: (block(shared, h, rng, inputs), None)
        return lax.scan(body, x, rngs, length=num_layers)[0]
    if scanned:
        body = lambda h, pr: (block(pr[0], h, pr[1], inputs), None)
        return lax.scan(body, x, (params["layers"], rngs))[0]
    for i in range(num_layers):
        p = params[f"layer_{i}"] if shared is None else shared
        x = block(p, x, None if rngs is None else rngs[i], inputs)
    return x
