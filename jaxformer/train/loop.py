"""The one training loop: pretraining and fine-tuning of every family.

``train_and_evaluate(config, workdir)``:

Steps 1–4 are `jaxformer.train.setup.set_up`, which ``Trainer(config, workdir)`` calls:

1. resolve the config against ``init_from`` and validate it, before anything compiles; build the
   model and the mesh;
2. lock the workdir; find the newest intact (checksum-verified) step of ``<workdir>/checkpoints``
   if any; load or train the tokenizer; build the Grain train iterator — every check that can
   refuse the run, before any write (a refused run, or one that fails before its first step,
   removes the workdir or ``.lock`` it created: `jaxformer.checkpoint.lock`);
3. build the features the config asks for (`FEATURES`: each an
   `jaxformer.train.extension.Extension` — its step hooks, its frozen parameters, its start);
4. resume from that step (state *and* data iterator), else initialise — from ``init_from``
   (backbone of a pretraining run or a Hugging Face model) when given, or as a feature starts;
5. run the step compiled for ``parallel`` (`jaxformer.parallel.runner.compile_step`: jit over the
   mesh, shard_map or pmap), evaluating, logging and checkpointing periodically and at the end; a
   non-finite loss or gradient norm stops the run or skips the update (``nonfinite``).
"""

from __future__ import annotations

import json
import os
import time

import jax
import ml_collections
import numpy as np
from absl import logging

from jaxformer.checkpoint import PreemptionWatch
from jaxformer.config import ModelConfig
from jaxformer.data.mixture import ComponentTokens, component_sources
from jaxformer.evaluation.decoding import decoding_examples, generation_config, score_decoding
from jaxformer.flops import device_peak_flops, train_step_flops
from jaxformer.objectives.cloze import predicts_labels
from jaxformer.ops.embedding import check_token_ids
from jaxformer.parallel.partition import sharded_jit
from jaxformer.parallel.runner import StepRunner, axis_name, compile_step, global_batch
from jaxformer.train import distill, dpo_run, extension, lora_run
from jaxformer.train.collapse import CollapseWatch, with_prediction_counts
from jaxformer.train.inputs import inputs_of
from jaxformer.train.metrics import MetricWriter, Progress
from jaxformer.train.nonfinite import NonfiniteGuard
from jaxformer.train.setup import set_up
from jaxformer.train.step import (
    make_eval_step,
    make_train_step,
    summarize_eval,
    trained_params,
)
from jaxformer.train.throughput import (
    GOODPUT_FILE,
    TIMING_KEYS,
    ProfileWindow,
    Throughput,
    goodput_line,
    ready,
)

# The features a run may ask for, each ``(resolved, built) -> Extension | None``, and their steps on
# the stated config before it is resolved (`jaxformer.train.setup.set_up`).
FEATURES = (lora_run.extension, distill.extension, extension.scheduled_sampling,
            dpo_run.extension)
CONFIG_STEPS = (distill.with_teacher_tokenizer,)


def _check_batch(batch: dict, cfg: ModelConfig, labels: bool) -> None:
    """Token ids within the vocabulary and, when the model predicts ``labels``, labels within the
    classes (JAX would clamp or NaN)."""
    for key in ("inputs", "targets"):
        if key in batch:
            check_token_ids(batch[key], cfg.vocab_size, f"batch[{key!r}]")
    if "label" in batch and labels:
        labels = np.asarray(batch["label"])
        if labels.size and (labels.min() < 0 or labels.max() >= cfg.num_classes):
            bad = labels[(labels < 0) | (labels >= cfg.num_classes)]
            raise ValueError(f"label {int(bad[0])} is outside [0, model.num_classes="
                             f"{cfg.num_classes}); set model.num_classes (and data.label_names)")


