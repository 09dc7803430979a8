"""The deterministic, checkpointable Grain input pipeline: source → tokens → rows → batches.

The objective (``config.objective``, `jaxformer.objectives.Objective`) decides the example format
(its data task), the default framing and the host-side transform; the data config decides the
source, the lengths and the batching.

Stages (Grain 0.2 dataset API)::

    MapDataset.source(src)[process_index::process_count]      each process reads its own shard
      .seed(seed).shuffle()                                   global shuffle of the shard, per epoch
      .map(tokenize).repeat(num_epochs)                       None = forever (training)
      .to_iter_dataset()
    → frame + fit      BOS/EOS/[CLS]/[SEP] by task, then truncate (counted) or split to the length
    → random_map(transform)   the objective's host-side transform, e.g. T5 span corruption
    → pack (first fit, `jaxformer.data.packing`) or pad      rows with segment ids and positions
    → batch(batch_size // process_count)   a finite pass pads its last batch with all-padding rows
    → prefetch (threads, or `worker_count` processes)

Everything is a function of ``seed`` (and ``worker_count``: each count gives another, equally
deterministic stream). ``iter(ds).get_state()`` is a small JSON-serialisable dict; save it with the
model checkpoint through Orbax as ``grain.checkpoint.CheckpointSave(iterator)`` and restore with
``grain.checkpoint.CheckpointRestore(iterator)`` (one JSON file per process). Close iterators you
are done with (``iterator.close()``); those still open when the interpreter exits are closed then.

Data tasks (`Objective.data_task`; ``data.task`` is derived from ``objective.name``, and a config
that still sets it must agree) and their framing (``data.framing``: "eos" GPT, "bos_eos",
"cls_sep" BERT, "none"; unset, "", = the objective's `Objective.framing`):

* ``lm``: text → ``inputs`` (empty texts are skipped, counted). "eos"/"bos_eos" mark *documents*
  (``<s>? text </s>``; a long document keeps its EOS only on its last piece); "cls_sep" marks every
  *row segment* (``[CLS] text [SEP]``). ``data.long_examples``: "truncate" (keep the first row's
  worth, counted) or "split" (every piece of the document becomes an example).
* ``classify``: ``[CLS] text [SEP]`` / ``text </s>`` (the pooled token survives truncation)
  → ``inputs``, ``label``. Never packed (one label per row).
* ``seq2seq``: ``source </s>`` → ``inputs``, ``target </s>`` → ``targets`` (trimmed to keep EOS).
* ``sft``: ``<s>? prompt response </s>`` → ``inputs``; ``inputs_loss_mask`` is 1 on the response
  tokens and its EOS. Source keys ``prompt``/``response`` (or ``source``/``target``).
* ``preference`` / ``preference_seq2seq`` (DPO): ``prompt``, ``chosen``, ``rejected`` → one pair per
  example, packed whole (`jaxformer.data.preference`); too long: cut from the prompt's left, counted.
* ``span_corruption`` (objectives ``span_corruption``, ``denoise``): text pieces of ``seq_len - 1``
  tokens → the objective's transform → ``inputs``/``targets``, each ending with EOS (appended
  unless present, trimmed T5-style).
* ``sentence_pairs``: ``[CLS] A [SEP] B [SEP]`` + ``nsp_label`` (`jaxformer.data.sentence_pairs`).
* ``qa``: ``[CLS] question [SEP] context window [SEP]`` → ``inputs``, ``inputs_token_types``,
  ``start_position``, ``end_position``: one row per window (`jaxformer.data.qa_windows`). Never packed.

The transform (`Objective.example_transform`, or one given to `make_dataset`) is
``(example: dict, rng: np.random.Generator) -> dict``; it sees the framed example (for span
corruption ``{"inputs": tokens}`` without EOS) and returns the task's features.
Output batches follow the conventions of the objectives: ``inputs [B, L] int32``,
``inputs_segment_ids``, ``inputs_positions`` (+ ``targets*`` `[B, Lt]`, ``label [B]``,
``inputs_loss_mask [B, L]``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grain
import jax
import ml_collections
import numpy as np
from absl import flags
from tqdm.auto import tqdm

from jaxformer.data.block_packing import PackedTokenRows
from jaxformer.data.builders.user_files import BadRecord, FileSource
from jaxformer.data.closed_at_exit import ClosedAtExit
from jaxformer.data.containers import MappedSource, Subset, read_records
from jaxformer.data.held_out import check_held_out
from jaxformer.data.mixture import (
    COMPONENT_FEATURE,
    MixedExamples,
    TagComponent,
    component_names,
    mixture_components,
)
from jaxformer.data.packing import PadToLength, TruncationCounter, pack
from jaxformer.data.preference import PAIR_FEATURES, decoder_pair, seq2seq_pair
from jaxformer.data.qa_windows import QA_KEYS, QAFeatures, qa_example
from jaxformer.data.sentence_pairs import SentencePairs, check_pair_data, pair_rows
from jaxformer.data.sources import SourceSettings, get_source, source_kinds, source_parts
from jaxformer.data.sources import source_texts as source_texts  # re-exported
from jaxformer.data.token_shards import check_token_manifest
from jaxformer.data.tokenizer import Tokenizer, TokenizerSettings
from jaxformer.objectives.registry import FRAMINGS, OBJECTIVES, Objective, check_data_task
from jaxformer.settings import at_least, config_dict, positive, section, setting, subsection
from jaxformer.vocab import SpecialTokens

LONG_EXAMPLES = ("truncate", "split")
SPLITTABLE_TASKS = ("lm", "span_corruption", "sentence_pairs")  # plain-text tasks; pairs chunk
Transform = Callable[[dict, np.random.Generator], dict]


@dataclasses.dataclass(frozen=True)
class DataSettings(SourceSettings):
    """``config.data``: the source keys (`SourceSettings`), then the keys this module reads, then
    the tokenizer (`TokenizerSettings`). Their cross-field rules: `check_data_config`."""

    seq_len: int = setting(
        128, "row length of inputs (tokens, framing included); longer examples: data.long_examples")
    target_len: int = setting(128, "row length of targets (seq2seq, span corruption), EOS included")
    batch_size: int = setting(8, "global rows per optimizer step (split evenly over processes)")
    packing: bool = setting(
        True, "first-fit pack several examples per row (segment ids keep them apart); not for "
        "classification")
    packing_bins: int = setting(
        0, "rows packed at once; 0 = max(per-process batch, 32)", check=at_least(0))
    shuffle: bool = setting(True, "shuffle the examples, every epoch anew (seeded by seed)")
    framing: str = setting(
        "", "'' = the objective's; 'eos' (text </s>, GPT), 'bos_eos', 'cls_sep' ([CLS] text [SEP], "
        "BERT) or 'none'; a .txt file's every non-blank line is one example framed so")
    long_examples: str = setting(
        "truncate", "'truncate' (keep a row's worth, counted in the first-epoch summary) or 'split' "
        "(lm / span corruption: every piece of a long text is an example)")
    read_threads: int = setting(
        0, "threads reading and tokenizing (0 = inline: fastest for in-memory sources)",
        check=at_least(0))
    read_buffer: int = setting(256, "examples buffered by the read threads", check=positive)
    prefetch: int = setting(2, "batches prefetched by a thread (when worker_count is 0)",
                            check=at_least(0))
    worker_count: int = setting(
        0, "Grain worker processes (0 = none); each count gives another deterministic stream",
        check=at_least(0))
    worker_buffer_size: int = setting(2, "batches buffered per worker process", check=positive)
    # images (issue 64, the Vision Transformer: jaxformer.data.images), training split only
    image_crop_padding: int = setting(
        0, "images: zero-pad this many pixels a side, then crop back at a random offset (0 = no crop)",
        check=at_least(0))
    image_flip: bool = setting(False, "images: mirror left-right with probability 1/2")
    tokenizer: TokenizerSettings = subsection(TokenizerSettings, "the tokenizer (data.tokenizer.*)")


def default_data_config() -> ml_collections.ConfigDict:
    """Defaults of ``config.data`` (`DataSettings`)."""
    return config_dict(section(DataSettings))


def _i32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.int32)


def _get(example: Mapping, task: str, *names: str) -> list:
    missing = [n for n in names if n not in example]
    if missing:
        hint = {"label": "; set data.label_key to the field or column holding the label "
                         "(e.g. --config.data.label_key=label)",
                "source": "; set data.source_key and data.target_key to the fields of each pair",
                "target": "; set data.source_key and data.target_key to the fields of each pair"}
        raise ValueError(f"the {task!r} data task needs source examples with keys {list(names)}; "
                         f"got {sorted(example)} (missing {missing})"
                         + next((hint[n] for n in missing if n in hint), ""))
    return [example[n] for n in names]


class _Tokenize(grain.transforms.Map):
    """Source example → token arrays without specials: {inputs[, targets | label]} or
    {prompt, response}."""

    def __init__(self, tokenizer: Tokenizer, task: str):
        self.tokenizer, self.task = tokenizer, task

    def map(self, ex):
        enc, task = self.tokenizer.encode, self.task
        if "inputs" in ex:  # pre-tokenized (`jaxformer.data.token_shards`): text tasks only
            return {"inputs": _i32(ex["inputs"])}
        if task == "qa":  # tokenized with character offsets by `QAFeatures`
            return ex
        if task in ("lm", "span_corruption"):
            return {"inputs": _i32(enc(*_get(ex, task, "text")))}
        if task == "classify":
            text, label = _get(ex, task, "text", "label")
            return {"inputs": _i32(enc(text)), "label": np.int32(label)}
        if task == "seq2seq":
            src, tgt = _get(ex, task, "source", "target")
            return {"inputs": _i32(enc(src)), "targets": _i32(enc(tgt))}
        if task in PAIR_FEATURES:  # DPO's pairs
            return {k: _i32(enc(t)) for k, t in zip(("prompt", "chosen", "rejected"),
                                                    _get(ex, task, "prompt", "chosen", "rejected"))}
        keys = ("prompt", "response") if "prompt" in ex else ("source", "target")
        prompt, response = _get(ex, task, *keys)
        return {"prompt": _i32(enc(prompt)), "response": _i32(enc(response))}


def framing_tokens(framing: str, special: SpecialTokens) -> tuple[list[int], list[int]]:
    """(prefix, suffix) ids of ``framing``; ValueError when the tokenizer lacks one."""
    names = {"eos": ((), ("eos_id",)), "bos_eos": (("bos_id",), ("eos_id",)),
             "cls_sep": (("cls_id",), ("sep_id",)), "none": ((), ())}[framing]
    out = []
    for group in names:
        ids = [getattr(special, n) for n in group]
        if any(i < 0 for i in ids):
            raise ValueError(f"data.framing={framing!r} needs special tokens {list(group)} that "
                             f"the tokenizer lacks ({special}); choose another framing")
        out.append(ids)
    return out[0], out[1]


def _trim_eos(x: np.ndarray, n: int, eos: int) -> tuple[np.ndarray, int]:
    """``x`` ending with EOS (appended unless present), cut to ``n`` keeping the EOS (T5 style)."""
    if len(x) == 0 or x[-1] != eos:
        x = np.concatenate([x, [eos]])
    if len(x) <= n:
        return _i32(x), 0
    return _i32(np.concatenate([x[:n - 1], [eos]])), len(x) - n


class _Frame(grain.experimental.FlatMapTransform):
    """Tokens → framed examples that fit the row lengths (one, or several when splitting)."""

    max_fan_out = 1  # only used by MapDataset flat maps; FlatMapIterDataset has no limit

    def __init__(self, task, framing, special, seq_len, target_len, split, counter):
        self.task, self.special, self.split, self.counter = task, special, split, counter
        self.seq_len, self.target_len = seq_len, target_len
        self.prefix, self.suffix = (_i32(t) for t in framing_tokens(framing, special))
        self.per_segment = framing == "cls_sep"

    def _pieces(self, body: np.ndarray, n: int) -> list[np.ndarray]:
        if self.split:
            self.counter.record(0)
            return [body[i:i + n] for i in range(0, max(len(body), 1), n)]
        self.counter.record(max(len(body) - n, 0))
        return [body[:n]]

    def flat_map(self, ex):
        L, pre, suf, task = self.seq_len, self.prefix, self.suffix, self.task
        eos = self.special.eos_id
        if task == "sentence_pairs":  # rows made by `SentencePairs`
            return pair_rows(ex, self.counter)
        if task in ("lm", "span_corruption") and len(ex["inputs"]) == 0:
            self.counter.record_empty()  # blank lines of a corpus: nothing to learn from
            return []
        if task == "lm" and not self.per_segment:
            return [{"inputs": _i32(p)}
                    for p in self._pieces(np.concatenate([pre, ex["inputs"], suf]), L)]
        if task == "lm":
            return [{"inputs": _i32(np.concatenate([pre, p, suf]))}
                    for p in self._pieces(ex["inputs"], L - len(pre) - len(suf))]
        if task == "span_corruption":
            return [{"inputs": _i32(p)} for p in self._pieces(ex["inputs"], L - 1)]
        if task == "classify":
            n = L - len(pre) - len(suf)
            self.counter.record(max(len(ex["inputs"]) - n, 0))
            return [{"inputs": _i32(np.concatenate([pre, ex["inputs"][:n], suf])),
                     "label": ex["label"]}]
        if task == "seq2seq":
            inputs, cut_in = _trim_eos(ex["inputs"], L, eos)
            targets, cut_tg = _trim_eos(ex["targets"], self.target_len, eos)
            self.counter.record(cut_in + cut_tg)
            return [{"inputs": inputs, "targets": targets}]
        if task in PAIR_FEATURES:  # `jaxformer.data.preference`: truncated from the prompt's left
            bos = pre[:1] if len(pre) and pre[0] == self.special.bos_id else pre[:0]
            texts = (ex["prompt"], ex["chosen"], ex["rejected"])
            pair, cut = (decoder_pair(*texts, bos=bos, eos=eos, seq_len=L) if task == "preference"
                         else seq2seq_pair(*texts, eos=eos, seq_len=L, target_len=self.target_len))
            self.counter.record(cut)
            return [pair]
        # sft: <s>? prompt response </s>, loss on the response and its EOS
        bos = pre[:1] if len(pre) and pre[0] == self.special.bos_id else pre[:0]
        head = np.concatenate([bos, ex["prompt"]])
        tail = np.concatenate([ex["response"], [eos]])
        tokens = np.concatenate([head, tail])
        mask = np.concatenate([np.zeros(len(head)), np.ones(len(tail))])
        self.counter.record(max(len(tokens) - L, 0))
        return [{"inputs": _i32(tokens[:L]), "inputs_loss_mask": _i32(mask[:L])}]


class _Finalize(grain.transforms.Map):
    """After a transform: int32 features within their row lengths (seq2seq-like tasks: ending with
    EOS, trimmed T5-style; others: truncated), counted."""

    def __init__(self, lengths, eos_id: int | None, counter: TruncationCounter):
        self.lengths, self.eos_id, self.counter = lengths, eos_id, counter

    def map(self, ex):
        out, cut = dict(ex), 0
        for k, n in self.lengths.items():
            if k not in ex:
                raise ValueError(f"the example transform must return feature {k!r}; it returned "
                                 f"{sorted(ex)}")
            x = _i32(ex[k])
            if self.eos_id is not None and k in ("inputs", "targets"):
                out[k], c = _trim_eos(x, n, self.eos_id)
            else:
                out[k], c = x[:n], max(len(x) - n, 0)
            cut += c
        self.counter.record(cut)
        return out


def check_data_config(data: DataSettings, process_count: int = 1, *,
                      objective: Objective | str = "clm", options: Any = None) -> None:
    """ValueError naming the ``data.*`` key that is invalid for ``objective`` (or the objective of
    that name) with ``options`` (its options dataclass, None: the defaults: they may choose its data
    task, `jaxformer.objectives.check_data_task`), run by `validate_config` too."""
    def bad(key, want):
        raise ValueError(f"data.{key}={getattr(data, key)!r} is invalid: {want}")

    task = check_data_task(objective, options).data_task
    if data.framing not in ("", *FRAMINGS):
        bad("framing", f"choose one of {FRAMINGS}, or '' for the objective's")
    example_framing(data, objective)
    if data.long_examples not in LONG_EXAMPLES:
        bad("long_examples", f"choose one of {LONG_EXAMPLES}")
    if data.long_examples == "split" and task not in SPLITTABLE_TASKS:
        names = [n for n, o in OBJECTIVES.items() if o.data_task in SPLITTABLE_TASKS]
        bad("long_examples", f"'split' applies to objectives {names} only")
    for key, least in (("seq_len", 4), ("target_len", 4), ("batch_size", 1)):
        if not isinstance(getattr(data, key), int) or getattr(data, key) < least:
            bad(key, f"must be an integer >= {least}")
    if data.batch_size % process_count:
        bad("batch_size", f"the global batch must divide evenly among {process_count} processes")
    if data.packing and task in ("classify", "qa"):
        bad("packing", f"{task} rows hold one example (one label); set data.packing=False")
    if task == "sentence_pairs":
        check_pair_data(example_framing(data, objective), data.packing)
    check_held_out(data.validation_from_train, data.source)
    tokens = [p for p in source_parts(data.source) if p.startswith("tokens:")]
    if tokens and not data.tokenizer.path:
        raise ValueError(f"data.source={data.source!r} is pre-tokenized: set data.tokenizer.path to "
                         f"the tokenizer it was made with ({tokens[0][7:]}/tokenizer.model)")


def example_framing(data: DataSettings, objective: Objective | str = "clm") -> str:
    """The framing of the examples of ``objective`` (or of the objective of that name):
    ``data.framing``, else the objective's (`Objective.framing`); ValueError when neither is set."""
    spec = check_data_task(objective)
    chosen = data.framing or spec.framing
    if not chosen:
        raise ValueError(f"data.framing is unset and objective {spec.name!r} has no usual framing; "
                         "set data.framing='cls_sep' ([CLS] text [SEP], BERT) or 'eos' "
                         "(text </s>, GPT)")
    return chosen


