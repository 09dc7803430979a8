"""Context parallelism: the sequence split over the mesh axis the rules give ``act_length``
(``context``), attention computed as ring attention (`jaxformer.ops.ring_attention`).

With ``mesh.context=N`` every activation `[batch, length, ...]` is split along its length in
``N`` blocks (the logical rule ``act_length → context``); position-wise layers (embeddings, norms,
projections, FFN, logits, losses) need nothing else. Attention, the one layer that mixes
positions, runs per device under `jax.shard_map` as `ring_attention`: rows split over the rules'
``batch`` axes, heads over their ``heads`` axes (when they divide), the length over ``context``,
keys/values passed around the ring with collective-permutes. The model runs its sequence in
zig-zag order, which balances causal attention (`jaxformer.models.forward` reorders its inputs
once and its last hidden states back), so batches, logits and losses keep their natural order.

`mesh_rules` (`jaxformer.parallel.partition`) enters `context_parallel_for(mesh, rules)`, so a
step traced by `sharded_jit` on a mesh with ``context > 1`` uses it; elsewhere (``context=1``,
plain ``model.apply``, decoding) attention is as configured.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from jaxformer.ops.ring_attention import ContextParallel, ring_attention
from jaxformer.parallel.rules import Rules, check_rules


def _axes(axes) -> tuple[str, ...]:
    return () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)


def _split(mesh: Mesh, axes, size: int):
    """``axes`` if their mesh size divides ``size``, else None (that dimension stays whole)."""
    n = math.prod(mesh.shape[a] for a in _axes(axes))
    return axes if n > 1 and size % n == 0 else None


def context_axis(mesh: Mesh, rules: Rules) -> str | None:
    """The mesh axis the rules split the activations' length over, when its size is > 1."""
    axes = _axes(nn.logical_to_mesh_axes(("act_length",), check_rules(rules))[0])
    live = [a for a in axes if mesh.shape.get(a, 1) > 1]
    if len(live) > 1:
        raise ValueError(f"the rule for 'act_length' maps it to {axes}: ring attention runs over "
                         "one mesh axis; map it to 'context' alone")
    return live[0] if live else None


def ring_attention_sharded(mesh: Mesh, axis: str, batch_axes, head_axes, q, k, v, *,
                           bias=None, mask=None, causal: bool = False, q_segment_ids=None,
                           kv_segment_ids=None, scale: float | None = None,
                           dropout_rate: float = 0.0, dropout_rng=None, precision=None,
                           kv_chunk_size: int = 512):
    """`ring_attention` of global arrays in zig-zag order, ``q`` `[B, L, H, Dh]`, ``k``/``v``
    `[B, S, K, Dh]`, ``bias`` broadcastable to `[B, H, L, S]`, segment ids `[B, L]` / `[B, S]`,
    run per device of ``mesh`` with the length split over ``axis``. Returns `[B, L, H, Dv]`."""
    if mask is not None:
        raise ValueError("context parallelism (mesh.context > 1) takes causal, segment and bias "
                         "masks only, not a dense mask (XLNet's two streams, decoding): use "
                         "mesh.context=1 for this model")
    if dropout_rate and dropout_rng is not None:
        raise ValueError("context parallelism (mesh.context > 1) has no attention dropout: set "
                         "model.attention_dropout_rate=0.0")
    b, lq, h, _ = q.shape
    kvh = k.shape[2]
    if q_segment_ids is None:
        q_segment_ids = jnp.ones((b, lq), jnp.int32)
    if kv_segment_ids is None:
        kv_segment_ids = q_segment_ids if k.shape[1] == lq else jnp.ones(k.shape[:2], jnp.int32)
    rows = _split(mesh, batch_axes, b)
    heads = _split(mesh, head_axes, h) if _split(mesh, head_axes, kvh) is not None else None
    qkv, seg = PartitionSpec(rows, axis, heads, None), PartitionSpec(rows, axis)
    specs = [qkv, qkv, qkv, seg, seg]
    args = [q, k, v, q_segment_ids, kv_segment_ids]
    if bias is not None:
        bias = bias.reshape((1,) * (4 - bias.ndim) + bias.shape)
        specs.append(PartitionSpec(rows if bias.shape[0] > 1 else None,
                                   heads if bias.shape[1] > 1 else None,
                                   axis if bias.shape[2] > 1 else None, None))
        args.append(bias)

    def per_device(q, k, v, q_seg, kv_seg, bias=None):
        return ring_attention(q, k, v, axis_name=axis, causal=causal, q_segment_ids=q_seg,
                              kv_segment_ids=kv_seg, bias=bias, scale=scale, precision=precision,
                              kv_chunk_size=kv_chunk_size)

    return jax.shard_map(per_device, mesh=mesh, in_specs=tuple(specs), out_specs=qkv)(*args)


def context_parallel_for(mesh: Mesh, rules: Rules) -> ContextParallel | None:
    """The `ContextParallel` of ``mesh`` under ``rules`` (None when the length is not split)."""
    axis = context_axis(mesh, rules)
    if axis is None:
        return None
    batch_axes, head_axes = nn.logical_to_mesh_axes(("batch", "heads"), check_rules(rules))
    return ContextParallel(mesh.shape[axis], functools.partial(
        ring_attention_sharded, mesh, axis, batch_axes, head_axes))


__all__ = ["context_axis", "context_parallel_for", "ring_attention_sharded"]