class Trainer:
    """Set-up (`jaxformer.train.setup`) on construction; `run` trains to the last step.

    After construction ``trainer.state`` is the state training starts from (resumed, initialised
    from ``init_from``, or fresh) and ``trainer.start_step`` its step; tests and notebooks can
    inspect both before calling `run`. ``trainer.config`` is the resolved training config (what
    ``<workdir>/config.json`` holds), ``trainer.model_cfg`` its `ModelConfig`.
    """

    def __init__(self, config: ml_collections.ConfigDict, workdir: str | os.PathLike):
        ready = set_up(config, workdir, FEATURES, CONFIG_STEPS)  # refused, or the workdir is claimed
        resolved, built = ready.resolved, ready.built
        self.config, self.settings = resolved.config, resolved.settings  # config.json's; typed
        self.model_cfg, self.tx, self.schedule = resolved.model_cfg, resolved.tx, resolved.schedule
        self.predicts_labels = predicts_labels(self.model_cfg, self.settings.objective.name)
        self.inputs = inputs_of(self.model_cfg)  # text or images (`jaxformer.train.inputs`)
        self.workdir, self.lock, self.ckpt = ready.workdir, ready.lock, ready.ckpt
        self.model, self.mesh, self.param_shardings = built.model, built.mesh, built.param_shardings
        self.shardings = built.shardings  # the state's: what a feature trains, if not the model
        self.tokenizer, self.prepare = ready.tokenizer, ready.prepare
        self.make_ds, self.train_iter = ready.make_ds, ready.train_iter
        self.extension, self.state, self.start_step = ready.extension, ready.state, ready.start_step
        self.mix_tokens = ComponentTokens(self.settings.data.source)  # tokens/<component> metrics

    def model_params(self, state):
        """The parameters the model applies: ``state.params``, or as the step's ``model_params``
        hook makes them of the state's and a feature's frozen ones (e.g. adapters merged into
        their base), compiled into the model's parameter shardings."""
        hook = self.extension.hooks.model_params
        if hook is trained_params:
            return state.params
        if not hasattr(self, "_model_params"):
            self._model_params = sharded_jit(hook, self.mesh, out_shardings=self.param_shardings)
        return self._model_params(state.params, self.extension.frozen)

    def runner(self) -> StepRunner:
        """The train step with the features' hooks, compiled for ``parallel``
        (`jaxformer.parallel.runner.compile_step`)."""
        s = self.settings
        step_fn = make_train_step(self.model, self.tx, self.prepare, self.schedule,
                                  objective=s.objective, run=s, axis_name=axis_name(s.parallel),
                                  hooks=self.extension.hooks)
        return compile_step(s.parallel, step_fn, self.mesh, self.shardings,
                            self.extension.frozen_shardings)

    def evaluate(self, params, step: int | None = None, *, split: str | None = None,
                 num_batches: int | None = None) -> dict:
        """Loss, accuracy and perplexity over ``num_batches`` batches (default ``eval.num_batches``)
        of ``split`` (default ``eval.split``) — a feature's own metrics when its extension has an
        ``evaluator`` (DPO's preference metrics) — a mixture's per component, and decoding scores
        of its first ``eval.generate_examples`` examples. A sequence classifier's evaluations at
        ``step`` are watched for a collapse to one class or an accuracy at or below the
        majority-class rate (`jaxformer.train.collapse`)."""
        s = self.settings
        split = s.eval.split if split is None else split
        num_batches = s.eval.num_batches if num_batches is None else num_batches
        if num_batches == 0:
            return {}
        if not hasattr(self, "_eval_fn"):
            self._eval_fn = self._eval_step()
        totals = self._eval_sums(params, self.make_ds(split, num_epochs=1), num_batches)
        if totals is None:
            return {}
        parts = {}  # a mixture's components, each scored on its own too: eval_loss/<component>
        for name, source in component_sources(s.data, split, self.settings.objective.name,
                                              s.objective_options):
            sums = self._eval_sums(params, self.make_ds(split, num_epochs=1, source=source,
                                                        source_name=name), num_batches) or {}
            parts.update({f"eval_{k}/{name}": v for k, v in summarize_eval(sums).items()
                          if k in ("loss", "accuracy")} if sums else {})
        evaluator = self.extension.evaluator
        if evaluator is not None:  # a feature's own metrics (DPO's preference metrics)
            out = evaluator.summarize(totals)
        else:
            out = self._summarize(totals, step)
        if s.eval.generate_examples > 0:
            out.update(self._decoding_scores(params, split))
        return {**{f"eval_{k}": v for k, v in out.items()}, **parts}

    def _summarize(self, totals: dict, step: int | None) -> dict:
        """`summarize_eval` of the totals; a classifier's prediction counts to its collapse watch."""
        predicted, labelled = totals.pop("predicted", None), totals.pop("labelled", None)
        out = summarize_eval(totals)
        if predicted is not None and step is not None and jax.process_index() == 0:
            self._collapse.push(step, predicted, labelled, out["accuracy"])
        if self.predicts_labels:  # exp(cross-entropy) of a label is no perplexity
            out.pop("perplexity")
        return out

    def _eval_step(self):
        """``(params, batch, key, frozen) -> sums`` compiled: the extension's evaluator's sums of
        the prepared batch (``frozen``: its frozen tree), or the objective's cross-entropy
        (`make_eval_step`, with the predictions' counts of a classifier)."""
        s, evaluator = self.settings, self.extension.evaluator
        if evaluator is not None:
            def step(params, batch, key, frozen):
                return evaluator.sums(self.model, params, frozen, self.prepare(batch, key))
            return sharded_jit(step, self.mesh, in_shardings=(
                self.param_shardings, None, None, self.extension.frozen_shardings))
        counts = self.predicts_labels and self.model_cfg.head == "classify"
        eval_step = make_eval_step(self.model, self.prepare, predictions=counts,
                                   vocab_block_size=s.objective.vocab_block_size)
        if counts:
            eval_step = with_prediction_counts(eval_step, self.model_cfg.num_classes)
            self._collapse = CollapseWatch(s.data.label_names)
        return sharded_jit(lambda params, batch, key, frozen: eval_step(params, batch, key),
                           self.mesh, in_shardings=(self.param_shardings, None, None, None))

    def _eval_sums(self, params, batches, num_batches: int) -> dict | None:
        """The eval step's sums over the first ``num_batches`` of ``batches`` (None: none)."""
        totals, key = None, jax.random.key(self.settings.seed + 1)
        frozen = None if self.extension.evaluator is None else self.extension.frozen
        for i, batch in zip(range(num_batches), iter(batches)):
            _check_batch(batch, self.model_cfg, self.predicts_labels)
            sums = self._eval_fn(params, global_batch(batch, self.mesh), jax.random.fold_in(key, i),
                                 frozen)
            totals = sums if totals is None else jax.tree.map(lambda a, b: a + b, totals, sums)
        return totals

    def _decoding_scores(self, params, split: str) -> dict:
        """BLEU, chrF and exact match of generations for the first ``eval.generate_examples``
        examples of ``split`` (`jaxformer.evaluation.decoding`; the same sample each time)."""
        s = self.settings
        if not hasattr(self, "_decoding"):
            self._decoding = {}
        if split not in self._decoding:
            self._decoding[split] = decoding_examples(s, self.tokenizer, split,
                                                      limit=s.eval.generate_examples)
        scores, _ = score_decoding(self.model, params, self.tokenizer, self._decoding[split],
                                   generation_config(s, self.tokenizer),
                                   batch_size=s.data.batch_size)
        return {k: scores[k] for k in ("bleu", "chrf", "exact_match")}

    def throughput(self) -> Throughput:
        """The run's clock (`jaxformer.train.throughput`): model FLOPs of a step
        (`jaxformer.flops.train_step_flops` of the model's parameters and the run's settings) and
        the peak of the mesh's devices, which process 0 names once (when there are steps to run)."""
        params = jax.eval_shape(self.extension.hooks.model_params, self.state.params,
                                self.extension.frozen)  # the shapes of what the model applies
        flops = train_step_flops(self.settings, params)["model_flops_per_step"]
        peak = device_peak_flops(self.mesh.devices.flat[0])
        if jax.process_index() == 0 and self.start_step < self.settings.num_train_steps:
            n = self.mesh.devices.size
            print(f"MFU: model FLOPs {flops:.4g} per step over {n} device{'s' * (n != 1)}, "
                  f"against {peak['source']}")
        return Throughput(self.start_step, flops_per_step=flops, num_devices=self.mesh.devices.size,
                          peak_flops=peak["peak_flops"],
                          count_name="examples" if self.predicts_labels else "tokens")

    def _next_batch(self, clock: Throughput, previous) -> dict:
        """The next training batch, checked; its fetch counts as data wait when the device had
        finished the ``previous`` step's metrics by its end (`jaxformer.train.throughput`)."""
        t0 = time.perf_counter()
        batch = self.mix_tokens.take(next(self.train_iter))
        _check_batch(batch, self.model_cfg, self.predicts_labels)
        if previous is None or ready(previous):
            clock.add("data_wait", time.perf_counter() - t0)
        return batch

    def run(self) -> dict:
        """Train from ``start_step`` to ``num_train_steps``; returns the last logged metrics (but
        the wall-clock ones, `throughput.TIMING_KEYS`: every process returns the same). The run's
        goodput is printed as one line and written to ``<workdir>/goodput.json``."""
        s, total = self.settings, self.settings.num_train_steps
        if self.start_step >= total:
            print(f"{self.workdir} is already at step {self.start_step} of num_train_steps={total}: "
                  "nothing to train (raise --config.num_train_steps to continue; to score it on "
                  f"a split or a file: python -m jaxformer.cli.evaluate --workdir {self.workdir} "
                  "--split test)")
        runner = self.runner()
        writer = MetricWriter(self.workdir, count_name="examples" if self.predicts_labels
                              else "tokens")  # one label per example
        progress = Progress(self.start_step, total, enabled=s.progress_bar)
        clock = self.throughput()
        profile = ProfileWindow(s.profile_steps, self.workdir, clock)
        last, train_metrics, state, metrics = {}, {}, runner.place(self.state), None
        stepped = self.start_step >= total  # False until a step has run: `WorkdirLock.release`
        watch = PreemptionWatch()
        guard = NonfiniteGuard(s.nonfinite, s.nonfinite_limit,
                               lambda: (self.ckpt.wait(), self.ckpt.resume_point())[1])
        try:
            for step in range(self.start_step + 1, total + 1):
                batch = self._next_batch(clock, metrics)
                profile.before(step)
                t0 = time.perf_counter()
                state, metrics = runner(state, batch, self.extension.frozen)
                if not stepped:  # this process's first step: compiled, then run (blocked on)
                    jax.block_until_ready(metrics)
                    clock.add("compilation", time.perf_counter() - t0, steps=1)
                stepped = True
                profile.after(step, metrics)
                guard.push(step, metrics)  # checks the step before: the nonfinite policy
                self.ckpt.check()  # a background save that failed stops the run here
                log_now = step % s.log_every_steps == 0 or step == total
                eval_now = step % s.eval.every_steps == 0 or step == total
                if log_now or eval_now:
                    train_metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
                    guard.flush()  # its scalars are here: checked now, counted in this row
                if log_now:
                    train_metrics.update(clock.row(step, train_metrics.get("tokens")))
                    train_metrics.update(self.mix_tokens.row())
                progress.update(1, loss=train_metrics.get("loss"),  # None before the first log
                                lr=train_metrics.get("learning_rate"), mfu=train_metrics.get("mfu"),
                                tokens=self.inputs.tokens(batch, self.model_cfg))
                row = dict(train_metrics) if log_now else {}
                eval_metrics = None
                if eval_now:
                    try:
                        with clock.phase("evaluation"):
                            current = runner.host_state(state)
                            eval_metrics = self.evaluate(self.model_params(current), step)
                    except Exception:  # e.g. a bad record further into the eval split: keep the
                        self.ckpt.save(step, current, self.train_iter)  # training done so far
                        logging.error("evaluation failed at step %d; the step is checkpointed", step)
                        raise
                    row.update(eval_metrics)
                if row:
                    if guard.skipped:
                        row["skipped_updates"] = guard.skipped
                    writer.write(step, row)  # on disk before the step's checkpoint
                    progress.log(step, writer.named(row))
                    last = {**last, **{k: v for k, v in writer.named(row).items()
                                       if k not in TIMING_KEYS}}
                preempted = self.ckpt.preempted(step, watch.signalled)
                if step % s.checkpoint.every_steps == 0 or step == total or preempted:
                    guard.flush()
                    with clock.phase("checkpoint"):
                        current = runner.host_state(state)
                        self.ckpt.save(step, current, self.train_iter, metrics=eval_metrics or None)
                if preempted:
                    print(f"Preempted (SIGTERM) at step {step}: checkpoint saved; rerun the same "
                          "command to resume")
                    last = {**last, "preempted_at_step": step}
                    break
            guard.flush()
            self.state = runner.host_state(state)
            with clock.phase("checkpoint"):
                self.ckpt.wait()  # the last save, committed
            if stepped and self.start_step < total:
                self._report_goodput(clock)
        finally:
            profile.close()
            watch.restore()
            progress.close()
            try:
                self.ckpt.close()  # waits for the last save (`SaveFailed` if it failed)
            finally:
                writer.close()
                if hasattr(self.train_iter, "close"):
                    self.train_iter.close()
                # the last save is committed: another run may take the workdir; a run that
                # failed before its first step removes the workdir it created
                self.lock.release(undo=not stepped)
        return last

    def _report_goodput(self, clock: Throughput) -> None:
        """Print the goodput line and write ``<workdir>/goodput.json`` (process 0)."""
        if jax.process_index() == 0:
            g = clock.goodput()
            print(goodput_line(g), flush=True)
            (self.workdir / GOODPUT_FILE).write_text(json.dumps(g, indent=2) + "\n")


def train_and_evaluate(config, workdir: str | os.PathLike) -> dict:
    """Train per ``config`` in ``workdir`` (resuming if it holds checkpoints); final metrics."""
    return Trainer(config, workdir).run()
