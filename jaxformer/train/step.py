"""The train and eval steps: objective → model → weighted cross-entropy → optax update.

One step function serves every family; the objective decides what the model sees and which
positions count. Losses are normalised by the global sum of weights (tokens that count), so the
loss is the same whatever the mesh, the micro-batching or the number of hosts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxformer.models import Model, lora
from jaxformer.objectives.cloze import class_logits
from jaxformer.ops.dropout import dropout_key
from jaxformer.ops.heads import HeadInputs
from jaxformer.ops.losses import (
    weighted_accuracy,
    weighted_blockwise_cross_entropy,
    weighted_cross_entropy,
)
from jaxformer.train.state import TrainState


def loss_and_metrics(model: Model, params, prepared: dict, *, deterministic: bool,
                     dropout_rng: jax.Array | None, label_smoothing: float = 0.0,
                     z_loss: float = 0.0, vocab_block_size: int = 0) -> tuple[jax.Array, dict]:
    """Sums (not means) of loss, correct predictions and weights for one batch.

    ``prepared`` is an objective's output: ``model_inputs``, ``targets``, ``weights`` and, for BERT
    next-sentence prediction, ``nsp_targets``/``nsp_weights``. ``vocab_block_size`` > 0: the LM
    and MLM heads' loss is `weighted_blockwise_cross_entropy` over blocks of that many vocabulary
    columns, never forming the `[B, L, V]` logits (`blockwise_loss`); 0: from the full logits.
    """
    blockwise = blockwise_loss(model, prepared, vocab_block_size)
    logits, nsp_logits = _forward(model, params, prepared, deterministic, dropout_rng, blockwise)
    return _sums(logits, nsp_logits, prepared, label_smoothing, z_loss,
                 _real_classes(getattr(model, "cfg", None), prepared), vocab_block_size)


def blockwise_loss(model: Model, prepared: dict, vocab_block_size: int) -> bool:
    """Whether the loss of ``prepared`` is computed blockwise from the head's operands: a positive
    ``vocab_block_size``, an LM or MLM head, and an objective that reads only the loss and the
    accuracy of the vocabulary logits (not cloze's label-word logits, ``class_positions``), over
    every position: an MLM head that reads only the masked positions (``predict_positions``, BERT's
    80 of 512) keeps its small `[B, P, V]` logits, which compiled to fewer bytes on v5p than the
    two changes together (docs/scaling.md, "Bytes outside attention")."""
    cfg = getattr(model, "cfg", None)
    return (vocab_block_size > 0 and cfg is not None and cfg.head in ("lm", "mlm")
            and "class_positions" not in prepared
            and "predict_positions" not in prepared["model_inputs"])


def _real_classes(cfg, prepared: dict) -> int | None:
    """``cfg.vocab_size`` when the logits are over a padded vocabulary (``vocab_pad_multiple``;
    `weighted_cross_entropy`'s ``num_classes``), else None (the logits' last axis; also for a
    user's own module without a ``cfg``, whose logits are its own)."""
    if cfg is None:
        return None
    padded = cfg.head in ("lm", "mlm") and cfg.padded_vocab_size != cfg.vocab_size
    return cfg.vocab_size if padded and "class_positions" not in prepared else None


def _forward(model: Model, params, prepared: dict, deterministic: bool,
             dropout_rng: jax.Array | None, head_inputs: bool = False
             ) -> tuple[jax.Array | HeadInputs, jax.Array | None]:
    """(logits, NSP logits or None) of the model on an objective's ``model_inputs``; with
    ``head_inputs`` the head's `HeadInputs` in place of the logits."""
    extra = {"head_inputs": True} if head_inputs else {}
    out = model.apply(params, **prepared["model_inputs"], rng=None if deterministic else dropout_rng,
                      **extra)
    if isinstance(out, HeadInputs):
        return out, None
    logits, nsp_logits = out if isinstance(out, tuple) else (out, None)
    return class_logits(logits, prepared), nsp_logits  # cloze: the label words' logits [B, C]


def _sums(logits: jax.Array | HeadInputs, nsp_logits: jax.Array | None, prepared: dict,
          label_smoothing: float = 0.0, z_loss: float = 0.0, num_classes: int | None = None,
          vocab_block_size: int = 0) -> dict:
    """Sums of loss, correct predictions and weights (and NSP's) of one batch's logits, or of the
    head's operands blockwise (`HeadInputs`, ``vocab_block_size`` columns a block) (``num_classes``:
    the real vocabulary of padded logits, `_real_classes`)."""
    if isinstance(logits, HeadInputs):
        loss_sum, correct, weight_sum = weighted_blockwise_cross_entropy(
            *logits, prepared["targets"], prepared["weights"], block_size=vocab_block_size,
            label_smoothing=label_smoothing, z_loss=z_loss, num_classes=num_classes)
    else:
        loss_sum, weight_sum = weighted_cross_entropy(
            logits, prepared["targets"], prepared["weights"], label_smoothing=label_smoothing,
            z_loss=z_loss, num_classes=num_classes)
        correct, _ = weighted_accuracy(logits, prepared["targets"], prepared["weights"])
    sums = {"loss": loss_sum, "correct": correct, "weight": weight_sum}
    if nsp_logits is not None and "nsp_targets" in prepared:
        nsp_loss, nsp_w = weighted_cross_entropy(nsp_logits, prepared["nsp_targets"],
                                                 prepared.get("nsp_weights"))
        nsp_correct, _ = weighted_accuracy(nsp_logits, prepared["nsp_targets"],
                                           prepared.get("nsp_weights"))
        sums.update(nsp_loss=nsp_loss, nsp_correct=nsp_correct, nsp_weight=nsp_w)
    return sums


def _objective_loss(sums: dict) -> jax.Array:
    loss = sums["loss"] / jnp.maximum(sums["weight"], 1.0)
    if "nsp_loss" in sums:
        loss = loss + sums["nsp_loss"] / jnp.maximum(sums["nsp_weight"], 1.0)
    return loss


def make_train_step(model: Model, tx: optax.GradientTransformation, prepare: Callable,
                    schedule: Callable, *, label_smoothing: float = 0.0, z_loss: float = 0.0,
                    grad_accum_steps: int = 1, axis_name: str | None = None,
                    skip_nonfinite: bool = False, lora_scale: float | None = None,
                    mix_inputs: Callable | None = None, distill: Callable | None = None,
                    vocab_block_size: int = 0, dropout_impl: str = "threefry2x32"
                    ) -> Callable[..., tuple[TrainState, dict]]:
    """``train_step(state, batch) -> (state, metrics)``, to be wrapped in `jax.jit`.

    LoRA (``lora_scale`` = alpha / rank): ``train_step(state, batch, base)``: ``state.params`` are
    the trainable adapters and task heads, ``base`` the frozen parameters; the model applies
    `jaxformer.models.lora.model_params` (base + scale · A B) and only ``state.params`` are
    differentiated and updated.

    ``prepare(batch, rng)`` is the objective bound to its special tokens and options. With
    ``grad_accum_steps > 1`` (``A``) the batch is split into ``A`` strided micro-batches (rows
    ``i, i+A, …``) whose gradients are summed in a `lax.scan` before one optimizer update (same
    result as one big batch, less activation memory).

    ``axis_name`` (shard_map and pmap paths): each device holds a slice of the batch; gradient and
    loss *sums* are `lax.psum`-ed over the axis before normalising, which equals the jit path's
    global-batch normalisation (a `pmean` of per-device means would weight devices equally
    instead). Devices fold their index into the step key so their dropout masks differ.

    ``skip_nonfinite`` (``nonfinite="skip"``): when the loss or the gradient norm is not finite the
    step keeps the old params and optimizer state (`jnp.where`; the step counter still advances) and
    reports ``skipped`` = 1.

    ``mix_inputs(params, prepared, step, rng) -> prepared`` (scheduled sampling,
    `jaxformer.objectives.scheduled_sampling.scheduled_sampling_mixer`): applied to each
    micro-batch's prepared inputs before the differentiated loss, with the model's parameters and
    the optimizer step ``state.step``; None (the default) leaves the step's program unchanged.

    ``distill`` (`jaxformer.train.distill.DistillLoss`): ``train_step(state, batch, None,
    teacher)``; the hook computes the sums from the student and the frozen ``teacher`` parameters
    (no gradient reaches them) and its ``distill_*`` sums are logged per weight.

    ``vocab_block_size`` (``objective.vocab_block_size``): the LM/MLM loss over blocks of that many
    vocabulary columns, without `[B, L, V]` logits (`loss_and_metrics`; distillation, which
    compares logits, keeps them); 0: from the full logits.

    ``dropout_impl`` (``dropout_prng``): the `jax.random` implementation the dropout masks are drawn
    with (`jaxformer.ops.dropout.dropout_key`); the objective's masking keeps threefry.
    """

    def micro_grads(params, batch, key, base, step, teacher=None):
        obj_key, drop_key = jax.random.split(key)
        drop_key = dropout_key(drop_key, dropout_impl)
        prepared = prepare(batch, obj_key)
        if mix_inputs is not None:  # scheduled sampling: a first pass, outside the gradient
            full = params if base is None else lora.model_params(base, params, lora_scale)
            prepared = mix_inputs(jax.lax.stop_gradient(full), prepared, step,
                                  jax.random.fold_in(obj_key, 1))

        def f(p):
            full = p if base is None else lora.model_params(base, p, lora_scale)
            if distill is not None:  # knowledge distillation: the hook adds the teacher's terms
                sums = distill(model, full, teacher, prepared, dropout_rng=drop_key,
                               hard_sums=lambda lg, nsp, pr: _sums(
                                   lg, nsp, pr, label_smoothing, z_loss,
                                   _real_classes(model.cfg, pr)))
                return sums["loss"] + sums.get("nsp_loss", 0.0), sums
            sums = loss_and_metrics(model, full, prepared, deterministic=False, dropout_rng=drop_key,
                                    label_smoothing=label_smoothing, z_loss=z_loss,
                                    vocab_block_size=vocab_block_size)
            # Sum-of-losses gradient; normalised once all micro-batches are in.
            total = sums["loss"] + sums.get("nsp_loss", 0.0)
            return total, sums

        return jax.grad(f, has_aux=True)(params)

    def train_step(state: TrainState, batch: dict, base=None, teacher=None
                   ) -> tuple[TrainState, dict]:
        key, params = state.step_key(), state.params
        if axis_name is not None:
            key = jax.random.fold_in(key, jax.lax.axis_index(axis_name))
            # Per-device gradients, summed by the psum below: differentiating the replicated
            # (device-invariant) parameters of a `jax.shard_map` would psum them in the transpose
            # already. A no-op under pmap, whose state is stacked per device.
            params = jax.lax.pcast(params, axis_name, to="varying")
        if grad_accum_steps == 1:
            grads, sums = micro_grads(params, batch, key, base, state.step, teacher)
        else:
            # Micro-batch i takes rows i, i+A, i+2A, …: each device splits its own (contiguous)
            # rows of a batch-sharded array, so no row moves between devices.
            micro = jax.tree.map(
                lambda x: x.reshape(x.shape[0] // grad_accum_steps, grad_accum_steps,
                                    *x.shape[1:]).swapaxes(0, 1),
                batch)

            def body(acc, xs):
                i, mb = xs
                g, s = micro_grads(params, mb, jax.random.fold_in(key, i), base, state.step,
                                   teacher)
                return jax.tree.map(jnp.add, acc, (g, s)), None

            zeros = jax.eval_shape(micro_grads, params, jax.tree.map(lambda x: x[0], micro), key,
                                   base, state.step, teacher)
            zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), zeros)
            if axis_name is not None:  # the carry holds per-device sums
                zeros = jax.lax.pcast(zeros, axis_name, to="varying")
            (grads, sums), _ = jax.lax.scan(body, zeros, (jnp.arange(grad_accum_steps), micro))
        if axis_name is not None:
            grads, sums = jax.lax.psum((grads, sums), axis_name)
        denom = jnp.maximum(sums["weight"], 1.0)
        grads = jax.tree.map(lambda g: g / denom, grads)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {
            "loss": _objective_loss(sums),
            "accuracy": sums["correct"] / denom,
            "tokens": sums["weight"],
            "grad_norm": optax.tree.norm(grads),
            "learning_rate": schedule(state.step),
            **{k: v / denom for k, v in sums.items() if k.startswith("distill_")},
        }
        if skip_nonfinite:
            finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
            keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
            params, opt_state = keep(params, state.params), keep(opt_state, state.opt_state)
            metrics["skipped"] = 1.0 - finite.astype(jnp.float32)
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return train_step


