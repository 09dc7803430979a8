"""Mixture-of-experts feed-forward layer: a top-k router over ``E`` expert FFNs.

    logits = x · W_r                         (float32 whatever the compute dtype: Switch's
                                              "selective precision", Fedus et al. 2022 §2.4)
    p      = softmax(logits)                 `[..., E]`
    y      = Σ_{i ∈ top-k(p)} g_i · FFN_i(x) (Shazeer et al. 2017 eq. 1; Switch k = 1, g = p_i;
                                              Mixtral k = 2, g = softmax over the chosen logits,
                                              i.e. p_i / Σ_top-k p, ``norm_topk_prob``)

Token groups: a row of the batch is one group (``G`` = batch, ``T`` = its length), so routing does
not depend on the batch size or the mesh. Two ways to run the experts:

* **capacity** (GShard, Lepikhin et al. 2020; Switch §2.2): each expert takes at most
  ``C = ceil(capacity_factor · T · k / E)`` assignments per group; assignments are served in order
  (every token's first choice, in token order, then every token's second choice, …) and those past
  ``C`` are dropped: their token gets nothing from that expert (a token dropped by all its choices
  passes through the block's residual unchanged). Dispatch and combine are one-hot einsums
  `[G, T, E, C]`, which a mesh partitions into all-to-alls when experts are sharded
  (`jaxformer.parallel.rules`, logical axis ``expert``).
* **dropless** (MegaBlocks, Gale et al. 2023; Mixtral): assignments sorted by expert and run through
  a grouped matmul, `jax.lax.ragged_dot`; nothing is dropped (= capacity ∞).

Auxiliary losses (returned in `RouterStats`, weighted by the caller):

* load balancing (Switch eq. 4 without α): ``E · Σ_i f_i · P_i``, f_i the fraction of tokens routed
  to expert i (each of the k choices counts, so Σ f = k as in HF's Mixtral and MaxText), P_i the
  mean router probability of expert i; a uniform router gives k (k = 1: the minimum 1).
* router z-loss (ST-MoE, Zoph et al. 2022 eq. 5): mean over tokens of ``logsumexp(logits)²``.

Padding tokens (``token_mask`` False) take no capacity and count in no statistic.

Parameters (``E`` experts, ``F`` their hidden width)::

    router:  {kernel [D, E]}
    wi, wi_gate?: {kernel [E, D, F], bias? [E, F]};  wo: {kernel [E, F, D], bias? [E, D]}
    shared?: a dense FFN (`jaxformer.ops.ffn`) every token runs (Qwen2-MoE, DeepSeekMoE)
    shared_gate?: {kernel [D, 1]}: the shared FFN's output scaled by sigmoid(x · kernel) (Qwen2-MoE)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxformer.ops.activations import get_activation
from jaxformer.ops.dense import dense
from jaxformer.ops.dropout import dropout
from jaxformer.ops.ffn import ffn

Array = jnp.ndarray
Constrain = Callable[[Array, tuple[str, ...]], Array]

# Logical names of the dispatched activations `[G, E, C, D]`:
# experts split over the ``expert`` mesh axis (`jaxformer.parallel.rules`).
DISPATCH_AXES = ("act_expert_batch", "act_expert", None, "act_embed")


class RouterStats(NamedTuple):
    """Router statistics of one MoE layer (float32).

    Attributes:
      aux_loss: load-balancing loss ``E · Σ f_i P_i`` (Switch eq. 4 without α), scalar.
      z_loss: router z-loss (ST-MoE eq. 5), scalar.
      dropped: fraction of the (token, choice) assignments past capacity, scalar.
      load: `[E]` fraction of the assignments each expert was chosen for (sums to 1).
    """

    aux_loss: Array
    z_loss: Array
    dropped: Array
    load: Array


def router_logits(kernel_DxE: Array, x_GxTxD: Array, *, jitter: float = 0.0,
                  rng: jax.Array | None = None) -> Array:
    """Router logits `[G, T, E]` in float32 of `[G, T, D]` inputs; with ``jitter`` and ``rng`` the
    inputs are first multiplied by noise uniform on [1 − jitter, 1 + jitter] (Switch §2.4)."""
    x = x_GxTxD.astype(jnp.float32)
    if jitter and rng is not None:
        x = x * jax.random.uniform(rng, x.shape, jnp.float32, 1.0 - jitter, 1.0 + jitter)
    return jnp.einsum("gtd,de->gte", x, kernel_DxE.astype(jnp.float32),
                      precision=lax.Precision.HIGHEST)


def top_k_gates(logits_GxTxE: Array, k: int, *, norm_topk_prob: bool) -> tuple[Array, Array, Array]:
    """(gates `[G, T, k]` float32, experts `[G, T, k]` int32, probabilities `[G, T, E]`): the ``k``
    most probable experts of each token, best first. Gates are the softmax probabilities p_i
    (Switch, Qwen2-MoE) or, with ``norm_topk_prob``, p_i / Σ_top-k p = softmax over the chosen
    logits (Mixtral)."""
    probs = jax.nn.softmax(logits_GxTxE.astype(jnp.float32), axis=-1)
    gates, experts = lax.top_k(probs, k)
    if norm_topk_prob:
        gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
    return gates, experts.astype(jnp.int32), probs


def expert_capacity(tokens: int, k: int, num_experts: int, capacity_factor: float) -> int:
    """Assignments one expert takes per group: ``ceil(capacity_factor · tokens · k / E)`` (GShard
    §2.2; Switch eq. 3), at least 1."""
    return max(1, math.ceil(capacity_factor * tokens * k / num_experts))


def positions_in_expert(experts_GxTxK: Array, num_experts: int, token_mask_GxT: Array | None = None
                        ) -> Array:
    """`[G, T, k]` int32: each assignment's place in its expert's queue, counted from 0 in the
    order every token's first choice (token order), then every second choice, … (GShard's
    priority of first choices). Masked tokens hold no place (their value is meaningless)."""
    g, t, k = experts_GxTxK.shape
    one_hot_GxTxKxE = jax.nn.one_hot(experts_GxTxK, num_experts, dtype=jnp.int32)
    if token_mask_GxT is not None:
        one_hot_GxTxKxE = one_hot_GxTxKxE * token_mask_GxT[:, :, None, None].astype(jnp.int32)
    order_GxKTxE = one_hot_GxTxKxE.transpose(0, 2, 1, 3).reshape(g, k * t, num_experts)
    before_GxKTxE = jnp.cumsum(order_GxKTxE, axis=1) - order_GxKTxE
    pos_GxKT = jnp.sum(before_GxKTxE * order_GxKTxE, axis=-1)
    return pos_GxKT.reshape(g, k, t).transpose(0, 2, 1)


def _mask_or_ones(token_mask_GxT: Array | None, shape) -> Array:
    return (jnp.ones(shape, jnp.float32) if token_mask_GxT is None
            else token_mask_GxT.astype(jnp.float32))


def load_balancing_loss(probs_GxTxE: Array, experts_GxTxK: Array,
                        token_mask_GxT: Array | None = None) -> Array:
    """Switch eq. 4 without α: ``E · Σ_i f_i · P_i`` over the (unmasked) tokens, f_i the fraction of
    tokens choosing expert i among their k (Σ f = k), P_i the mean probability of expert i."""
    e = probs_GxTxE.shape[-1]
    m_GxT = _mask_or_ones(token_mask_GxT, probs_GxTxE.shape[:2])
    n = jnp.maximum(jnp.sum(m_GxT), 1.0)
    chosen_GxTxE = jnp.sum(jax.nn.one_hot(experts_GxTxK, e, dtype=jnp.float32), axis=2)
    f_E = jnp.einsum("gte,gt->e", chosen_GxTxE, m_GxT) / n
    p_E = jnp.einsum("gte,gt->e", probs_GxTxE.astype(jnp.float32), m_GxT) / n
    return e * jnp.sum(f_E * p_E)


def router_z_loss(logits_GxTxE: Array, token_mask_GxT: Array | None = None) -> Array:
    """ST-MoE eq. 5: mean over the (unmasked) tokens of ``logsumexp(logits)²``."""
    m_GxT = _mask_or_ones(token_mask_GxT, logits_GxTxE.shape[:2])
    lse_GxT = jax.nn.logsumexp(logits_GxTxE.astype(jnp.float32), axis=-1)
    return jnp.sum(m_GxT * lse_GxT ** 2) / jnp.maximum(jnp.sum(m_GxT), 1.0)


def _load(experts_GxTxK: Array, num_experts: int, m_GxT: Array) -> Array:
    counts_E = jnp.einsum("gtke,gt->e", jax.nn.one_hot(experts_GxTxK, num_experts, dtype=jnp.float32),
                          m_GxT)
    return counts_E / jnp.maximum(jnp.sum(counts_E), 1.0)


def dispatch_and_combine(gates_GxTxK: Array, experts_GxTxK: Array, positions_GxTxK: Array,
                         num_experts: int, capacity: int, token_mask_GxT: Array | None = None
                         ) -> tuple[Array, Array, Array]:
    """(dispatch `[G, T, E, C]` 0/1, combine `[G, T, E, C]` = gate where dispatched, kept
    `[G, T, k]` bool): GShard's dispatch and combine tensors; an assignment is kept when its place
    in the expert's queue is below ``capacity`` (and its token is not masked)."""
    kept_GxTxK = positions_GxTxK < capacity
    if token_mask_GxT is not None:
        kept_GxTxK = kept_GxTxK & token_mask_GxT[:, :, None].astype(bool)
    expert_GxTxKxE = jax.nn.one_hot(experts_GxTxK, num_experts, dtype=jnp.float32)
    slot_GxTxKxC = jax.nn.one_hot(jnp.where(kept_GxTxK, positions_GxTxK, capacity), capacity,
                                  dtype=jnp.float32)  # index `capacity`: all zeros (dropped)
    dispatch_GxTxExC = jnp.einsum("gtke,gtkc->gtec", expert_GxTxKxE, slot_GxTxKxC)
    combine_GxTxExC = jnp.einsum("gtke,gtkc,gtk->gtec", expert_GxTxKxE, slot_GxTxKxC, gates_GxTxK)
    return dispatch_GxTxExC, combine_GxTxExC, kept_GxTxK


