"""Predictions for a file from a checkpoint of a training run, in input order (`predict`); its
command line, which writes them as JSONL, is `jaxformer.cli.predict`:

    python -m jaxformer.cli.predict --workdir runs/sentiment --input reviews.tsv --output preds.jsonl
    python -m jaxformer.cli.predict --workdir runs/t5 --input sources.txt --best --strategy beam

The checkpoint is the latest, ``--step N`` or the ``--best`` by the run's ``checkpoint.best_metric``.
The input is read as a ``files:`` source of the run (`jaxformer.data.builders.user_files`): text (one
example per non-blank line), JSONL or TSV, by its extension or the run's ``data.format``; the text is
the field ``data.text_key`` (``data.source_key`` for seq2seq runs; unset: the usual names,
`jaxformer.data.fields`) of a JSONL object or of a TSV row (columns from ``data.columns`` or
the header row). Every line is predicted (no split). One JSON
object per line, in the input's order:

- classification runs (a classifier head, or objective 'cloze': the MLM's label-word logits):
  ``{"id", "text", "label", "probabilities": {class: p}}``, classes named by
  the run's ``data.label_names`` (else "0", "1", …); the text is framed and truncated as in
  training (`jaxformer.data.pipeline.make_dataset`);
- language-model and seq2seq runs: ``{"id", "input", "output"}``, generated with the strategy
  flags of ``python -m jaxformer.cli.generate``.

Batches have ``--batch_size`` rows (the last one padded). Generation sorts the inputs by length and
pads each batch to its longest rounded up to a power of two (`jaxformer.decode.generate_batches`):
short inputs do not pay for the longest one, and a few programs are compiled (one per width);
classification batches have one shape. ``--refill`` (greedy and sampling) instead keeps one
batch running and puts the next input in each row that finished, every 16 steps
(`jaxformer.decode.refill`): outputs of very different lengths then do not hold a batch to its
longest; greedy outputs are the same.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from jaxformer.checkpoint import open_run
from jaxformer.convert.lora import merged_params
from jaxformer.data.builders.user_files import FileSource
from jaxformer.data.fields import Fields, input_field
from jaxformer.data.pipeline import DataSettings, data_line, example_framing, make_dataset
from jaxformer.data.tokenizer import Tokenizer
from jaxformer.decode.api import GenerationConfig, encode_prompts, generate_batches
from jaxformer.evaluation.decoding import data_task
from jaxformer.models import build_model
from jaxformer.objectives.cloze import class_logits, predicts_labels
from jaxformer.progress import bar_disabled
from jaxformer.train.config import run_settings
from jaxformer.train.setup import wire_objective


def read_inputs(path: str, data: DataSettings, task: str) -> list[dict[str, str]]:
    """``{"id", "text"}`` of every example line of ``path`` (a file or a glob), read as the run's
    ``files:`` sources are (its ``data`` section); ``text`` is the field the run's model reads (see
    module docstring)."""
    files = FileSource(path, "train", fmt=data.format, columns=data.columns,
                       split_fractions=(1.0, 0.0, 0.0))
    key = "text" if files.fmt == "text" or not len(files) else input_field(
        list(files[0]), text_key=data.text_key, source_key=data.source_key, task=task)
    fields = Fields(text_key=key, where=f"--input {path!r}")
    return [fields(files[i]) for i in range(len(files))]


def classify(model: Any, params: Any, tokenizer: Tokenizer, run_config: dict,
             texts: Sequence[str], batch_size: int, name: str = "the input"
             ) -> Iterator[np.ndarray]:
    """Class probabilities `[C]` float32 of each text, in order: the texts framed and truncated by
    the run's data pipeline (unshuffled, unpacked), softmax of the model's logits. ``name``: what
    the pipeline's log lines call the texts."""
    settings = run_settings(run_config)
    data = dataclasses.replace(settings.data, batch_size=batch_size, shuffle=False, worker_count=0)
    source = [{"text": t, "label": 0} for t in texts]
    batches = make_dataset(data, "predict", tokenizer, seed=0, objective=settings.objective.name,
                           options=settings.objective_options, process_index=0, process_count=1,
                           num_epochs=1, source=source, source_name=name)
    prepare = wire_objective(settings, tokenizer)

    @jax.jit
    def probabilities(params, batch):
        prepared = prepare(batch, None)
        logits = model.apply(params, **prepared["model_inputs"])
        logits = class_logits(logits, prepared)  # a cloze run: its label words' logits
        return jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1)

    left = len(texts)
    for batch in batches:
        probs = np.asarray(probabilities(params, batch))
        yield from probs[:min(left, len(probs))]
        left -= len(probs)
        if left <= 0:
            break


