"""One entry point from a data config to a random-access source of examples: `get_source`.

A source has ``__len__`` and ``__getitem__(i) -> dict`` of Python values (Grain's
``RandomAccessDataSource`` protocol) and is picklable for Grain worker processes. Its records
are text, classification or pairs examples (`jaxformer.data.fields`), plus ``"id": str`` where
the source has one (built-in corpora, user files).

``data.source`` selects the source (`SOURCE_KINDS`):

- ``"shakespeare"``, ``"kjv_bible"``, ``"movie_sentiment"``, ``"bible_en_es"``,
  ``"review_snippets"``: built-in corpora (`jaxformer.data.builders`), fetched from package
  registries once per machine.
- ``"<pairs source>:both|source|target|reverse"``, e.g. ``"bible_en_es:both"``: a view of a pair
  corpus: each side as its own text example (both languages for span corruption), one side as
  text, or source and target swapped. ``data.pair_view`` does the same for any pair source.
- ``"tfds:<name>[/<config>][:<version>]"`` (also ``"tfds:<name>:<config>"``): a TFDS catalog
  dataset through `tfds.data_source` (array_record; needs no TensorFlow to read).
- ``"files:<glob>"``: the user's files, ``data.format`` "text" (one example per non-blank
  line), "jsonl" or "tsv" (first row names the columns unless ``data.columns`` does). If the
  glob contains ``{split}`` it is filled with the split name; otherwise every line is assigned to
  train/validation/test by the hash of its id ``<file name>:<line number>``, with
  ``data.split_fractions`` (default 0.9/0.05/0.05).
- ``"concat:<spec>,<spec>,…"``: the sources one after another (same options for each). Records
  keep each source's own fields (``concat:movie_sentiment,review_snippets`` mixes records with
  and without ``label``); text tasks read only ``text``.
- ``"tokens:<dir>"``: a source pre-tokenized by ``jaxformer-tokenize`` (`jaxformer.data.token_shards`):
  records ``{"inputs": int32 [n]}``, the pipeline's tokenize step skipped.
- ``"mix:<spec>@<weight>,<spec>@<weight>,…"``: a weighted mixture (`jaxformer.data.mixture`); read
  here (tokenizer training, record checks, finite passes) it is its components one after another.

Field options (TFDS feature names, JSONL keys, TSV columns): ``text_key`` (default "text"),
``label_key`` (set → classification), ``source_key`` + ``target_key`` (set → pairs),
``label_names`` (maps string labels to their index); unset roles take their usual names
(``sentence``/``label``, ``source``/``target``, ``input``/``output``, … :
`jaxformer.data.fields`). ``validation_from_train`` (any source, e.g. 0.1): the validation
split is that fraction of the train split, chosen by the hash of each example's text
(`jaxformer.data.held_out`), and train is the rest. TFDS options: ``tfds_data_dir``,
``tfds_download`` (default: True unless ``JAXFORMER_OFFLINE`` is set).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import ml_collections

from jaxformer.data import builders
from jaxformer.data.builders import user_files
from jaxformer.data.containers import (
    PAIR_VIEWS,
    ConcatSource,
    MappedSource,
    PairsAsText,
    Subset,
    read_records,
)
from jaxformer.data.fields import Fields, infer_roles
from jaxformer.data.held_out import check_held_out, held_out
from jaxformer.data.mixture import check_mixture
from jaxformer.data.tfds_source import tfds_name, tfds_source
from jaxformer.data.token_shards import read_manifest, token_source
from jaxformer.settings import config_dict, defaults, one_of, section, setting

SOURCE_KINDS = (*builders.BUILDERS, "<pairs>:both|source|target|reverse", "tfds:<name>",
                "files:<glob>", "concat:<a>,<b>", "tokens:<dir>", "mix:<a>@<w>,<b>@<w>")
_BUILTIN_FIELDS = {"shakespeare": ("text", None, None, None),
                   "kjv_bible": ("text", None, None, None),
                   "movie_sentiment": ("text", "label", None, None),
                   "bible_en_es": (None, None, "source", "target"),
                   "review_snippets": ("text", None, None, None)}


@dataclasses.dataclass(frozen=True)
class SourceSettings:
    """The source keys of ``config.data`` (module docstring), declared so that command-line overrides
    such as ``--config.data.format=jsonl`` can set them. None = the source's default."""

    source: str = setting(
        "", "where examples come from: a built-in corpus, 'tfds:<name>', 'files:<glob>' (a '{split}' "
        "in the glob is replaced by train/validation/test), 'concat:<a>,<b>'")
    text_key: str = setting("text", "field holding the text (TFDS feature, JSONL key or TSV column)")
    split_fractions: tuple[float, ...] = setting(
        (0.9, 0.05, 0.05), "files: globs without '{split}': train/validation/test fractions; each "
        "line goes to a split by the hash of its id <file>:<line>")
    validation_from_train: float = setting(
        0.0, "hold out this fraction of the train split as the validation split (e.g. 0.1; 0 = the "
        "source's own), by a hash of each example's text so that duplicates stay on one side")
    pair_view: str | None = setting(
        None, "a pairs source seen as text: 'both', 'source', 'target' or 'reverse'",
        check=one_of(*PAIR_VIEWS))
    format: str | None = setting(
        None, "files: 'text' (one example per non-blank line; blank lines skipped, never joined), "
        "'jsonl' or 'tsv'; unset = from the extension (.txt, .jsonl, .tsv)")
    columns: tuple[str, ...] | None = setting(
        None, "files, TSV without a header row: its column names in order, e.g. "
        "\"--config.data.columns=('text','label')\" (or text,label); unset = the first row names them")
    label_key: str | None = setting(None, "field holding the label (set: classification examples)")
    source_key: str | None = setting(
        None, "field holding the source text (with target_key: pairs for seq2seq)")
    target_key: str | None = setting(
        None, "field holding the target text (with source_key: pairs for seq2seq)")
    label_names: tuple[str, ...] | None = setting(
        None, "string labels in class order, e.g. \"--config.data.label_names=('neg','pos')\" (or "
        "neg,pos); a label's index is its class; sets model.num_classes when unset")
    tfds_data_dir: str | None = setting(None, "TFDS data directory (unset = TFDS's default)")
    tfds_download: bool | None = setting(
        None, "let TFDS download and prepare a dataset (unset = unless JAXFORMER_OFFLINE)")