def expert_ffns(params: dict, x_GxExCxD: Array, *, activation: str, dropout_rate: float = 0.0,
                dropout_rng: jax.Array | None = None) -> Array:
    """Each expert's FFN (`jaxformer.ops.ffn.ffn`, mapped over the expert axis, each expert its own
    dropout key) on its slots: `[G, E, C, D]` → `[G, E, C, D]`."""
    experts = {k: params[k] for k in ("wi", "wi_gate", "wo") if k in params}
    e = x_GxExCxD.shape[1]
    rngs = None if dropout_rng is None else jax.random.split(dropout_rng, e)
    per_expert = lambda p, x, r: ffn(p, x, activation=activation, dropout_rate=dropout_rate,  # noqa: E731
                                     dropout_rng=r)
    return jax.vmap(per_expert, in_axes=(0, 1, None if rngs is None else 0), out_axes=1)(
        experts, x_GxExCxD, rngs)


def grouped_ffn(params: dict, x_MxD: Array, experts_M: Array, group_sizes_E: Array, *,
                activation: str, dropout_rate: float = 0.0,
                dropout_rng: jax.Array | None = None) -> Array:
    """The experts' FFNs on rows sorted by expert (``group_sizes_E`` rows each, in expert order;
    ``experts_M`` each row's expert, for the biases) by grouped matmuls (`jax.lax.ragged_dot`):
    `[M, D]` → `[M, D]`."""
    def mm(p, h):
        y = lax.ragged_dot(h, p["kernel"].astype(h.dtype), group_sizes_E)
        if p.get("bias") is not None:
            y = y + p["bias"].astype(h.dtype)[experts_M]
        return y

    h = get_activation(activation)(mm(params["wi"], x_MxD))
    if "wi_gate" in params:
        h = h * mm(params["wi_gate"], x_MxD)
    h = dropout(h, dropout_rate, dropout_rng)
    return mm(params["wo"], h)