def describe_source(source: SourceSettings, split: str) -> str:
    """How logs and errors name the source of ``split``: ``data.source='…'``, the files of a
    ``files:{split}`` source (`jaxformer.evaluate_run.with_data`), and a held-out validation
    split's origin."""
    spec = source.source
    if spec == "files:{split}":
        return f"files {split!r}"
    held = source.validation_from_train
    if held and split in ("train", "validation"):
        side = "held out from" if split == "validation" else "the rest of"
        return f"data.source={spec!r} ({side} its train split: data.validation_from_train={held})"
    return f"data.source={spec!r}"


def data_line(split: str, examples: int, name: str) -> str:
    """The line a pipeline prints when it starts reading: ``data <split>: <n> examples in <name>``
    (`make_dataset`; `jaxformer.predict` for the texts it decodes)."""
    return f"data {split}: {examples:,} examples in {name}"


def check_train_records(source: SourceSettings, objective: Objective | str = "clm",
                        options: Any = None) -> None:
    """Read every record of the train split once, as the pipeline will, when it comes from the
    user's files (a ``files:`` part of ``data.source``), so that a bad record stops the run before
    its first step, in one line naming its file:line, what is wrong and the fix (`BadRecord`): text
    that is not UTF-8, invalid JSON, a TSV row of another width, a missing field, a label outside
    ``data.label_names``, an extractive-QA answer that is not in its context
    (`jaxformer.data.qa_windows.qa_example`), a seq2seq or SFT pair with an empty target. Found during
    training, the same record would stop the run from inside the data pipeline (after its last
    checkpoint). Built-in corpora and TFDS datasets are not read here (curated, and a TFDS
    dataset may be far larger than a start-up should read). Plain-text files are not read again:
    opening them (`jaxformer.data.builders.user_files.FileSource`) decoded every line.
    ``objective`` (or its name) and its ``options`` (None: the defaults) choose the data task."""
    if "files" not in source_kinds(source.source):
        return
    task = check_data_task(objective, options).data_task
    train = get_source(source, "train", keep=QA_KEYS if task == "qa" else (), task=task)
    train = train.base if isinstance(train, Subset) else train  # held-out examples too
    if (isinstance(train, MappedSource) and isinstance(train.base, FileSource)
            and train.base.fmt == "text"):
        return  # its lines are its texts, each decoded when the files were opened
    for record in read_records(train):
        if task == "qa":
            qa_example(record)
        elif task in ("seq2seq", "sft") and not str(record.get("target", "")).strip():
            raise BadRecord(f"data.source={source.source!r}, record "
                            f"{record.get('id', '')}: its target is empty; give every example a "
                            "target, or remove that line")


