"""The one training loop: pretraining and fine-tuning of every family.

``train_and_evaluate(config, workdir)``:

1. validate the config (before anything compiles); build the mesh;
2. load or train the tokenizer (saved in the workdir); build the Grain train iterator;
3. lock the workdir; resume from the newest intact (checksum-verified) step of
   ``<workdir>/checkpoints`` if present (state *and* data iterator; every refusal before any write),
   else initialise — from ``init_from`` (backbone of a pretraining run or a Hugging Face model) when
   given;
4. run jit-compiled steps sharded over the mesh (or shard_map / pmap), evaluating, logging and
   checkpointing periodically and at the end; a non-finite loss or gradient norm stops the run or
   skips the update (``nonfinite``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path

import jax
import ml_collections
import numpy as np
from absl import logging

from jaxformer.config import ModelConfig
from jaxformer.models import build_model
from jaxformer.ops.embedding import check_token_ids
from jaxformer.parallel.mesh import check_batch_size, describe, make_mesh
from jaxformer.parallel.partition import sharded_jit
from jaxformer.parallel.rules import batch_sharding
from jaxformer.train.checkpoint import (
    Checkpointer,
    PreemptionWatch,
    StateMismatch,
    load_params,
    load_run_config,
    merge_backbone,
    resolve_checkpoint,
    save_run_config,
    with_shardings,
)
from jaxformer.train.config import check_resume, validate_config
from jaxformer.train.lock import WorkdirLock
from jaxformer.train.metrics import MetricWriter, Progress, truncate_metrics
from jaxformer.train.nonfinite import NonfiniteGuard
from jaxformer.train.state import create_params, create_train_state, state_shardings
from jaxformer.train.step import make_eval_step, make_train_step, summarize_eval
from jaxformer.train.verify import read_manifest, verify_tokenizer


def _resolve_hf(config):
    """If ``init_from`` is a Hugging Face directory, take its architecture (config.model overrides)."""
    if not config.init_from:
        return None
    from jaxformer.convert import is_hf_directory, load_hf

    if not is_hf_directory(config.init_from):
        return None
    hf_model, params, tok_path = load_hf(
        config.init_from, scan_layers=bool(config.model.get("scan_layers", False)),
        head=config.model.get("head"), num_classes=config.model.get("num_classes"),
        seed=config.seed)
    with config.unlocked():
        merged = dict(hf_model)
        merged.update({k: v for k, v in config.model.to_dict().items()
                       if k in _HF_OVERRIDABLE and v != _MODEL_DEFAULTS[k]})
        config.model = merged
        if tok_path and not config.data.tokenizer.get("path"):
            config.data.tokenizer.path = tok_path
    return params


# config.model values that differ from ModelConfig's defaults override the checkpoint's.
_MODEL_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
_HF_OVERRIDABLE = ("head", "num_classes", "dropout_rate", "attention_dropout_rate",
                   "ffn_dropout_rate", "dtype", "param_dtype", "scan_layers", "remat_policy",
                   "attention_impl", "pooling")


def _build_model(cfg: ModelConfig, module_api: str):
    """The Linen module, or the NNX model as the same pure init/apply pair (`jaxformer.nnx`)."""
    if module_api == "nnx":
        from jaxformer.nnx import FunctionalModel

        return FunctionalModel(cfg)
    return build_model(cfg)


def _tokenizer_config(config, hf: bool):
    """Fine-tuning reuses the tokenizer saved with the ``init_from`` run (a workdir, its
    ``checkpoints`` dir or one step dir; a Hugging Face directory's sentencepiece model is set by
    `_resolve_hf`) unless one is given."""
    tok_cfg = config.data.tokenizer
    if config.init_from and not tok_cfg.get("path"):
        saved = None
        if not hf:
            ckpt_dir, step = resolve_checkpoint(config.init_from)  # <run>/checkpoints
            saved = verify_tokenizer(ckpt_dir.parent, read_manifest(ckpt_dir / str(step)),
                                     required=False)
        if saved is None:
            logging.warning("init_from=%s has no tokenizer.model: training a new tokenizer, so the "
                            "pretrained embeddings are read with other token ids; set "
                            "data.tokenizer.path to the pretraining tokenizer", config.init_from)
            return tok_cfg
        tok_cfg = ml_collections.ConfigDict(tok_cfg.to_dict())
        tok_cfg.path = str(saved)
    return tok_cfg


def _to_global(batch: dict, mesh) -> dict:
    return {k: jax.make_array_from_process_local_data(batch_sharding(mesh, np.ndim(v)), np.asarray(v))
            for k, v in batch.items()}


def _check_batch(batch: dict, cfg: ModelConfig) -> None:
    """Token ids within the vocabulary and labels within the classes (JAX would clamp or NaN)."""
    for key in ("inputs", "targets"):
        if key in batch:
            check_token_ids(batch[key], cfg.vocab_size, f"batch[{key!r}]")
    if "label" in batch and cfg.head == "classify":
        labels = np.asarray(batch["label"])
        if labels.size and (labels.min() < 0 or labels.max() >= cfg.num_classes):
            bad = labels[(labels < 0) | (labels >= cfg.num_classes)]
            raise ValueError(f"label {int(bad[0])} is outside [0, model.num_classes="
                             f"{cfg.num_classes}); set model.num_classes (and data.label_names)")


class Trainer:
    """Set-up (tokenizer, model, state, data) on construction; `run` trains to the last step.

    After construction ``trainer.state`` is the state training starts from (resumed, initialised
    from ``init_from``, or fresh) and ``trainer.start_step`` its step; tests and notebooks can
    inspect both before calling `run`.
    """

    def __init__(self, config, workdir: str | os.PathLike):
        from jaxformer.train.optim import make_optimizer

        hf_params = _resolve_hf(config)
        self.config = config
        self.model_cfg: ModelConfig = validate_config(config)
        self.workdir = workdir = Path(workdir)
        if workdir.exists() and not workdir.is_dir():
            raise ValueError(f"workdir {str(workdir)!r} exists and is not a directory")
        tok_cfg = _tokenizer_config(config, hf=hf_params is not None)  # init_from exists?
        self.mesh = make_mesh(config.mesh)
        check_batch_size(self.mesh, config.data.batch_size,
                         config.optimizer.get("grad_accum_steps", 1))
        self.model = model = _build_model(self.model_cfg, config.get("module_api", "linen"))
        self.tx, self.schedule = make_optimizer(config.optimizer, self.model_cfg.d_model,
                                                config.num_train_steps)
        # a parameter the mesh cannot split fails here, before any tokenizer or file is written
        abstract, self.shardings = state_shardings(model, self.model_cfg, self.tx, self.mesh)
        self.lock = WorkdirLock(workdir).acquire()  # creates the workdir; a second run stops here
        try:
            self._set_up(config, tok_cfg, hf_params, abstract)
        except BaseException:
            self.lock.release()
            raise

    def _set_up(self, config, tok_cfg, hf_params, abstract) -> None:
        """Resume (verified, refusals before any write) or initialise; then the data."""
        from jaxformer.data.pipeline import make_dataset, source_texts
        from jaxformer.data.sources import get_source
        from jaxformer.data.tokenizer import Tokenizer, load_or_train_tokenizer
        from jaxformer.objectives import bind_objective

        workdir, model = self.workdir, self.model
        self.ckpt = Checkpointer(workdir, keep=config.checkpoint.keep,
                                 best_metric=config.checkpoint.best_metric or None,
                                 best_mode=config.checkpoint.best_mode,
                                 async_save=config.checkpoint.async_save)
        resume = self._plan_resume(config) if self.ckpt.steps() else None  # reads, never writes
        if jax.process_index() == 0:
            print(f"Mesh {describe(self.mesh)}, parallel={config.parallel}")
        saved_tokenizer = workdir / "tokenizer.model"
        if resume:  # the run's model, tokenizer and config.json stay those of its checkpoints
            self.tokenizer = Tokenizer.load(saved_tokenizer)
        else:
            self.tokenizer = load_or_train_tokenizer(
                tok_cfg, workdir, lambda: source_texts(get_source(config.data, "train")),
                reuse_saved=False)
        if self.tokenizer.vocab_size > self.model_cfg.vocab_size:
            raise ValueError(
                f"the tokenizer has {self.tokenizer.vocab_size} ids but model.vocab_size="
                f"{self.model_cfg.vocab_size}; set model.vocab_size >= {self.tokenizer.vocab_size}")
        special = self.tokenizer.special
        if jax.process_index() == 0 and not resume:
            save_run_config(workdir, config)
            self.tokenizer.save(str(saved_tokenizer))

        whole_words = config.objective.get("whole_word_mask", False)
        self.prepare = bind_objective(
            config.objective, special,
            word_initial=self.tokenizer.word_initial() if whole_words else None)
        self.make_ds = functools.partial(
            make_dataset, config.data, tokenizer=self.tokenizer, seed=config.seed,
            objective=config.objective, process_index=jax.process_index(),
            process_count=jax.process_count())
        self.train_iter = iter(self.make_ds("train"))
        if config.eval.num_batches > 0:  # a missing, empty or unreadable eval split fails now,
            probe = iter(self.make_ds(config.eval.split, num_epochs=1))  # not after training
            next(probe, None)
            if hasattr(probe, "close"):
                probe.close()
        if resume:
            self._resume(config, abstract, *resume)
        else:
            params = None
            if config.init_from:  # fresh (sharded) parameters for new heads; the rest is read on
                # the host and placed shard by shard, never whole on one device
                pretrained = hf_params if hf_params is not None else load_params(config.init_from)
                params, fresh = merge_backbone(
                    create_params(model, self.model_cfg, self.shardings.params, config.seed),
                    pretrained)
            self.state, _ = create_train_state(model, self.model_cfg, self.tx, self.mesh,
                                               config.seed, params=params)
            if config.init_from:
                if hf_params is not None:  # the importer initialised any new head (logged)
                    print(f"Initialised from the Hugging Face model {config.init_from}")
                else:
                    print(f"Initialised from {config.init_from}; fresh parameters: "
                          f"{fresh or 'none'}")
            self.start_step = 0
        if jax.process_index() == 0:
            truncate_metrics(workdir, self.start_step)  # one row per step across crashes

    def _plan_resume(self, config) -> tuple[int, dict | None, list, list[str]]:
        """The newest intact checkpoint and the checks a resume must pass, before any write:
        (step, its manifest, the damaged newer steps, notes on changed config keys)."""
        step, manifest, damaged = self.ckpt.newest_intact()
        if step is None:
            raise ValueError(
                f"no intact checkpoint in {self.ckpt.directory}: "
                + "; ".join(f"{e.step_dir.name}: {e.problem}" for e in damaged)
                + ". Restore the files from a copy, or move the checkpoints folder away to "
                  "train from scratch")
        notes = check_resume(load_run_config(self.workdir, manifest), config)
        verify_tokenizer(self.workdir, manifest, required=True)
        return step, manifest, damaged, notes

    def _resume(self, config, abstract, step: int, manifest, damaged: list, notes: list) -> None:
        try:
            self.state, self.start_step = self.ckpt.restore(
                with_shardings(abstract, self.shardings), self.train_iter, step, verified=True)
        except StateMismatch as e:
            changed = [n for n in notes if n.startswith("optimizer.")]
            raise ValueError(
                f"cannot resume: {e}; changed: {'; '.join(changed) or 'no optimizer.* key'}. "
                "Resume with the previous optimizer settings, or fine-tune its parameters with a "
                f"fresh optimizer state in a new --workdir with --config.init_from={self.workdir}"
            ) from None
        for note in notes:  # from here on the resume succeeds: the workdir may change
            logging.warning("resuming %s with a changed config: %s", self.workdir, note)
        for e, moved in zip(damaged, self.ckpt.set_aside(int(e.step_dir.name) for e in damaged)):
            print(f"Skipped damaged checkpoint {e.step_dir.name} ({e.problem}); kept as "
                  f"{moved} (never read: inspect or delete it)")
        if jax.process_index() == 0:
            save_run_config(self.workdir, config)
        checked = (manifest or {}).get("verified")
        how = (f"verified {checked['bytes'] / 1e6:.1f} MB in {checked['seconds']:.2f} s" if checked
               else "written before checkpoints carried checksums: not verified")
        print(f"Resumed from {self.ckpt.directory}/{self.start_step} ({how})")

    def _step_fn(self):
        """jit over the mesh (default), jit of an explicit shard_map, or a `PmapRunner`."""
        from jaxformer.parallel import pmap, shard_map

        c = self.config
        step_fn = make_train_step(self.model, self.tx, self.prepare, self.schedule,
                                  label_smoothing=c.objective.label_smoothing,
                                  z_loss=c.objective.z_loss,
                                  grad_accum_steps=c.optimizer.get("grad_accum_steps", 1),
                                  axis_name={"pmap": pmap.AXIS,
                                             "shard_map": shard_map.AXIS}.get(c.parallel),
                                  skip_nonfinite=c.nonfinite == "skip")
        if c.parallel == "pmap":
            return pmap.PmapRunner(step_fn, self.state)
        if c.parallel == "shard_map":
            return shard_map.data_parallel_step(step_fn, self.mesh, self.shardings)
        return sharded_jit(step_fn, self.mesh, in_shardings=(self.shardings, None),
                           out_shardings=(self.shardings, None), donate_argnums=(0,))

    def evaluate(self, params) -> dict:
        """Loss, accuracy and perplexity over ``eval.num_batches`` batches of ``eval.split``."""
        c = self.config
        if c.eval.num_batches == 0:
            return {}
        if not hasattr(self, "_eval_fn"):
            self._eval_fn = sharded_jit(make_eval_step(self.model, self.prepare), self.mesh,
                                        in_shardings=(self.shardings.params, None, None))
        it = iter(self.make_ds(c.eval.split, num_epochs=1))
        totals, key = None, jax.random.key(c.seed + 1)
        for i, batch in zip(range(c.eval.num_batches), it):
            _check_batch(batch, self.model_cfg)
            sums = self._eval_fn(params, _to_global(batch, self.mesh), jax.random.fold_in(key, i))
            totals = sums if totals is None else jax.tree.map(lambda a, b: a + b, totals, sums)
        if totals is None:
            return {}
        out = summarize_eval(totals)
        if self.model_cfg.head == "classify":  # exp(cross-entropy) of a label is no perplexity
            out.pop("perplexity")
        return {f"eval_{k}": v for k, v in out.items()}

    def run(self) -> dict:
        """Train from ``start_step`` to ``num_train_steps``; returns the last logged metrics."""
        c, total = self.config, self.config.num_train_steps
        if self.start_step >= total:
            print(f"{self.workdir} is already at step {self.start_step} of num_train_steps={total}: "
                  "nothing to train (raise --config.num_train_steps to continue)")
        step_fn = self._step_fn()
        pmap = not callable(step_fn) or hasattr(step_fn, "step")
        writer = MetricWriter(self.workdir)
        progress = Progress(self.start_step, total, enabled=c.progress_bar)
        last, train_metrics, state = {}, {}, self.state
        watch = PreemptionWatch()
        guard = NonfiniteGuard(c.nonfinite, c.nonfinite_limit,
                               lambda: (self.ckpt.wait(), self.ckpt.latest_step())[1])
        try:
            for step in range(self.start_step + 1, total + 1):
                batch = next(self.train_iter)
                _check_batch(batch, self.model_cfg)
                if pmap:
                    state, metrics = step_fn.step(batch)
                else:
                    state, metrics = step_fn(state, _to_global(batch, self.mesh))
                guard.push(step, metrics)  # checks the step before: the nonfinite policy
                log_now = step % c.log_every_steps == 0 or step == total
                eval_now = step % c.eval.every_steps == 0 or step == total
                if log_now or eval_now:
                    train_metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
                progress.update(1, loss=train_metrics.get("loss"),  # None before the first log
                                lr=train_metrics.get("learning_rate"),
                                tokens=float(np.sum(batch.get("inputs_segment_ids",
                                                              batch["inputs"]) != 0)))
                row = dict(train_metrics) if log_now else {}
                eval_metrics = None
                if eval_now:
                    current = step_fn.state() if pmap else state
                    try:
                        eval_metrics = self.evaluate(current.params)
                    except Exception:  # e.g. a bad record further into the eval split: keep the
                        self.ckpt.save(step, current, self.train_iter)  # training done so far
                        logging.error("evaluation failed at step %d; the step is checkpointed", step)
                        raise
                    row.update(eval_metrics)
                if row:
                    if guard.skipped:
                        row["skipped_updates"] = guard.skipped
                    writer.write(step, row)
                    last = {**last, **row}
                preempted = self.ckpt.preempted(step, watch.signalled)
                if step % c.checkpoint.every_steps == 0 or step == total or preempted:
                    guard.flush()
                    current = step_fn.state() if pmap else state
                    self.ckpt.save(step, current, self.train_iter, metrics=eval_metrics or None)
                if preempted:
                    print(f"Preempted (SIGTERM) at step {step}: checkpoint saved; rerun the same "
                          "command to resume")
                    last = {**last, "preempted_at_step": step}
                    break
            guard.flush()
            self.state = step_fn.state() if pmap else state
        finally:
            watch.restore()
            progress.close()
            self.ckpt.close()
            writer.close()
            if hasattr(self.train_iter, "close"):
                self.train_iter.close()
            self.lock.release()  # the last save is committed: another run may take the workdir
        return last


def train_and_evaluate(config, workdir: str | os.PathLike) -> dict:
    """Train per ``config`` in ``workdir`` (resuming if it holds checkpoints); final metrics."""
    return Trainer(config, workdir).run()