def _capacity_path(params, x_GxTxD, gates, experts, token_mask, *, num_experts, capacity_factor,
                   activation, dropout_rate, dropout_rng, constrain):
    g, t, _ = x_GxTxD.shape
    pin = constrain or (lambda a, _: a)
    cap = expert_capacity(t, gates.shape[-1], num_experts, capacity_factor)
    positions = positions_in_expert(experts, num_experts, token_mask)
    dispatch, combine, kept = dispatch_and_combine(gates, experts, positions, num_experts, cap,
                                                   token_mask)
    with jax.named_scope("dispatch"):
        x_GxExCxD = jnp.einsum("gtec,gtd->gecd", dispatch.astype(x_GxTxD.dtype), x_GxTxD)
        x_GxExCxD = pin(x_GxExCxD, DISPATCH_AXES)
    with jax.named_scope("experts"):
        y_GxExCxD = expert_ffns(params, x_GxExCxD, activation=activation,
                                dropout_rate=dropout_rate, dropout_rng=dropout_rng)
        y_GxExCxD = pin(y_GxExCxD, DISPATCH_AXES)
    with jax.named_scope("combine"):
        y_GxTxD = jnp.einsum("gtec,gecd->gtd", combine.astype(x_GxTxD.dtype), y_GxExCxD)
    return y_GxTxD, kept