def default_source_config() -> ml_collections.ConfigDict:
    """The source keys of ``config.data`` (`SourceSettings`), None = the source's default."""
    return config_dict(section(SourceSettings))


def _fields(settings: SourceSettings, where: str, available: Sequence[str] | None = None,
            task: str | None = None) -> Fields:
    """The `Fields` of ``settings``; with the record fields ``available`` known, the roles it
    leaves unset are taken by their conventional names (`jaxformer.data.fields`)."""
    roles = dict(text_key=settings.text_key, label_key=settings.label_key,
                 source_key=settings.source_key, target_key=settings.target_key)
    if available is not None:
        roles = infer_roles(available, task=task, **roles)
    return Fields(**roles, label_names=settings.label_names or None, where=where)


def get_source(settings: SourceSettings, split: str, keep: Sequence[str] = (),
               task: str | None = None, raw_labels: bool = False) -> Sequence[dict[str, Any]]:
    """The random-access source named by ``settings.source`` for ``split``.

    Args:
      settings: the source keys of ``config.data`` (`SourceSettings`, or the whole
        `jaxformer.data.pipeline.DataSettings`); options as in the module docstring.
      split: ``"train"``, ``"validation"`` or ``"test"`` (built-in and TFDS sources also take
        TFDS split expressions such as ``"train[:1%]"``; TFDS datasets use their own names).
      keep: fields of TFDS and file records to pass through besides the schema's (the question and
        answer of extractive QA, `jaxformer.data.qa_windows.QA_KEYS`).
      task: the data task that reads the records (`jaxformer.objectives.Objective.data_task`):
        roles the config leaves unset are found by their usual names for it
        (`jaxformer.data.fields`); None = only the text is read (the tokenizer's).
      raw_labels: keep the labels of files and TFDS records as the data holds them (strings
        included), not mapped to class indices (`label_names_from_data`).

    Raises:
      ValueError: unknown source, bad option, missing field.
      jaxformer.data.fetch.DataUnavailableError: data absent and fetching disabled or failing.
    """
    spec = settings.source
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"data.source must be a non-empty string, one of {SOURCE_KINDS}; "
                         f"got {spec!r}")
    _check_kinds(spec)
    _check_options(settings, spec)
    held = settings.validation_from_train
    if held and split in ("train", "validation"):
        check_held_out(held, spec)
        source = held_out(_from_spec(spec, settings, "train", tuple(keep), task, raw_labels),
                          split, held)
    else:
        source = _from_spec(spec, settings, split, tuple(keep), task, raw_labels)
    return PairsAsText(source, settings.pair_view) if settings.pair_view else source


