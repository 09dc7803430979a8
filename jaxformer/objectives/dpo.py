"""Direct preference optimisation (DPO; Rafailov et al. 2023, eq. 7) with its cDPO and IPO variants.

Each example is a pair: a prompt ``x`` with a chosen response ``y_w`` and a rejected one ``y_l``
(TRL's ``prompt`` / ``chosen`` / ``rejected``). The data pipeline writes a pair as two halves of one
packed segment, told apart by the ``*_pair`` feature (1 chosen, 2 rejected, 0 padding):

- decoder-only (objective ``dpo``, data task ``preference``)::

      inputs       <s>? x y_w </s> <s>? x y_l </s>     one segment of a packed row
      inputs_pair   1 … 1 1 1  1     2 … 2 2 2  2
      inputs_loss_mask 0 … 0 1 1    0 … 0 1 1         1 on the responses and their EOS

- encoder-decoder (objective ``dpo_seq2seq``, data task ``preference_seq2seq``): the prompt twice on
  the encoder side (``x </s> x </s>``, ``inputs_pair`` 1 then 2), the responses as the targets
  (``y_w </s> y_l </s>``, ``targets_pair``), as TRL feeds an encoder-decoder both prompts.

`prepare_dpo` splits every segment ``s`` into segments ``2s − 1`` (chosen) and ``2s`` (rejected),
with positions restarting in each, so the two halves never attend to each other; then it is the
SFT objective (`prepare_sft`, decoder) or teacher forcing (`prepare_seq2seq`, encoder-decoder) on
those rows. `dpo_sums` runs the policy and the frozen reference on them, sums each half's response
log-probabilities (the prompt is never a target) and applies `jaxformer.ops.preference`.

Logged as TRL logs them (its ``rewards/*``), means over the pairs of the step: ``accuracy`` and
``rewards_accuracies`` (the fraction of pairs whose chosen reward is above the rejected one),
``rewards_chosen``, ``rewards_rejected``, ``rewards_margins``, ``logps_chosen``,
``logps_rejected``; ``loss`` is the mean pair loss and ``tokens`` counts the pairs.

Dropout is off in both forward passes (TRL's ``disable_dropout=True``), so that the policy equals
the reference at the first step: there the loss is ``log 2`` and every reward 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jaxformer.objectives._common import require, segments_and_positions
from jaxformer.objectives.causal import prepare_sft
from jaxformer.objectives.seq2seq import prepare_seq2seq
from jaxformer.ops.preference import LOSS_TYPES, preference_loss, segment_sums, token_logprobs
from jaxformer.settings import one_of, positive, setting
from jaxformer.vocab import SpecialTokens

Array = jnp.ndarray
PAIR_SEGMENTS = "pair_segment_ids"  # prepared[...]: the split segment of each target position


def _below_half(v: float) -> str | None:
    return None if 0.0 <= v < 0.5 else "must lie in [0, 0.5) (0.5: the labels carry no preference)"


@dataclasses.dataclass(frozen=True)
class DPOOptions:
    """The ``objective.*`` options of objectives ``dpo`` and ``dpo_seq2seq``; ``dpo_beta`` is TRL's
    ``beta``, ``dpo_label_smoothing`` its ``label_smoothing``, ``dpo_loss`` its ``loss_type``."""

    dpo_beta: float = setting(
        0.1, "dpo: β, the strength of the KL penalty to the reference (TRL's beta)", check=positive)
    dpo_label_smoothing: float = setting(
        0.0, "dpo: ε, the assumed rate of flipped preference labels (conservative DPO; sigmoid loss)",
        check=_below_half)
    dpo_loss: str = setting(
        "sigmoid", "dpo: 'sigmoid' (DPO, Rafailov et al. eq. 7) or 'ipo' (Azar et al. 2023, on "
        "per-token mean log-probabilities, as TRL)", check=one_of(*LOSS_TYPES))


def positions_within(segment_ids: Array) -> Array:
    """`[B, L]` int32 positions ``0, 1, …`` restarting wherever the segment id changes (padding,
    id 0, gets positions too; the model masks it)."""
    idx = jnp.broadcast_to(jnp.arange(segment_ids.shape[-1], dtype=jnp.int32), segment_ids.shape)
    prev = jnp.pad(segment_ids[:, :-1], ((0, 0), (1, 0)), constant_values=-1)
    start = jax.lax.cummax(jnp.where(segment_ids != prev, idx, 0), axis=1)
    return idx - start


def split_pairs(batch: Mapping[str, Array], prefix: str, pad_id: int) -> dict:
    """``{prefix, prefix_segment_ids, prefix_positions}`` with every packed segment ``s`` of
    ``prefix`` split by ``{prefix}_pair`` into ``2s − 1`` (chosen half) and ``2s`` (rejected half),
    positions restarting in each."""
    tokens, seg, _ = segments_and_positions(batch, prefix, pad_id)
    pair = jnp.asarray(batch[f"{prefix}_pair"], jnp.int32)
    split = jnp.where((seg > 0) & (pair > 0), 2 * (seg - 1) + pair, 0)
    return {prefix: tokens, f"{prefix}_segment_ids": split,
            f"{prefix}_positions": positions_within(split)}


def prepare_dpo(batch: Mapping[str, Array], rng: jax.Array, special: SpecialTokens,
                options: Any = None, decoder_start_id: int | None = None) -> dict:
    """Preference pairs → the rows both the policy and the reference read.

    Batch (module docstring): decoder-only ``inputs``, ``inputs_pair``, ``inputs_loss_mask``
    `[B, L]`; encoder-decoder ``inputs``, ``inputs_pair`` `[B, S]` and ``targets``,
    ``targets_pair`` `[B, L]`; each with optional packing ``*_segment_ids`` / ``*_positions``.

    Returns `prepare_sft`'s (decoder) or `prepare_seq2seq`'s (encoder-decoder) output on the split
    rows (``weights`` 1 where the next token is a response token), plus ``pair_segment_ids``
    `[B, L]`: the split segment each target position belongs to (odd: chosen, even: rejected).
    """
    del rng, options
    if "targets" in batch:
        require(batch, "dpo_seq2seq", "inputs", "inputs_pair", "targets", "targets_pair")
        rows = {**split_pairs(batch, "inputs", special.pad_id),
                **split_pairs(batch, "targets", special.pad_id)}
        out = prepare_seq2seq(rows, None, special, decoder_start_id=decoder_start_id)
        out[PAIR_SEGMENTS] = rows["targets_segment_ids"]
        return out
    require(batch, "dpo", "inputs", "inputs_pair", "inputs_loss_mask")
    rows = {**split_pairs(batch, "inputs", special.pad_id),
            "inputs_loss_mask": batch["inputs_loss_mask"]}
    out = prepare_sft(rows, None, special)
    out[PAIR_SEGMENTS] = rows["inputs_segment_ids"]
    return out


def pair_logprobs(logits: Array, prepared: Mapping[str, Array]) -> tuple[Array, Array]:
    """The summed response log-probabilities and the response token counts of every pair slot,
    each `[2, B, P]` (index 0 the chosen halves, 1 the rejected; P = L // 2 + 1 slots per row,
    more than a row of length L can hold), from ``logits`` `[B, L, V]` and `prepare_dpo`'s output."""
    weights, seg = prepared["weights"], prepared[PAIR_SEGMENTS]
    slots = 2 * (seg.shape[-1] // 2 + 1)
    logp = segment_sums(token_logprobs(logits, prepared["targets"], weights), seg, slots)
    count = segment_sums(weights.astype(jnp.float32), seg, slots)
    return (jnp.stack([logp[:, 0::2], logp[:, 1::2]]), jnp.stack([count[:, 0::2], count[:, 1::2]]))


def pair_losses(policy: Array, reference: Array, counts: Array, options: DPOOptions
                ) -> tuple[Array, Array, Array]:
    """(losses, chosen rewards, rejected rewards), each `[...]`, of pairs whose summed response
    log-probabilities under the policy and the reference and response token counts are ``policy``,
    ``reference``, ``counts`` `[2, ...]` (chosen, rejected): `preference_loss` with ``options``; the
    IPO loss on per-token means, its rewards on the sums, as TRL computes and logs them
    (``DPOTrainer._compute_loss``)."""
    kw = dict(beta=options.dpo_beta, label_smoothing=options.dpo_label_smoothing,
              loss_type=options.dpo_loss)
    losses, chosen, rejected = preference_loss(policy[0], policy[1], reference[0], reference[1], **kw)
    if options.dpo_loss == "ipo":
        policy, reference = policy / jnp.maximum(counts, 1.0), reference / jnp.maximum(counts, 1.0)
        losses = preference_loss(policy[0], policy[1], reference[0], reference[1], **kw)[0]
    return losses, chosen, rejected


def _logits(model: Any, params: Any, inputs: Mapping[str, Array]) -> Array:
    out = model.apply(params, **inputs, rng=None)
    return out[0] if isinstance(out, tuple) else out


def dpo_sums(model: Any, params: Any, reference: Any, prepared: Mapping[str, Array],
             options: DPOOptions) -> dict:
    """Sums over the pairs of one batch of the DPO loss and TRL's metrics (module docstring).

    ``params``: the policy's parameters (differentiated); ``reference``: the frozen reference's,
    the same tree (no gradient reaches them). A pair counts when both its halves have a response
    token. Returns ``loss``, ``correct`` (pairs with chosen reward > rejected), ``weight`` (pairs)
    and ``rewards_chosen``, ``rewards_rejected``, ``rewards_margins``, ``rewards_accuracies``,
    ``logps_chosen``, ``logps_rejected`` (the step divides these by ``weight``).
    """
    inputs = prepared["model_inputs"]
    policy, counts = pair_logprobs(_logits(model, params, inputs), prepared)
    ref_logits = _logits(model, jax.lax.stop_gradient(reference), inputs)
    ref, _ = pair_logprobs(jax.lax.stop_gradient(ref_logits), prepared)
    valid = (counts[0] > 0) & (counts[1] > 0)
    losses, chosen, rejected = pair_losses(policy, ref, counts, options)
    w = valid.astype(jnp.float32)
    total = lambda x: jnp.sum(jnp.where(valid, x, 0.0))
    correct = total((chosen > rejected).astype(jnp.float32))
    logps = jax.lax.stop_gradient(policy)
    return {"loss": total(losses), "correct": correct, "weight": jnp.sum(w),
            "rewards_chosen": total(chosen), "rewards_rejected": total(rejected),
            "rewards_margins": total(chosen - rejected), "rewards_accuracies": correct,
            "logps_chosen": total(logps[0]), "logps_rejected": total(logps[1])}


def check_dpo_model(name: str, model_cfg: Any) -> None:
    """ValueError when objective ``name`` (``dpo`` / ``dpo_seq2seq``) cannot train ``model_cfg``:
    a language-model head of the family whose rows it builds."""
    family = {"dpo": "decoder", "dpo_seq2seq": "encoder_decoder"}[name]
    if model_cfg.family != family or model_cfg.head != "lm":
        other = "dpo" if model_cfg.family == "decoder" else "dpo_seq2seq"
        fix = (f"use objective.name={other!r}" if model_cfg.family in ("decoder", "encoder_decoder")
               else "use a decoder or encoder-decoder model with head='lm'")
        raise ValueError(f"objective.name={name!r} trains a {family} model with head='lm', not "
                         f"model.family={model_cfg.family!r}, model.head={model_cfg.head!r}; {fix}")
