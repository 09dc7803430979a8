"""The one training loop: pretraining and fine-tuning of every family.

``train_and_evaluate(config, workdir)``:

1. validate the config (before anything compiles); build the mesh;
2. load or train the tokenizer (saved in the workdir); build the Grain train iterator;
3. resume from ``<workdir>/checkpoints`` if present (state *and* data iterator), else initialise —
   from ``init_from`` (backbone of a pretraining run or a Hugging Face model) when given;
4. run jit-compiled steps sharded over the mesh (or the pmap path), evaluating, logging and
   checkpointing periodically and at the end.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import jax
import ml_collections
import numpy as np

from jaxformer.config import ModelConfig
from jaxformer.models import build_model
from jaxformer.ops.embedding import check_token_ids
from jaxformer.parallel.mesh import make_mesh
from jaxformer.parallel.rules import batch_sharding
from jaxformer.train.checkpoint import (
    Checkpointer,
    load_params,
    merge_backbone,
    save_run_config,
    with_shardings,
)
from jaxformer.train.config import validate_config
from jaxformer.train.metrics import MetricWriter, Progress
from jaxformer.train.state import create_train_state, state_shardings
from jaxformer.train.step import make_eval_step, make_train_step, summarize_eval


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
        merged.update({k: v for k, v in config.model.to_dict().items() if k in _HF_OVERRIDABLE})
        config.model = merged
        if tok_path and not config.data.tokenizer.get("path"):
            config.data.tokenizer.path = tok_path
    return params


_HF_OVERRIDABLE = ("head", "num_classes", "dropout_rate", "attention_dropout_rate",
                   "ffn_dropout_rate", "dtype", "param_dtype", "scan_layers", "remat_policy",
                   "attention_impl", "pooling")


def _pipeline_transform(config, special):
    """The objective's host-side per-example step (span corruption, denoising) for the pipeline."""
    from jaxformer.objectives import host_transform

    fn = host_transform(config.objective.name, special, config.objective)
    if fn is None:
        return None

    def transform(example, rng):
        inputs, targets = fn(np.asarray(example["inputs"]), rng)
        return {**example, "inputs": inputs, "targets": targets}

    return transform


def _tokenizer_config(config):
    """Fine-tuning reuses the tokenizer saved with the ``init_from`` run unless one is given."""
    tok_cfg = config.data.tokenizer
    if config.init_from and not tok_cfg.get("path"):
        saved = Path(config.init_from) / "tokenizer.model"
        if saved.exists():
            tok_cfg = ml_collections.ConfigDict(tok_cfg.to_dict())
            tok_cfg.path = str(saved)
    return tok_cfg


def _to_global(batch: dict, mesh) -> dict:
    return {k: jax.make_array_from_process_local_data(batch_sharding(mesh, np.ndim(v)), np.asarray(v))
            for k, v in batch.items()}


def _check_batch(batch: dict, vocab_size: int) -> None:
    for key in ("inputs", "targets"):
        if key in batch:
            check_token_ids(batch[key], vocab_size, f"batch[{key!r}]")


