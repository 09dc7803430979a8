"""The train and eval steps: objective → model → weighted cross-entropy → optax update.

One step function serves every family; the objective decides what the model sees and which
positions count. Losses are normalised by the global sum of weights (tokens that count), so the
loss is the same whatever the mesh, the micro-batching or the number of hosts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxformer.models import Model
from jaxformer.objectives.cloze import class_logits
from jaxformer.ops.dropout import dropout_key
from jaxformer.ops.heads import HeadInputs
from jaxformer.ops.losses import (
    weighted_accuracy,
    weighted_blockwise_cross_entropy,
    weighted_cross_entropy,
)
from jaxformer.ops.moe import RouterStats
from jaxformer.train.config.schema import ObjectiveSettings, RunSettings, TrainSettings
from jaxformer.train.optim import OptimizerSettings
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
    logits, nsp_logits, stats = _forward(model, params, prepared, deterministic, dropout_rng,
                                         blockwise)
    sums = _sums(logits, nsp_logits, prepared, label_smoothing, z_loss,
                 _real_classes(getattr(model, "cfg", None), prepared), vocab_block_size)
    return {**sums, **router_sums(model.cfg, stats, sums["weight"])} if stats is not None else sums


def router_sums(cfg, stats: RouterStats, weight: jax.Array) -> dict:
    """An MoE model's router statistics (`jaxformer.ops.moe.RouterStats`, means over its MoE
    layers) as sums weighted by the batch's loss ``weight``, so that the step's division by the
    summed weight logs their token-weighted means: ``router_loss`` = router_aux_loss_weight ·
    load-balancing loss + router_z_loss_weight · z-loss (added to the differentiated loss),
    ``moe_aux_loss``, ``moe_z_loss``, ``moe_dropped`` (fraction of assignments past capacity),
    ``moe_load_max`` (the busiest expert's share × num_experts: 1 when balanced) and
    ``moe_load_<i>`` (expert i's share of the assignments)."""
    w = jax.lax.stop_gradient(weight)
    loss = cfg.router_aux_loss_weight * stats.aux_loss + cfg.router_z_loss_weight * stats.z_loss
    seen = jax.lax.stop_gradient(stats)  # logged only
    logged = {"moe_aux_loss": seen.aux_loss, "moe_z_loss": seen.z_loss, "moe_dropped": seen.dropped,
              "moe_load_max": jnp.max(seen.load) * seen.load.shape[0],
              **{f"moe_load_{i}": seen.load[i] for i in range(seen.load.shape[0])}}
    return {"router_loss": loss * w, **{k: v * w for k, v in logged.items()}}


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
             ) -> tuple[jax.Array | HeadInputs, jax.Array | None, RouterStats | None]:
    """(logits, NSP logits or None, router statistics of an MoE model or None) of the model on an
    objective's ``model_inputs``; with ``head_inputs`` the head's `HeadInputs` in place of the
    logits."""
    extra = {"head_inputs": True} if head_inputs else {}
    moe = getattr(getattr(model, "cfg", None), "num_experts", 0) > 0
    if moe:
        extra["router_stats"] = True
    out = model.apply(params, **prepared["model_inputs"], rng=None if deterministic else dropout_rng,
                      **extra)
    out, stats = out if moe else (out, None)
    if isinstance(out, HeadInputs):
        return out, None, stats
    logits, nsp_logits = out if isinstance(out, tuple) else (out, None)
    return class_logits(logits, prepared), nsp_logits, stats  # cloze: label words' logits [B, C]


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


def trained_params(trained: Any, frozen: Any) -> Any:
    """`StepHooks.model_params`'s default: the model applies the trained parameters as they are."""
    return trained


@dataclasses.dataclass(frozen=True)
class StepHooks:
    """What a feature changes in the train step (`jaxformer.train.extension.Extension.hooks`).

    Attributes:
      model_params: ``(trained, frozen) -> params`` the model applies, differentiated through
        ``trained`` only (LoRA: the base merged with the adapters, `jaxformer.train.lora_run`).
      mix_inputs: ``(params, prepared, step, rng) -> prepared``, applied to each micro-batch's
        prepared inputs before the differentiated loss, with the model's parameters outside the
        gradient and the optimizer step ``state.step`` (scheduled sampling,
        `jaxformer.objectives.scheduled_sampling.scheduled_sampling_mixer`); None: no pass.
      loss: ``(model, params, frozen, prepared, *, dropout_rng, hard_sums) -> sums``, replacing
        `loss_and_metrics` (distillation: `jaxformer.train.distill.DistillLoss`, the teacher's
        parameters as ``frozen``); ``hard_sums(logits, nsp_logits, prepared)`` is the objective's own
        cross-entropy sums. Sums beyond `loss_and_metrics`' are logged per weight.
    """

    model_params: Callable[[Any, Any], Any] = trained_params
    mix_inputs: Callable | None = None
    loss: Callable | None = None


SUMS = ("loss", "correct", "weight", "nsp_loss", "nsp_correct", "nsp_weight")  # loss_and_metrics'
# A step built without the run's objective section (tests, benchmarks): the plain cross-entropy,
# from the full logits, as `make_eval_step` computes it.
PLAIN_LOSS = ObjectiveSettings(vocab_block_size=0)


def make_train_step(model: Model, tx: optax.GradientTransformation, prepare: Callable,
                    schedule: Callable, *, objective: ObjectiveSettings = PLAIN_LOSS,
                    run: TrainSettings | None = None, axis_name: str | None = None,
                    hooks: StepHooks = StepHooks()) -> Callable[..., tuple[TrainState, dict]]:
    """``train_step(state, batch, frozen=None) -> (state, metrics)``, to be compiled by
    `jaxformer.parallel.runner.compile_step` (or wrapped in `jax.jit`).

    ``prepare(batch, rng)`` is the objective bound to its special tokens and options. ``objective``
    (the run's ``objective`` section; `PLAIN_LOSS` when not given) gives the training loss's
    ``label_smoothing``, ``z_loss`` and ``vocab_block_size`` (> 0: the LM/MLM loss over blocks of
    that many vocabulary columns, without `[B, L, V]` logits, `loss_and_metrics`; distillation,
    which compares logits, keeps them; 0: the full logits).
    ``run`` (None: the declared defaults of its keys) gives:

    - ``optimizer.grad_accum_steps`` (``A``): the batch is split into ``A`` strided micro-batches
      (rows ``i, i+A, …``) whose gradients are summed in a `lax.scan` before one optimizer update
      (same result as one big batch, less activation memory);
    - ``nonfinite="skip"``: when the loss or the gradient norm is not finite the step keeps the old
      params and optimizer state (`jnp.where`; the step counter still advances) and reports
      ``skipped`` = 1;
    - ``dropout_prng``: the `jax.random` implementation the dropout masks are drawn with
      (`jaxformer.ops.dropout.dropout_key`); the objective's masking keeps threefry.

    ``axis_name`` (shard_map and pmap paths, `jaxformer.parallel.runner.axis_name`): each device
    holds a slice of the batch; gradient and loss *sums* are `lax.psum`-ed over the axis before
    normalising, which equals the jit path's global-batch normalisation (a `pmean` of per-device
    means would weight devices equally instead). Devices fold their index into the step key so
    their dropout masks differ.

    ``hooks`` (`StepHooks`) are what a feature changes; ``frozen`` is the pytree of parameters a
    feature keeps untrained (LoRA's base, a teacher's parameters): no gradient reaches it. The
    defaults (no hooks, ``frozen=None``, which has no leaves) compile the plain step.
    """
    accum = (run.optimizer if run is not None else OptimizerSettings()).grad_accum_steps
    top = run if run is not None else RunSettings()
    skip_nonfinite, dropout_impl = top.nonfinite == "skip", top.dropout_prng
    label_smoothing, z_loss = objective.label_smoothing, objective.z_loss

    def hard_sums(logits, nsp_logits, prepared):
        return _sums(logits, nsp_logits, prepared, label_smoothing, z_loss,
                     _real_classes(model.cfg, prepared))

    def micro_grads(params, batch, key, frozen, step):
        obj_key, drop_key = jax.random.split(key)
        drop_key = dropout_key(drop_key, dropout_impl)
        prepared = prepare(batch, obj_key)
        if hooks.mix_inputs is not None:  # e.g. scheduled sampling: a first pass, outside the grad
            prepared = hooks.mix_inputs(jax.lax.stop_gradient(hooks.model_params(params, frozen)),
                                        prepared, step, jax.random.fold_in(obj_key, 1))

        def f(p):
            full = hooks.model_params(p, frozen)
            if hooks.loss is not None:
                sums = hooks.loss(model, full, frozen, prepared, dropout_rng=drop_key,
                                  hard_sums=hard_sums)
            else:
                sums = loss_and_metrics(model, full, prepared, deterministic=False,
                                        dropout_rng=drop_key, label_smoothing=label_smoothing,
                                        z_loss=z_loss, vocab_block_size=objective.vocab_block_size)
            # Sum-of-losses gradient; normalised once all micro-batches are in. An MoE model's
            # router losses (`router_sums`) are weighted sums alike.
            return sums["loss"] + sums.get("nsp_loss", 0.0) + sums.get("router_loss", 0.0), sums

        return jax.grad(f, has_aux=True)(params)

    def train_step(state: TrainState, batch: dict, frozen: Any = None) -> tuple[TrainState, dict]:
        key, params = state.step_key(), state.params
        if axis_name is not None:
            key = jax.random.fold_in(key, jax.lax.axis_index(axis_name))
            # Per-device gradients, summed by the psum below: differentiating the replicated
            # (device-invariant) parameters of a `jax.shard_map` would psum them in the transpose
            # already. A no-op under pmap, whose state is stacked per device.
            params = jax.lax.pcast(params, axis_name, to="varying")
        if accum == 1:
            grads, sums = micro_grads(params, batch, key, frozen, state.step)
        else:
            # Micro-batch i takes rows i, i+A, i+2A, …: each device splits its own (contiguous)
            # rows of a batch-sharded array, so no row moves between devices.
            micro = jax.tree.map(
                lambda x: x.reshape(x.shape[0] // accum, accum, *x.shape[1:]).swapaxes(0, 1), batch)

            def body(acc, xs):
                i, mb = xs
                g, s = micro_grads(params, mb, jax.random.fold_in(key, i), frozen, state.step)
                return jax.tree.map(jnp.add, acc, (g, s)), None

            zeros = jax.eval_shape(micro_grads, params, jax.tree.map(lambda x: x[0], micro), key,
                                   frozen, state.step)
            zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), zeros)
            if axis_name is not None:  # the carry holds per-device sums
                zeros = jax.lax.pcast(zeros, axis_name, to="varying")
            (grads, sums), _ = jax.lax.scan(body, zeros, (jnp.arange(accum), micro))
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
            **{k: v / denom for k, v in sums.items() if k not in SUMS},  # a loss hook's own sums
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
        logits, nsp_logits, _ = _forward(model, params, prepared, True, None)
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
