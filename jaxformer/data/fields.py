"""Record → example: which field of a record is the text, the label or the pair, and the mapping.

A source's records (`jaxformer.data.sources.get_source`) follow one of three schemas:

- text:           ``{"text": str}``                    (LM / MLM / span-corruption pretraining)
- classification: ``{"text": str, "label": int}``
- pairs:          ``{"source": str, "target": str}``   (translation, other seq2seq)
- preference:     ``{"prompt": str, "chosen": str, "rejected": str}``   (DPO; TRL's names, read
  for the `PREFERENCE_TASKS`; ``source_key`` / ``target_key`` rename the first two)

plus ``"id": str`` where the source has one (built-in corpora, user files). `Fields` maps a raw
record (a TFDS example, a JSONL object, a TSV row) to its schema, by the roles ``config.data``
names (``text_key``, ``label_key``, ``source_key`` + ``target_key``, ``label_names``).

Conventional field names: a role that ``config.data`` leaves unset (``text_key`` at its default
"text", ``label_key``, ``source_key`` + ``target_key`` unset) takes the first conventional name the
data has, as Hugging Face datasets, GLUE, SQuAD and ``run_translation.py`` name them, so a TSV whose
header (or ``data.columns``) says ``sentence  label`` or ``source  target`` needs no ``*_key``
override (`infer_roles`):

- text:  `TEXT_NAMES` (``context`` is extractive QA's passage; ``question`` stays the question);
- label: `LABEL_NAMES`, read for the ``classify`` data task only (a text task ignores labels, which
  may be strings no ``data.label_names`` maps);
- pairs: the first of `PAIR_NAMES` the data has both of, when it has no text field.

A role stated in ``config.data`` always wins. A role the task needs and the data lacks keeps the
usual name ("label", "source"/"target"), so the "has no field" error names it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from jaxformer.data.builders.user_files import BadRecord

TEXT_NAMES = ("text", "sentence", "context", "content", "document", "review")
LABEL_NAMES = ("label", "labels", "class", "category")
PAIR_NAMES = (("source", "target"), ("input", "output"), ("src", "tgt"), ("prompt", "response"),
              ("question", "answer"))
PAIR_TASKS = ("seq2seq", "sft")
PREFERENCE_NAMES = ("prompt", "chosen", "rejected")
PREFERENCE_TASKS = ("preference", "preference_seq2seq")


def _first(names: Collection[str], candidates: tuple[str, ...]) -> str | None:
    return next((n for n in candidates if n in names), None)


def infer_roles(available: Collection[str], *, text_key: str | None, label_key: str | None,
                source_key: str | None, target_key: str | None, task: str | None = None
                ) -> dict[str, str | None]:
    """The role keys (``text_key``, ``label_key``, ``source_key``, ``target_key``) to read a
    record with the fields ``available``: the stated ones, the unset ones by convention (module
    docstring). ``task``: the data task reading the records (None: only their text is read, e.g.
    to train the tokenizer)."""
    names = set(available)
    if task in PREFERENCE_TASKS:
        return dict(text_key=None, label_key=None, source_key=source_key or PREFERENCE_NAMES[0],
                    target_key=target_key or PREFERENCE_NAMES[1], rejected_key=PREFERENCE_NAMES[2])
    roles = dict(text_key=text_key or "text", label_key=label_key, source_key=source_key,
                 target_key=target_key)
    if source_key or target_key:
        return roles
    if roles["text_key"] == "text" and "text" not in names:  # the default: not a stated key
        roles["text_key"] = _first(names, TEXT_NAMES) or roles["text_key"]
    if roles["text_key"] not in names and task not in ("classify", "qa"):
        pair = next((p for p in PAIR_NAMES if set(p) <= names), None)
        if pair is None and task in PAIR_TASKS:
            pair = PAIR_NAMES[0]  # the error names the usual fields
        if pair is not None:
            roles["source_key"], roles["target_key"] = pair
            return roles
    if task == "classify" and not label_key:
        roles["label_key"] = _first(names, LABEL_NAMES) or LABEL_NAMES[0]
    return roles


def input_field(available: Collection[str], *, text_key: str | None, source_key: str | None,
                task: str | None) -> str:
    """The field holding a model's input text in a record of fields ``available`` (`infer_roles`;
    for a seq2seq run the source side, which an input file may hold without a target)."""
    if task in PAIR_TASKS:
        if source_key:
            return source_key
        return next((p[0] for p in PAIR_NAMES if p[0] in available),
                    _first(available, TEXT_NAMES) or "source")
    return infer_roles(available, text_key=text_key, label_key=None, source_key=None,
                       target_key=None)["text_key"]


def _python(value: Any) -> Any:
    """bytes → str, numpy scalars → int/float; other values (arrays, str, int) unchanged."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.integer | np.bool_):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