def make_eval_step(model: Model, prepare: Callable, *, predictions: bool = False,
                   vocab_block_size: int = 0
                   ) -> Callable[[Any, dict, jax.Array], dict | tuple[dict, dict]]:
    """``eval_step(params, batch, key) -> sums`` (loss/correct/weight sums; add over batches).

    Evaluation uses the plain cross-entropy (no label smoothing) so perplexity is exp(loss);
    blockwise over ``vocab_block_size`` columns as in `make_train_step`, except with
    ``predictions`` (which needs the logits' argmax per position).
    ``predictions``: return ``(sums, {"predictions", "targets", "weights"})`` instead, the argmax
    of the logits with the objective's targets and weights, all of the targets' shape (`[B]` for
    classification, `[B, L]` for token objectives), for per-example metrics.
    """

    def eval_step(params, batch, key):
        prepared = prepare(batch, key)
        if not predictions:
            return loss_and_metrics(model, params, prepared, deterministic=True, dropout_rng=None,
                                    vocab_block_size=vocab_block_size)
        logits, nsp_logits = _forward(model, params, prepared, True, None)
        sums = _sums(logits, nsp_logits, prepared, num_classes=_real_classes(model.cfg, prepared))
        return sums, {"predictions": jnp.argmax(logits, axis=-1).astype(jnp.int32),
                      "targets": prepared["targets"], "weights": prepared["weights"]}

    return eval_step


def summarize_eval(sums: dict) -> dict:
    """Totals over eval batches → loss, accuracy, perplexity (and NSP metrics when present)."""
    w = max(float(sums["weight"]), 1.0)
    loss = float(sums["loss"]) / w
    out = {"loss": loss, "accuracy": float(sums["correct"]) / w,
           "perplexity": float(jnp.exp(jnp.minimum(loss, 50.0)))}
    if "nsp_loss" in sums:
        nw = max(float(sums["nsp_weight"]), 1.0)
        out.update(nsp_loss=float(sums["nsp_loss"]) / nw, nsp_accuracy=float(sums["nsp_correct"]) / nw)
    return out