def _dropless_path(params, x_GxTxD, gates, experts, *, num_experts, activation, dropout_rate,
                   dropout_rng):
    g, t, d = x_GxTxD.shape
    k = gates.shape[-1]
    with jax.named_scope("dispatch"):
        experts_N = experts.reshape(-1)  # N = G·T·k assignments, token-major
        order_N = jnp.argsort(experts_N, stable=True)
        x_NxD = x_GxTxD.reshape(g * t, d)[order_N // k]
        sizes_E = jnp.bincount(experts_N, length=num_experts).astype(jnp.int32)
    with jax.named_scope("experts"):
        y_NxD = grouped_ffn(params, x_NxD, experts_N[order_N], sizes_E, activation=activation,
                            dropout_rate=dropout_rate, dropout_rng=dropout_rng)
    with jax.named_scope("combine"):
        y_NxD = jnp.zeros_like(y_NxD).at[order_N].set(y_NxD, unique_indices=True)
        y_GxTxKxD = y_NxD.reshape(g, t, k, d)
        y_GxTxD = jnp.einsum("gtkd,gtk->gtd", y_GxTxKxD, gates.astype(x_GxTxD.dtype))
    return y_GxTxD


def moe_ffn(params: dict, x_BxLxD: Array, *, experts_per_token: int, capacity_factor: float,
            dropless: bool, activation: str, norm_topk_prob: bool, jitter: float = 0.0,
            token_mask: Array | None = None, dropout_rate: float = 0.0,
            rng: jax.Array | None = None, constrain: Constrain | None = None
            ) -> tuple[Array, RouterStats]:
    """The MoE feed-forward sublayer (see the module docstring): `[B, L, D]` → (`[B, L, D]` in
    ``x.dtype``, `RouterStats`). Each row of the batch is a routing group.

    Args:
      params: router, wi, wi_gate?, wo (leading expert axis ``E``), shared?, shared_gate?.
      experts_per_token: k of the top-k routing.
      capacity_factor: the capacity path's C = ceil(capacity_factor · L · k / E).
      dropless: grouped matmuls over all assignments instead (nothing dropped).
      norm_topk_prob: gates renormalised over the k chosen (Mixtral), else the softmax
        probabilities (Switch, Qwen2-MoE).
      jitter: router input noise (training, when ``rng`` is given).
      token_mask: `[B, L]` bool, False on padding (no capacity, no statistics).
      dropout_rate, rng: dropout on the experts' hidden layer (and the key of the jitter).
      constrain: sharding hook ``constrain(x, logical_names)`` (`jaxformer.ops.blocks`).
    """
    num_experts = params["router"]["kernel"].shape[-1]
    jitter_rng, drop_rng = (None, None) if rng is None else tuple(jax.random.split(rng))
    with jax.named_scope("router"):
        logits = router_logits(params["router"]["kernel"], x_BxLxD, jitter=jitter, rng=jitter_rng)
        gates, experts, probs = top_k_gates(logits, experts_per_token, norm_topk_prob=norm_topk_prob)
        if token_mask is not None:
            gates = gates * token_mask[..., None].astype(gates.dtype)
    common = dict(num_experts=num_experts, activation=activation, dropout_rate=dropout_rate,
                  dropout_rng=drop_rng)
    m = _mask_or_ones(token_mask, x_BxLxD.shape[:2])
    if dropless:
        y = _dropless_path(params, x_BxLxD, gates, experts, **common)
        dropped = jnp.zeros((), jnp.float32)
    else:
        y, kept = _capacity_path(params, x_BxLxD, gates, experts, token_mask,
                                 capacity_factor=capacity_factor, constrain=constrain, **common)
        assigned = jnp.maximum(jnp.sum(m) * experts_per_token, 1.0)
        dropped = 1.0 - jnp.sum(kept.astype(jnp.float32) * m[..., None]) / assigned
    if "shared" in params:
        shared = ffn(params["shared"], x_BxLxD, activation=activation)
        if "shared_gate" in params:
            shared = shared * jax.nn.sigmoid(dense(params["shared_gate"], x_BxLxD))
        y = y + shared
    stats = RouterStats(aux_loss=load_balancing_loss(probs, experts, token_mask),
                        z_loss=router_z_loss(logits, token_mask), dropped=dropped,
                        load=_load(experts, num_experts, m))
    return y.astype(x_BxLxD.dtype), stats