def _examples(ds: grain.MapDataset, *, data: DataSettings, tokenizer: Tokenizer, spec: Objective,
              options: Any, transform: Transform | None, lengths: Mapping[str, int],
              num_epochs: int | None, seed: int,
              counters: tuple[TruncationCounter, TruncationCounter],
              block_bins: int = 0) -> grain.IterDataset:
    """This process's shard ``ds`` of a source → shuffled, tokenized, framed and transformed
    examples that fit ``lengths`` (the stages before packing; one per mixture component), or with
    ``block_bins`` the packed rows of pre-tokenized text (`jaxformer.data.block_packing`)."""
    task, special, (counter, after) = spec.data_task, tokenizer.special, counters
    ds = ds.seed(seed)
    if data.shuffle:
        ds = ds.shuffle()
    ds = (SentencePairs(ds, tokenizer, mode=options.sentence_pairs,
                        seq_len=data.seq_len, seed=seed)
          if task == "sentence_pairs" else ds.map(_Tokenize(tokenizer, task))).repeat(num_epochs)
    frame = (QAFeatures(tokenizer, counter, seq_len=data.seq_len, doc_stride=options.doc_stride,
                        max_question_len=options.max_question_len)
             if task == "qa" else _Frame(task, example_framing(data, spec), special,
                                         data.seq_len, data.target_len, data.long_examples == "split",
                                         counter))
    if block_bins:
        return PackedTokenRows(ds, frame.flat_map, seq_len=data.seq_len, num_bins=block_bins,
                               pad_id=max(special.pad_id, 0))
    it = ds.to_iter_dataset(grain.ReadOptions(num_threads=data.read_threads,
                                              prefetch_buffer_size=data.read_buffer))
    it = grain.experimental.FlatMapIterDataset(it, frame)
    if transform is not None:
        it = it.random_map(transform, seed=seed)
        seq2seq_like = task in ("seq2seq", "span_corruption")
        it = it.map(_Finalize(lengths, special.eos_id if seq2seq_like else None, after))
    return it