@dataclasses.dataclass(frozen=True)
class Fields:
    """Maps a raw record to the text / classification / pairs schema (see module docstring)."""

    text_key: str | None = "text"
    label_key: str | None = None
    source_key: str | None = None
    target_key: str | None = None
    rejected_key: str | None = None  # preference pairs: the rejected response
    label_names: tuple[str, ...] | None = None
    where: str = "source"
    keep: tuple[str, ...] = ()  # other fields passed through as they are (extractive QA's)
    raw_labels: bool = False  # labels as the data holds them, not mapped to a class index

    @property
    def schema(self) -> str:
        if self.rejected_key:
            return "preference"
        if self.source_key and self.target_key:
            return "pairs"
        return "classification" if self.label_key else "text"

    @property
    def keys(self) -> tuple[str, ...]:
        if self.schema == "pairs":
            return (self.source_key, self.target_key)
        if self.schema == "preference":
            return (self.source_key, self.target_key, self.rejected_key)
        return (self.text_key, self.label_key) if self.label_key else (self.text_key,)

    def check(self, available: Sequence[str], hint: str = "", where: str = "",
              error: type[ValueError] = ValueError) -> None:
        """``error`` naming the first field of `keys` missing from ``available`` (and ``hint``) in
        ``where`` (default: the source; a record's id for one record, `BadRecord`)."""
        missing = [k for k in self.keys if k not in available]
        if missing:
            raise error(f"{where or self.where} has no field {missing[0]!r}; its fields are "
                             f"{sorted(available)}. {hint or 'Set'} data.text_key / label_key / "
                             "source_key / target_key to the right names.")

    def columns_hint(self, header: Sequence[str]) -> str:
        """For a TSV whose first row is read as its header: the ``data.columns`` override naming
        its ``len(header)`` columns (a label column guessed as the shortest cell), to use if that
        row is data."""
        names = list(self.keys) + [f"unused{i}" for i in range(len(header) - len(self.keys))]
        if self.schema == "classification" and len(header) == len(self.keys):
            names = [self.text_key] * len(header)
            names[min(range(len(header)), key=lambda i: len(header[i]))] = self.label_key
        return (f"If the file has no header row, name its columns in order with data.columns, "
                f"e.g. \"--config.data.columns=({','.join(map(repr, names[:len(header)]))})\"; "
                "else set")

    def __call__(self, record: Mapping[str, Any]) -> dict[str, Any]:
        where = f"{self.where}, record {_python(record['id'])}" if "id" in record else self.where
        if any(k not in record for k in self.keys):
            self.check(list(record), where=where, error=BadRecord)
        if self.schema == "preference":
            out = {name: self._text(record, key, where) for name, key in zip(PREFERENCE_NAMES,
                                                                             self.keys)}
        elif self.schema == "pairs":
            out = {"source": self._text(record, self.source_key, where),
                   "target": self._text(record, self.target_key, where)}
        else:
            out = {"text": self._text(record, self.text_key, where)}
            if self.label_key:
                value = _python(record[self.label_key])
                out["label"] = value if self.raw_labels else self._label(value, where)
        out.update({k: record[k] for k in self.keep if k in record})
        if "id" in record:
            out["id"] = str(_python(record["id"]))
        return out

    @staticmethod
    def _text(record: Mapping[str, Any], key: str, where: str) -> str:
        value = _python(record[key])
        if not isinstance(value, str):
            raise BadRecord(f"{where}: field {key!r} is {value!r} ({type(value).__name__}), "
                            "not text")
        return value

    def _label(self, value: Any, where: str) -> int:
        if isinstance(value, str) and self.label_names:
            if value not in self.label_names:
                raise BadRecord(f"{where}: label {value!r} is not one of data.label_names="
                                f"{self.label_names}")
            return self.label_names.index(value)
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise BadRecord(f"{where}: label {value!r} is not a class index (an integer); for "
                        "string labels set data.label_names to the list of them (index = label)")