# The source options only some kinds of source read; a value set for a source that ignores it is
# refused (e.g. data.format=tsv with data.source=shakespeare).
_FIELD_OPTIONS = ("text_key", "label_key", "source_key", "target_key", "label_names")
_KIND_OPTIONS = {"files": ("format", "columns", "split_fractions", *_FIELD_OPTIONS),
                 "tfds": ("tfds_data_dir", "tfds_download", *_FIELD_OPTIONS)}


def source_parts(spec: str) -> list[str]:
    """The sources of ``spec``: the parts of a ``concat:`` or ``mix:`` (weights dropped), else it."""
    kind, _, rest = spec.partition(":")
    if kind not in ("concat", "mix"):
        return [spec]
    parts = [p.strip() for p in rest.split(",") if p.strip()]
    return [p.rpartition("@")[0] or p for p in parts] if kind == "mix" else parts


def source_splits(settings: SourceSettings) -> list[str] | None:
    """The split names ``settings.source`` can be read at (None: not known without opening it, as
    for TFDS): built-in corpora and hash-split files have train/validation/test; a ``{split}``
    glob has those its files name, plus validation when ``validation_from_train`` is set."""
    spec = settings.source
    found: set[str] = set()
    for part in source_parts(spec):
        kind, _, rest = part.strip().partition(":")
        if kind == "tokens":
            found |= set(read_manifest(rest)["splits"])
        elif kind == "files" and "{split}" in rest:
            found |= set(user_files.available_splits(rest))
        elif kind == "files" or kind in builders.BUILDERS:
            found |= set(user_files.SPLITS)
        else:
            return None
    if settings.validation_from_train and "train" in found:
        found.add("validation")
    return sorted(found, key=lambda s: (user_files.SPLITS + (s,)).index(s))


def source_kinds(spec: str) -> list[str]:
    """The kind (the part before ':') of each source of ``spec`` (each part of a concat or mix)."""
    return [p.strip().partition(":")[0] for p in source_parts(spec)]


def _check_kinds(spec: str) -> None:
    """ValueError for a source of unknown kind, before its options are checked (a path given
    without 'files:' would otherwise be refused for its options)."""
    known = {*builders.BUILDERS, "tfds", "files", "concat", "tokens"}
    if spec.startswith("mix:"):
        check_mixture(spec)
    for part in source_parts(spec):
        part = part.strip()
        if part.partition(":")[0] not in known:
            looks_like_path = "/" in part or "." in part or os.path.exists(part)
            hint = f"; for your own files write 'files:{part}'" if looks_like_path else ""
            raise ValueError(f"unknown data.source {part!r}; choose one of {SOURCE_KINDS}{hint}")


def _check_options(settings: SourceSettings, spec: str) -> None:
    """ValueError naming a source option set to other than its default for a source of ``spec``
    that does not read it (`_KIND_OPTIONS`)."""
    kinds = source_kinds(spec)
    used = {key for kind in kinds for key in _KIND_OPTIONS.get(kind, ())}
    default = defaults(SourceSettings)
    for key in sorted({k for keys in _KIND_OPTIONS.values() for k in keys} - used):
        value = getattr(settings, key)
        if value != default[key]:
            users = [f"'{kind}:'" for kind, keys in _KIND_OPTIONS.items() if key in keys]
            raise ValueError(f"data.{key}={value!r} applies to {' and '.join(users)} sources, not "
                             f"data.source={spec!r}; leave it unset")