def continue_texts(model: Any, params: Any, tokenizer: Tokenizer, texts: Sequence[str],
                   batch_size: int, add_bos: bool, *, rng: jax.Array | None = None,
                   progress: bool | str | None = False, refill: bool = False,
                   **kwargs) -> list[str]:
    """The generated text of each of ``texts``, in order, decoded ``batch_size`` inputs of similar
    lengths at a time (`jaxformer.decode.generate_batches`; ``refill``: finished rows take the
    next input every 16 steps); ``kwargs``: `GenerationConfig` fields (EOS and padding are the
    tokenizer's)."""
    special = tokenizer.special
    config = GenerationConfig(eos_id=special.eos_id, pad_id=max(special.pad_id, 0), **kwargs)
    ids = encode_prompts(tokenizer, texts, model.cfg.family, add_bos=add_bos)
    return [tokenizer.decode(s) for s in generate_batches(
        model, params, ids, config, batch_size=batch_size, rng=rng, progress=progress,
        refill=refill)]


def predict(workdir: str, path: str, *, step: int | None = None, best: bool = False,
            batch_size: int = 32, progress: bool | str | None = None, refill: bool = False,
            **generation) -> Iterator[dict]:
    """The prediction rows (module docstring) for the examples of ``path``, in order.
    ``generation``: `jaxformer.decode.generate` options (LM and seq2seq runs); ``refill``: keep
    the decoding batch full (`jaxformer.decode.refill`; greedy and sampling)."""
    run = open_run(workdir, step=step, best=best)
    if run.tokenizer is None:
        raise ValueError(f"{workdir} has no tokenizer.model, so the input text cannot be encoded")
    settings = run_settings(run.run_config)
    model_cfg, data = settings.model, settings.data
    model, tokenizer = build_model(model_cfg), Tokenizer.load(str(run.tokenizer))
    params = jax.tree.map(jnp.asarray, merged_params(run))  # a LoRA run's merged, any base
    examples = read_inputs(path, data, data_task(settings))
    if not examples:
        raise ValueError(f"--input {path!r} holds no example (every line is blank)")
    texts = [e["text"] for e in examples]
    bar = tqdm(total=len(texts), desc="predict", unit="example", disable=bar_disabled(progress),
               file=sys.stderr, dynamic_ncols=True)
    if predicts_labels(model_cfg, settings.objective.name):
        named = data.label_names or ()
        names = [*named, *map(str, range(len(named), model_cfg.num_classes))]
        for ex, p in zip(examples, classify(model, params, tokenizer, run.run_config, texts,
                                            batch_size, name=f"--input {path!r}")):
            bar.update(1)
            label = int(np.argmax(p))
            yield {"id": ex["id"], "text": ex["text"],
                   "label": names[label] if named else label,
                   "probabilities": {n: float(x) for n, x in zip(names, p)}}
    else:
        add_bos = (model_cfg.family == "decoder"
                   and example_framing(data, settings.objective.name) == "bos_eos")
        print(data_line("predict", len(texts), f"--input {path!r}"))  # as `classify`'s pipeline
        for ex, out in zip(examples, continue_texts(model, params, tokenizer, texts, batch_size,
                                                    add_bos, progress=progress, refill=refill,
                                                    **generation)):
            bar.update(1)
            yield {"id": ex["id"], "input": ex["text"], "output": out}
    bar.close()
