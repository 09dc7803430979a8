"""Preference losses on sequence log-probabilities: DPO, conservative DPO and IPO.

DPO (Rafailov et al. 2023, "Direct Preference Optimization: Your Language Model is Secretly a
Reward Model", eq. 7), for a prompt ``x`` with a chosen response ``y_w`` and a rejected one ``y_l``::

    h = (log π(y_w|x) − log π_ref(y_w|x)) − (log π(y_l|x) − log π_ref(y_l|x))
    L = −log σ(β h)

``log π(y|x)`` is the sum of the response tokens' log-probabilities (the prompt is not summed).
The implicit rewards are ``r_w = β (log π(y_w|x) − log π_ref(y_w|x))`` and ``r_l`` likewise
(eq. 5 up to the partition function), so ``β h = r_w − r_l``.

Conservative DPO (Mitchell 2023, "A note on DPO with noisy preferences"; TRL's
``label_smoothing``): with a probability ε that the label is flipped,
``L = −(1 − ε) log σ(β h) − ε log σ(−β h)``.

IPO (Azar et al. 2023, "A General Theoretical Paradigm to Understand Learning from Human
Preferences", eq. 17, with τ = β): ``L = (h − 1/(2β))²``; TRL feeds it per-token *mean*
log-probabilities (`jaxformer.objectives.dpo` does too).

At the start of training (π = π_ref) ``h = 0``, so the DPO loss is ``log 2`` and the rewards are 0
whatever the weights.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxformer.ops.losses import cross_entropy_with_integer_labels

Array = jnp.ndarray

LOSS_TYPES = ("sigmoid", "ipo")


def token_logprobs(logits: Array, targets: Array, weights: Array) -> Array:
    """``log p(targets)`` per position `[B, L]` float32 (0 where ``weights`` is 0, whatever the
    label), from ``logits`` `[B, L, V]`."""
    logp = -cross_entropy_with_integer_labels(logits, targets)
    return jnp.where(weights != 0, logp * weights, 0.0)


def segment_sums(values: Array, segment_ids: Array, num_segments: int) -> Array:
    """Per-row, per-segment sums `[B, num_segments]` of ``values`` `[B, L]`: entry ``[b, s]`` sums
    ``values[b, t]`` over the positions with ``segment_ids[b, t] == s + 1`` (segment 0, padding, and
    ids above ``num_segments`` are left out)."""
    rows, length = values.shape
    ids = segment_ids.astype(jnp.int32) - 1
    ids = jnp.where((ids >= 0) & (ids < num_segments), ids, num_segments)  # → a dropped slot
    flat = (jnp.arange(rows)[:, None] * (num_segments + 1) + ids).reshape(-1)
    sums = jax.ops.segment_sum(values.reshape(-1), flat, num_segments=rows * (num_segments + 1))
    return sums.reshape(rows, num_segments + 1)[:, :num_segments]


def preference_loss(policy_chosen: Array, policy_rejected: Array, ref_chosen: Array,
                    ref_rejected: Array, *, beta: float, label_smoothing: float = 0.0,
                    loss_type: str = "sigmoid") -> tuple[Array, Array, Array]:
    """Per-pair DPO / cDPO / IPO losses and implicit rewards (module docstring).

    Args:
      policy_chosen, policy_rejected: `[N]` log π(y_w|x), log π(y_l|x) of the trained policy.
      ref_chosen, ref_rejected: `[N]` the same under the frozen reference (no gradient flows
        into them).
      beta: β > 0, the strength of the KL constraint to the reference (eq. 3).
      label_smoothing: ε in [0, 0.5), the assumed label-flip probability (sigmoid loss only).
      loss_type: "sigmoid" (DPO, eq. 7) or "ipo" (Azar et al. eq. 17).

    Returns:
      ``(losses, chosen_rewards, rejected_rewards)``, each `[N]`; the rewards
      ``β (log π − log π_ref)`` carry no gradient (as TRL logs them).
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type={loss_type!r} is not one of {LOSS_TYPES}")
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    ref_chosen, ref_rejected = jax.lax.stop_gradient(ref_chosen), jax.lax.stop_gradient(ref_rejected)
    chosen_ratio, rejected_ratio = policy_chosen - ref_chosen, policy_rejected - ref_rejected
    h = chosen_ratio - rejected_ratio
    if loss_type == "ipo":
        losses = jnp.square(h - 1.0 / (2.0 * beta))
    else:
        losses = (-(1.0 - label_smoothing) * jax.nn.log_sigmoid(beta * h)
                  - label_smoothing * jax.nn.log_sigmoid(-beta * h))
    rewards = jax.lax.stop_gradient(beta * jnp.stack([chosen_ratio, rejected_ratio]))
    return losses, rewards[0], rewards[1]
