"""Score a finished run: a split (or a file) of its data through a chosen checkpoint.

    results = evaluate_run("runs/t5", split="test")                   # the latest checkpoint
    results = evaluate_run("runs/clf", data="files:extra.tsv", step=400)

Metrics, by what the run trained:

* every objective: ``loss`` and ``accuracy`` (of tokens; of labels for classification) as the
  trainer's eval step computes them (`jaxformer.train.step.make_eval_step`, same PRNG keys, so an
  MLM run masks the same tokens), over the whole split (one pass, every batch), and ``perplexity``
  = exp(loss) except for classification;
* classification: `jaxformer.evaluation.metrics.classification_report` (per-class precision,
  recall, F1, macro F1, the confusion matrix, named by ``data.label_names``);
* seq2seq, sft and causal LM: BLEU, chrF and exact match of real decoding
  (`jaxformer.evaluation.decoding`; by default for seq2seq and sft runs, for plain clm runs when
  asked).

``data`` evaluates other data with the run's data settings (tokenizer, framing, columns, fields):
``"files:<glob>"`` without ``{split}`` reads every line of the matching files; a glob with
``{split}``, or another source (``"tfds:…"``), is read at ``split``.

It runs the trainer's eval step, so it sits above `jaxformer.train` (and outside
`jaxformer.evaluation`, whose metrics the trainer uses).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from tqdm.auto import tqdm

from jaxformer.checkpoint import open_run, resolve_checkpoint
from jaxformer.checkpoint.run_files import workdir_hint
from jaxformer.config import ModelConfig
from jaxformer.convert.lora import merged_params
from jaxformer.data.pipeline import DataSettings
from jaxformer.data.sources import source_splits
from jaxformer.data.tokenizer import Tokenizer
from jaxformer.evaluation.decoding import (
    decodes,
    decoding_examples,
    generation_config,
    score_decoding,
)
from jaxformer.evaluation.metrics import classification_report
from jaxformer.models import build_model
from jaxformer.objectives.cloze import predicts_labels
from jaxformer.progress import bar_disabled
from jaxformer.settings import read
from jaxformer.train.config import TrainSettings, run_settings
from jaxformer.train.dpo_run import DPO_OBJECTIVES, evaluate_pairs, saved_reference
from jaxformer.train.inputs import inputs_of
from jaxformer.train.setup import wire_objective
from jaxformer.train.step import make_eval_step, summarize_eval


@dataclasses.dataclass(frozen=True)
class LoadedRun:
    """A run's checkpoint ready to evaluate: its training config (``config.json``, and as typed
    sections: `jaxformer.train.config.run_settings`), model, parameters, tokenizer and step."""

    config: ml_collections.ConfigDict
    settings: TrainSettings
    model_cfg: ModelConfig
    model: Any
    params: Any
    tokenizer: Tokenizer | None  # None: an image model's run (`jaxformer.train.inputs`)
    step: int


def checkpoint_path(workdir: str | os.PathLike, *, step: int | None = None, best: bool = False
                    ) -> Path:
    """The step directory to read: ``best`` (the checkpoint kept for ``checkpoint.best_metric``),
    ``step``, or the latest."""
    workdir = Path(workdir)
    if not workdir.is_dir():
        raise FileNotFoundError(f"workdir {str(workdir)!r} does not exist{workdir_hint(workdir)}")
    if best and step is not None:
        raise ValueError("give --step or --best, not both")
    if best:
        ckpt_dir, chosen = resolve_checkpoint(workdir, best=True)
        return ckpt_dir / str(chosen)
    if step is None:
        return workdir  # open_run reads its latest step
    path = workdir / "checkpoints" / str(step)
    if not path.is_dir():
        found = sorted(int(p.name) for p in (workdir / "checkpoints").glob("*") if p.name.isdigit())
        raise FileNotFoundError(f"{workdir} has no checkpoint of step {step}; its steps are "
                                f"{found or 'none'}")
    return path


def load_run(workdir: str | os.PathLike, *, step: int | None = None, best: bool = False
             ) -> LoadedRun:
    """Verify and read one checkpoint of ``workdir`` (`checkpoint_path`) with its run config."""
    run = open_run(checkpoint_path(workdir, step=step, best=best))
    config, settings = ml_collections.ConfigDict(run.run_config), run_settings(run.run_config)
    if run.tokenizer is None and inputs_of(settings.model).needs_tokenizer:
        raise FileNotFoundError(f"{workdir} has no tokenizer.model: its data cannot be encoded")
    tokenizer = None if run.tokenizer is None else Tokenizer.load(str(run.tokenizer))
    params = jax.tree.map(jnp.asarray, merged_params(run))  # a LoRA run's merged, any base
    return LoadedRun(config, settings, settings.model, build_model(settings.model), params,
                     tokenizer, int(run.step_dir.name))


def _whole_files(data: str | None) -> str | None:
    """The glob of ``data`` = ``"files:<glob>"`` without ``{split}`` (every line read), else None."""
    kind, _, rest = (data or "").partition(":")
    return rest if kind == "files" and "{split}" not in rest else None


def with_data(config: ml_collections.ConfigDict, data: str, split: str
              ) -> tuple[ml_collections.ConfigDict, str]:
    """(config reading ``data`` instead of its ``data.source``, the split to read): a
    ``files:`` glob without ``{split}`` becomes the split of the source ``files:{split}``, so every
    line of its files is read (none is held out by hash)."""
    config = ml_collections.ConfigDict(config.to_dict())
    glob = _whole_files(data)
    if glob is not None:
        data, split = "files:{split}", glob
        config.data.split_fractions = (0.9, 0.05, 0.05)  # the default: not read for {split} globs
    config.data.source = data
    return config, split


def teacher_forced(loaded: LoadedRun, settings: TrainSettings, split: str, *,
                   progress: bool | None = None) -> dict[str, Any]:
    """Loss, accuracy, perplexity (not for classification) and, for classification, the
    `classification_report`, over every batch of ``split`` (``settings.data``: the data read,
    the run's or ``--data``'s); for a DPO run, its preference metrics against its reference
    (`jaxformer.train.dpo_run.evaluate_pairs`, what the trainer's evaluation logs)."""
    make_ds = inputs_of(loaded.model_cfg).dataset_maker(  # text, or an image model's images
        settings.data, loaded.model_cfg, loaded.tokenizer, seed=settings.seed,
        objective=settings.objective.name, options=settings.objective_options, process_index=0,
        process_count=1)
    batches = make_ds(split, num_epochs=1)
    if settings.objective.name in DPO_OBJECTIVES:  # the trainer's evaluation (`DPOEval`)
        return evaluate_pairs(loaded.model, loaded.params, saved_reference(settings, loaded.model_cfg),
                              batches, settings.objective_options,
                              wire_objective(settings, loaded.tokenizer))
    classify = predicts_labels(loaded.model_cfg, settings.objective.name)
    step_fn = jax.jit(make_eval_step(loaded.model, wire_objective(settings, loaded.tokenizer),
                                     predictions=classify))
    totals: dict[str, float] = {}
    labels, predicted = [], []
    key = jax.random.key(settings.seed + 1)  # the trainer's eval keys (`Trainer.evaluate`)
    for i, batch in enumerate(tqdm(batches, desc=f"evaluate {split}", unit="batch",
                                   disable=bar_disabled(progress))):
        out = step_fn(loaded.params, batch, jax.random.fold_in(key, i))
        sums, rows = out if classify else (out, None)
        for k, v in jax.device_get(sums).items():
            totals[k] = totals.get(k, 0.0) + float(v)
        if rows is not None:
            rows = jax.device_get(rows)
            keep = rows["weights"] > 0
            labels.append(rows["targets"][keep])
            predicted.append(rows["predictions"][keep])
    if not totals:
        raise ValueError(f"split {split!r} yielded no batch")
    metrics = summarize_eval(totals)
    if not classify:
        return {**metrics, "tokens": int(totals["weight"])}
    metrics.pop("perplexity")  # exp(cross-entropy) of a label is no perplexity
    report = classification_report(np.concatenate(labels), np.concatenate(predicted),
                                   loaded.model_cfg.num_classes,
                                   _class_names(settings.data, loaded.model_cfg.num_classes))
    return {**metrics, "examples": int(totals["weight"]), **report}


def _class_names(data: DataSettings, num_classes: int) -> list[str] | None:
    names = list(data.label_names or ())
    if not names:
        return None
    return names + [str(i) for i in range(len(names), num_classes)]  # classes past the names


def evaluate_run(workdir: str | os.PathLike, *, split: str = "test", data: str | None = None,
                 step: int | None = None, best: bool = False, decode: bool | None = None,
                 strategy: str | None = None, beam_size: int | None = None,
                 max_new_tokens: int | None = None, max_decode: int = 0,
                 batch_size: int | None = None, progress: bool | None = None,
                 refill: bool = False) -> dict[str, Any]:
    """Score one checkpoint of ``workdir`` on ``split`` (or ``data``); see the module docstring.

    Args:
      decode: score generations (None: for seq2seq and sft runs; True also for clm runs).
      strategy, beam_size, max_new_tokens: decoding (default: the run's ``eval.generate_*``).
      max_decode: decode the first ``max_decode`` examples only (0 = all).
      batch_size: rows per decoding batch (default ``data.batch_size``).
      refill: greedy decoding refills finished rows with waiting examples
        (`jaxformer.decode.refill`): the same tokens, faster when outputs end at very different
        lengths; beam search ignores it. Not part of the results' name: it does not change them.
      progress: progress bars (None: only when stderr is a terminal, `jaxformer.progress`).

    Returns:
      ``{"workdir", "step", "split", "data", "run_data", "objective", "metrics": {...},
      "generation": {...}}`` (``run_data``: the run's own ``data.source``; ``generation`` only
      when decoding), JSON-serialisable.
    """
    loaded = load_run(workdir, step=step, best=best)
    print(f"evaluating {workdir} step {loaded.step}, attention "
          f"{loaded.model_cfg.attention_summary()}", file=sys.stderr)
    config, settings = loaded.config, loaded.settings
    if data:
        config, split = with_data(config, data, split)
        settings = dataclasses.replace(settings, data=read(DataSettings, config.data))
    source, name = settings.data.source, settings.objective.name
    splits = None if source == "files:{split}" else source_splits(settings.data)
    if splits is not None and split not in splits:
        raise ValueError(f"--split {split!r} is not a split of data.source={source!r}; its "
                         f"splits are {splits}")
    results: dict[str, Any] = {"workdir": str(workdir), "step": loaded.step, "split": split,
                               "data": data or source, "run_data": loaded.settings.data.source,
                               "objective": name,
                               "metrics": teacher_forced(loaded, settings, split, progress=progress)}
    can_decode = decodes(settings, loaded.model_cfg)
    task_default = name in ("seq2seq", "sft")
    if decode and not can_decode:
        raise ValueError(f"objective {name!r} with a {loaded.model_cfg.family} "
                         "model produces no text to decode")
    if decode or (decode is None and can_decode and task_default):
        gen = generation_config(settings, loaded.tokenizer, strategy=strategy, beam_size=beam_size,
                                max_new=max_new_tokens)
        examples = decoding_examples(settings, loaded.tokenizer, split, limit=max_decode)
        scores, _ = score_decoding(loaded.model, loaded.params, loaded.tokenizer, examples, gen,
                                   batch_size=batch_size or settings.data.batch_size,
                                   progress=progress, refill=refill)
        results["generation"] = {"strategy": gen.strategy, "max_new_tokens": gen.max_new_tokens,
                                 **({"beam_size": gen.beam_size} if gen.strategy == "beam" else {}),
                                 "max_decode": max_decode, "examples": len(examples), **scores,
                                 **({"refill": True} if refill else {})}
    return results


def results_path(workdir: str | os.PathLike, results: dict[str, Any]) -> Path:
    """``<workdir>/eval/<data>_step<N>[_<decoding>].json``, named by everything that changes the
    result, so no evaluation overwrites another's: the split (a ``--data`` file's name, or
    ``<source>_<split>`` for other data), the step and, when it decoded, the strategy with its
    beam size, ``max_new_tokens`` and ``max_decode`` (e.g. ``test_step1000_beam4_new64.json``)."""
    def slug(text: str) -> str:
        return re.sub(r"[^\w.-]+", "_", text).strip("_") or "data"

    glob = _whole_files(results["data"])
    name = slug(results["split"] if glob is None else Path(glob).name)
    if glob is None and results["data"] != results.get("run_data", results["data"]):
        name = f"{slug(results['data'])}_{name}"
    name += f"_step{results['step']}"
    g = results.get("generation")
    if g:
        name += f"_{g['strategy']}{g.get('beam_size', '')}_new{g['max_new_tokens']}"
        name += f"_first{g['max_decode']}" if g.get("max_decode") else ""
    return Path(workdir) / "eval" / f"{name}.json"


def write_results(results: dict[str, Any], path: str | os.PathLike) -> Path:
    """Write ``results`` as indented JSON (atomically: a partial file is never left)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=2) + "\n")
    os.replace(tmp, path)
    return path