def _from_spec(spec: str, settings: SourceSettings, split: str, keep: tuple[str, ...] = (),
               task: str | None = None, raw_labels: bool = False) -> Sequence[dict[str, Any]]:
    kind, _, rest = spec.partition(":")
    if kind == "tokens":
        return token_source(rest, split)
    if kind in ("concat", "mix"):
        parts = source_parts(spec)
        if not parts:
            raise ValueError(f"data.source {spec!r}: 'concat:' needs comma-separated sources")
        return ConcatSource([_from_spec(p, settings, split, keep, task, raw_labels)
                             for p in parts])
    if kind == "tfds":
        name = tfds_name(rest)
        base = tfds_source(name, split, data_dir=settings.tfds_data_dir,
                           download=settings.tfds_download)
        features = getattr(getattr(base, "dataset_info", None), "features", None)
        available = None if features is None else list(features.keys())
        fields = dataclasses.replace(_fields(settings, f"TFDS dataset {name!r}", available, task),
                                     keep=keep, raw_labels=raw_labels)
        if available is not None:
            fields.check(available)
        return MappedSource(base, fields)
    if kind == "files":
        base = user_files.FileSource(rest, split, fmt=settings.format,
                                     columns=settings.columns or None,
                                     split_fractions=settings.split_fractions)
        available = (list(base[0]) if len(base) else
                     list(base.columns[0] or ("text",)) if base.columns else None)
        fields = dataclasses.replace(
            _fields(settings, f"files {rest!r}", None if base.fmt == "text" else available, task),
            keep=keep, raw_labels=raw_labels)
        if base.fmt == "text" and fields.schema != "text":
            raise ValueError(f"files {rest!r}: format 'text' holds only text; use 'jsonl' or "
                             f"'tsv' for {fields.schema} data (label_key/source_key set)")
        if len(base):
            header = base.columns[0] if base.fmt == "tsv" and not settings.columns else ()
            fields.check(list(base[0]), fields.columns_hint(header) if header else "")
        return MappedSource(base, fields)
    if kind in builders.BUILDERS:
        text, label, src, tgt = _BUILTIN_FIELDS[kind]
        fields = Fields(text_key=text, label_key=label, source_key=src, target_key=tgt,
                        where=kind)
        source = MappedSource(builders.builtin_source(kind, split), fields)
        if rest:
            if fields.schema != "pairs":
                raise ValueError(f"data.source {spec!r}: views ({PAIR_VIEWS}) apply to pair "
                                 f"corpora such as 'bible_en_es', not {kind!r}")
            return PairsAsText(source, rest)
        return source
    raise ValueError(f"unknown data.source {spec!r}; choose one of {SOURCE_KINDS}")


def label_names_from_data(settings: SourceSettings) -> tuple[str, ...] | None:
    """The distinct labels of the train split, sorted, when they are strings and
    ``data.label_names`` is unset (Hugging Face ``run_glue.py``'s ``label_list``); None when names
    are given, the labels are class indices, or the source is a built-in corpus (integer labels).

    Reads every train example once (``files:`` and ``tfds:`` sources), so a bad record of the train
    split stops the run before its first step, in one line naming its file:line (or record id) and
    value: a label that is not one of the given ``data.label_names``, or not a class index,
    a missing field, text that is not UTF-8, a TSV row with the wrong number of cells. Found
    during training, the same record would stop the run from inside the data pipeline."""
    if not set(source_kinds(settings.source)) & {"files", "tfds"}:
        return None
    named = bool(settings.label_names)
    source = get_source(settings, "train", task="classify", raw_labels=not named)
    source = source.base if isinstance(source, Subset) else source  # held-out examples too
    values = {ex["label"] for ex in read_records(source)}  # named: each is checked (`Fields`)
    if named or all(isinstance(v, int) or (isinstance(v, str) and v.strip().lstrip("-").isdigit())
                    for v in values):
        return None
    return tuple(sorted(str(v) for v in values))


def source_texts(source: Sequence[Mapping[str, Any]]) -> Iterator[str]:
    """Every text of a source, whatever its task (for training the tokenizer)."""
    for ex in read_records(source):
        for key in ("text", "source", "target", "prompt", "response", "question"):
            if key in ex:
                yield ex[key]