def train_and_evaluate(config, workdir: str | os.PathLike) -> dict:
    """Train per ``config`` in ``workdir``; returns the final train and eval metrics."""
    from jaxformer.data.pipeline import make_dataset, source_texts
    from jaxformer.data.sources import get_source
    from jaxformer.data.tokenizer import load_or_train_tokenizer
    from jaxformer.objectives import bind_objective
    from jaxformer.train.optim import make_optimizer

    hf_params = _resolve_hf(config)
    model_cfg: ModelConfig = validate_config(config)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    mesh = make_mesh(config.mesh)
    tokenizer = load_or_train_tokenizer(
        _tokenizer_config(config), workdir,
        lambda: source_texts(get_source(config.data, "train")))
    if tokenizer.vocab_size > model_cfg.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} ids but model.vocab_size="
                         f"{model_cfg.vocab_size}; set model.vocab_size >= {tokenizer.vocab_size}")
    special = tokenizer.special
    if jax.process_index() == 0:
        save_run_config(workdir, config)

    model = build_model(model_cfg)
    total = config.num_train_steps
    prepare = bind_objective(config.objective, special)
    tx, schedule = make_optimizer(config.optimizer, model_cfg.d_model, total)
    ckpt = Checkpointer(workdir, keep=config.checkpoint.keep,
                        best_metric=config.checkpoint.best_metric or None,
                        best_mode=config.checkpoint.best_mode,
                        async_save=config.checkpoint.async_save)
    make_ds = functools.partial(make_dataset, config.data, tokenizer=tokenizer, seed=config.seed,
                                transform=_pipeline_transform(config, special),
                                process_index=jax.process_index(),
                                process_count=jax.process_count())
    train_iter = iter(make_ds("train"))
    abstract, shardings = state_shardings(model, model_cfg, tx, mesh)

    if ckpt.latest_step() is not None:
        state, start = ckpt.restore(with_shardings(abstract, shardings), train_iter)
        print(f"Resumed from {ckpt.directory}/{start}")
    else:
        state, _ = create_train_state(model, model_cfg, tx, mesh, config.seed)
        if config.init_from:
            pretrained = hf_params if hf_params is not None else load_params(config.init_from)
            params, fresh = merge_backbone(state.params, pretrained)
            state, _ = create_train_state(model, model_cfg, tx, mesh, config.seed, params=params)
            print(f"Initialised from {config.init_from}; fresh parameters: {fresh or 'none'}")
        start = 0

    step_fn = make_train_step(model, tx, prepare, schedule,
                              label_smoothing=config.objective.label_smoothing,
                              z_loss=config.objective.z_loss,
                              grad_accum_steps=config.optimizer.get("grad_accum_steps", 1),
                              axis_name="batch" if config.parallel == "pmap" else None)
    if config.parallel == "pmap":
        from jaxformer.parallel.pmap import PmapRunner

        runner = PmapRunner(step_fn, state)
    else:
        runner = None
        step_fn = jax.jit(step_fn, in_shardings=(shardings, None), out_shardings=(shardings, None),
                          donate_argnums=(0,))
    eval_fn = jax.jit(make_eval_step(model, prepare))

    def evaluate(params) -> dict:
        if config.eval.num_batches == 0:
            return {}
        it = iter(make_ds(config.eval.split, num_epochs=1))
        totals, key = None, jax.random.key(config.seed + 1)
        for i, batch in zip(range(config.eval.num_batches), it):
            _check_batch(batch, model_cfg.vocab_size)
            sums = eval_fn(params, _to_global(batch, mesh), jax.random.fold_in(key, i))
            totals = sums if totals is None else jax.tree.map(lambda a, b: a + b, totals, sums)
        return {} if totals is None else {f"eval_{k}": v for k, v in summarize_eval(totals).items()}

    writer = MetricWriter(workdir)
    progress = Progress(start, total, enabled=config.progress_bar)
    last, train_metrics = {}, {}
    try:
        for step in range(start + 1, total + 1):
            batch = next(train_iter)
            _check_batch(batch, model_cfg.vocab_size)
            if runner is not None:
                state, metrics = runner.step(batch)
            else:
                state, metrics = step_fn(state, _to_global(batch, mesh))
            if step % config.log_every_steps == 0 or step == total or step % config.eval.every_steps == 0:
                train_metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
            progress.update(1, loss=train_metrics.get("loss", float("nan")),
                            lr=train_metrics.get("learning_rate", 0.0),
                            tokens=float(np.sum(batch.get("inputs_segment_ids", batch["inputs"]) != 0)))
            row = {}
            if step % config.log_every_steps == 0 or step == total:
                row.update(train_metrics)
            eval_metrics = None
            if step % config.eval.every_steps == 0 or step == total:
                params = runner.params() if runner is not None else state.params
                eval_metrics = evaluate(params)
                row.update(eval_metrics)
            if row:
                writer.write(step, row)
                last = {**last, **row}
            if step % config.checkpoint.every_steps == 0 or step == total:
                save_state = runner.state() if runner is not None else state
                ckpt.save(step, save_state, train_iter, metrics=eval_metrics or None)
    finally:
        progress.close()
        ckpt.close()
        writer.close()
    return last
