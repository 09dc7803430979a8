"""Conventional field names: which field of a user's data holds the text, the label or the pair.

A role that ``config.data`` leaves unset (``text_key`` at its default "text", ``label_key``,
``source_key`` + ``target_key`` unset) takes the first conventional name the data has, as Hugging
Face datasets, GLUE, SQuAD and ``run_translation.py`` name them, so a TSV whose header (or
``data.columns``) says ``sentence  label`` or ``source  target`` needs no ``*_key`` override:

- text:  `TEXT_NAMES` (``context`` is extractive QA's passage; ``question`` stays the question);
- label: `LABEL_NAMES`, read for the ``classify`` data task only (a text task ignores labels, which
  may be strings no ``data.label_names`` maps);
- pairs: the first of `PAIR_NAMES` the data has both of, when it has no text field.

A role stated in ``config.data`` always wins. A role the task needs and the data lacks keeps the
usual name ("label", "source"/"target"), so the "has no field" error names it.
"""

from __future__ import annotations

from collections.abc import Collection

TEXT_NAMES = ("text", "sentence", "context", "content", "document", "review")
LABEL_NAMES = ("label", "labels", "class", "category")
PAIR_NAMES = (("source", "target"), ("input", "output"), ("src", "tgt"), ("prompt", "response"),
              ("question", "answer"))
PAIR_TASKS = ("seq2seq", "sft")


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