def make_dataset(data: DataSettings, split: str, tokenizer: Tokenizer, *,
                 seed: int, objective: Objective | str = "clm", options: Any = None,
                 transform: Transform | None = None,
                 process_index: int | None = None, process_count: int | None = None,
                 num_epochs: int | None = None, source: Sequence[Mapping[str, Any]] | None = None,
                 source_name: str | None = None, report: bool = True) -> grain.IterDataset:
    """This process's batches of ``split`` (see the module docstring).

    Args:
      data: ``config.data`` as its section (`DataSettings`).
      split: passed to ``jaxformer.data.sources.get_source`` (unless ``source`` is given).
      tokenizer: the `Tokenizer`.
      seed: shuffling and ``transform`` randomness.
      objective: the objective (`jaxformer.objectives.Objective`; resolved with its options, as a
        run's `TrainSettings.objective_spec`), or its name: its data task, framing and host-side
        transform.
      options: the objective's options (an instance of `Objective.options`, e.g. `MLMOptions`;
        None: those ``objective`` was resolved with, else the defaults): they may choose the data
        task (`Objective.resolve`) and set the transform, sentence pairs and QA windows.
      transform: a host-side ``(example, rng) -> example`` step to use instead of the
        objective's (`Objective.example_transform`), e.g. to try another corruption.
      process_index / process_count: this process's shard (default ``jax.process_index()`` /
        ``jax.process_count()``); batches hold ``batch_size // process_count`` rows.
      num_epochs: None repeats forever (training); an int makes a finite pass whose last batch is
        padded with all-padding rows (segment ids 0) to the full batch size.
      source: a random-access source (``__len__``, ``__getitem__`` → dict) to use instead.
      source_name: what the reports call ``source`` (e.g. ``"--input 'my.txt'"``).
      report: print (process 0) the split's size now, and one line counting the examples cut to
        fit or skipped as empty once an epoch has been read (else when the iterator is closed).

    Returns:
      a `grain.IterDataset` of dicts of numpy arrays; ``iter()`` it for a checkpointable iterator.
    """
    if process_index is None or process_count is None:
        process_index, process_count = jax.process_index(), jax.process_count()
    check_data_config(data, process_count, objective=objective, options=options)
    spec = check_data_task(objective, options)  # resolved: its data task and options
    task, options = spec.data_task, spec.resolved_options
    special = tokenizer.special
    if transform is None:
        transform = spec.example_transform(special, options)
    keep, given = QA_KEYS if task == "qa" else (), source is not None
    if not given:
        source = get_source(data, split, keep=keep, task=task)
        source_name = describe_source(data, split)
        for part in source_parts(data.source):
            if part.startswith("tokens:"):
                check_token_manifest(part.partition(":")[2], tokenizer, task)
    mixed = component_names(data.source) if not given and num_epochs is None else []
    parts = ([get_source(dataclasses.replace(data, source=n), split, keep=keep, task=task)
              for n in mixed] or [source])
    shards = [grain.MapDataset.source(p)[process_index::process_count] for p in parts]
    for part, name, ds in zip(parts, mixed or [source_name], shards):
        if len(ds) == 0:
            fix = ("; give that split more data (data.split_fractions for a files: glob without "
                   "'{split}')" + ("" if split == "train" else
                                   ", or set eval.num_batches=0 to train without evaluation")
                   if len(part) == 0 else "")
            raise ValueError(f"process {process_index} of {process_count} has no examples: split "
                             f"{split!r} of {name or 'the given source'} holds {len(part)}{fix}")
    report = report and process_index == 0
    local = sum(len(ds) for ds in shards)
    if report:
        shard = f" ({local:,} in this process's shard)" if process_count > 1 else ""
        tqdm.write(data_line(split, len(source), source_name or "a given source") + shard)
    counter = TruncationCounter(f"{split}/{task}", local, report=report)
    after = TruncationCounter(f"{split}/{task} after transform", report=report)
    lengths = {"inputs": data.seq_len}
    if task in ("seq2seq", "span_corruption", "preference_seq2seq"):
        lengths["targets"] = data.target_len
    meta = {"sft": ("inputs_loss_mask",), "qa": ("inputs_token_types",),
            "sentence_pairs": ("inputs_token_types",), **PAIR_FEATURES}.get(task, ())
    lengths.update({k: lengths[k.partition("_")[0]] for k in meta})
    examples = functools.partial(
        _examples, data=data, tokenizer=tokenizer, spec=spec, options=options, transform=transform,
        lengths=lengths, num_epochs=num_epochs, counters=(counter, after))
    if mixed:  # each component read, framed and transformed on its own, then drawn by weight
        it = MixedExamples({n: examples(ds, seed=seed + k).map(TagComponent(k))
                            for k, (n, ds) in enumerate(zip(mixed, shards))},
                           dict(mixture_components(data.source)))
        meta, lengths = (*meta, COMPONENT_FEATURE), {**lengths, COMPONENT_FEATURE: data.seq_len}
    pad_id = max(special.pad_id, 0)
    local_batch = data.batch_size // process_count
    bins = data.packing_bins or max(local_batch, 32)
    blocks = (not given and not mixed and data.packing and task == "lm" and transform is None
              and source_kinds(data.source) == ["tokens"])  # pre-tokenized text: in blocks
    if not mixed:
        it = examples(shards[0], seed=seed, block_bins=bins if blocks else 0)
    if data.packing and not blocks:
        it = pack(it, lengths, num_bins=bins, pad_id=pad_id, meta_features=meta)
    elif not data.packing:
        it = it.map(PadToLength(lengths, pad_id=pad_id, meta_features=meta))
    if num_epochs is None:
        it = it.batch(local_batch, drop_remainder=True)
    else:
        it = it.batch(local_batch, batch_fn=functools.partial(
            grain.experimental.batch_and_pad, batch_size=local_batch))
    if data.worker_count > 0:
        if not flags.FLAGS.is_parsed():  # Grain workers read absl flags; outside an absl app
            flags.FLAGS.mark_as_parsed()  # (tests, notebooks) use their defaults
        it = it.mp_prefetch(grain.MultiprocessingOptions(
            num_workers=data.worker_count, per_worker_buffer_size=data.worker_buffer_size))
    elif data.prefetch > 0:
        it = grain.experimental.ThreadPrefetchIterDataset(it, prefetch_buffer_size=data.prefetch)
    return ClosedAtExit(it, on_close=lambda: (counter.close(), after.close()))
