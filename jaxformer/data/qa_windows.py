"""Extractive question answering examples → BERT features (Devlin et al. 2019 §4.2, SQuAD).

A source record (`qa_example`) holds a ``context``, a ``question`` and the answer as
``answer_text`` + ``answer_start`` (a character offset into the context; without it, ``answer`` or
``answer_text`` is looked up as its first occurrence in the context), or SQuAD's nested
``answers: {"text": [...], "answer_start": [...]}`` (the first answer is used; TFDS ``squad``
records have this form). ``text`` stands in for ``context`` (what ``data.text_key`` maps the
context field to). An empty answer (or ``answer_start`` -1) marks an unanswerable question
(SQuAD 2.0).

Each example becomes one feature per context window (`qa_windows`)::

    inputs             [CLS] question [SEP] context window [SEP]
    inputs_token_types   0      0 …     0        1 …       1
    start_position, end_position   the answer's first and last token in the row, or 0 ([CLS])
                                   when the answer is not wholly inside this window

Contexts longer than a row are split into windows whose starts are ``doc_stride`` context tokens
apart (BERT's ``run_squad.py``: overlapping windows when ``doc_stride`` < the room a row leaves for
the context). Pointing windows without the answer at [CLS] is BERT's SQuAD v1.1 and v2.0 training
recipe; at inference `jaxformer.decode.span.best_answer` takes the best span over all windows.
``offsets`` `[L, 2]` (character offsets into the context; -1 outside it) map tokens back to text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import grain
import numpy as np

from jaxformer.data.builders.user_files import BadRecord
from jaxformer.data.packing import TruncationCounter
from jaxformer.data.tokenizer import Tokenizer

# Source fields the QA task needs besides the context (``data.text_key``), passed through as they
# are by `jaxformer.data.sources.get_source`.
QA_KEYS = ("question", "answer_text", "answer_start", "answers", "answer")
FEATURE_KEYS = ("inputs", "inputs_token_types", "start_position", "end_position")


def _plain(value: Any) -> Any:
    """bytes → str, NumPy scalars and arrays → Python values (TFDS records hold them)."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()] if value.ndim else _plain(value[()])
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.generic):
        return value.item()
    return value


def qa_example(record: Mapping[str, Any]) -> dict:
    """A source record → ``{"context", "question", "answer_text", "answer_start", "id"}``
    (``answer_start`` -1 and ``answer_text`` "" when unanswerable); `BadRecord` (a ValueError)
    naming the record when a field is missing or the answer is not at ``answer_start`` in the
    context."""
    where = f"QA record {record.get('id', '')!s}".rstrip()
    context = _plain(record.get("context", record.get("text")))
    question = _plain(record.get("question"))
    if not isinstance(context, str) or not isinstance(question, str):
        raise BadRecord(f"{where}: needs string fields 'context' (or data.text_key) and "
                         f"'question'; got fields {sorted(record)}")
    if "answers" in record:
        answers = {k: _plain(v) for k, v in dict(record["answers"]).items()}
        texts, starts = answers.get("text", []), answers.get("answer_start", [])
        text, start = (texts[0], starts[0]) if len(texts) and len(starts) else ("", -1)
    elif "answer_text" in record and "answer_start" in record:
        text, start = _plain(record["answer_text"]), _plain(record["answer_start"])
    elif "answer" in record or "answer_text" in record:  # no offset: the first occurrence
        text = _plain(record.get("answer_text", record.get("answer")))
        start = context.find(text) if text else -1
        if text and start < 0:
            raise BadRecord(f"{where}: answer {text!r} does not occur in the context; give "
                             "'answer_start' (empty answer = unanswerable)")
    else:
        raise BadRecord(f"{where}: needs 'answer_text' (or 'answer') and 'answer_start', or "
                         "SQuAD's 'answers' {'text': [...], 'answer_start': [...]}; got fields "
                         f"{sorted(record)}")
    try:
        start = int(start)
    except (TypeError, ValueError):
        raise BadRecord(f"{where}: answer_start={start!r} is not an integer") from None
    if not text or start < 0:
        text, start = "", -1
    elif context[start:start + len(text)] != text:
        raise BadRecord(f"{where}: answer_text {text!r} is not at answer_start={start} of the "
                         f"context (found {context[start:start + len(text)]!r})")
    return {"context": context, "question": question, "answer_text": text,
            "answer_start": start, "id": str(record.get("id", ""))}


def answer_token_span(offsets: np.ndarray, start: int, end: int) -> tuple[int, int] | None:
    """First and last token (indices into ``offsets`` `[n, 2]`) overlapping characters
    ``[start, end)``, or None when no (non-empty) token does."""
    hit = np.flatnonzero((offsets[:, 0] < end) & (offsets[:, 1] > start)
                         & (offsets[:, 1] > offsets[:, 0]))
    return (int(hit[0]), int(hit[-1])) if len(hit) else None


def qa_windows(example: Mapping[str, Any], tokenizer: Tokenizer, *, seq_len: int,
               doc_stride: int, max_question_len: int) -> tuple[list[dict], int]:
    """The features of one `qa_example` (see the module docstring) and the question tokens cut.

    Each feature: ``inputs``, ``inputs_token_types``, ``offsets`` `[n, 2]` (``n`` ≤ ``seq_len``),
    ``start_position``, ``end_position`` (int32 scalars). Every context token lies in at least one
    window; consecutive windows start ``doc_stride`` context tokens apart.
    """
    special = tokenizer.special
    if min(special.cls_id, special.sep_id) < 0:
        raise ValueError(f"extractive QA frames rows as [CLS] question [SEP] context [SEP]; the "
                         f"tokenizer lacks [CLS] or [SEP] ({special})")
    check_lengths(seq_len, doc_stride, max_question_len)
    question = tokenizer.encode(example["question"])
    cut = max(len(question) - max_question_len, 0)
    question = question[:max_question_len]
    ids, offsets = tokenizer.encode_with_offsets(example["context"])
    answer = None
    if example["answer_start"] >= 0:
        a = example["answer_start"]
        answer = answer_token_span(offsets, a, a + len(example["answer_text"]))
    head = [special.cls_id, *question, special.sep_id]
    room = seq_len - len(head) - 1
    features, begin = [], 0
    while True:
        end = min(begin + room, len(ids))
        inside = answer is not None and begin <= answer[0] and answer[1] < end
        shift = len(head) - begin
        features.append({
            "inputs": np.asarray([*head, *ids[begin:end], special.sep_id], np.int32),
            "inputs_token_types": np.asarray([0] * len(head) + [1] * (end - begin + 1), np.int32),
            "offsets": np.concatenate([np.full((len(head), 2), -1, np.int32), offsets[begin:end],
                                       np.full((1, 2), -1, np.int32)]),
            "start_position": np.int32(answer[0] + shift if inside else 0),
            "end_position": np.int32(answer[1] + shift if inside else 0)})
        if end >= len(ids):
            return features, cut
        begin += doc_stride


def check_lengths(seq_len: int, doc_stride: int, max_question_len: int) -> None:
    """ValueError unless a row leaves room for context and the windows advance."""
    if max_question_len < 1 or seq_len - max_question_len - 3 < 1:
        raise ValueError(f"data.seq_len={seq_len} leaves no room for context after "
                         f"objective.max_question_len={max_question_len} and [CLS]/[SEP]/[SEP]; "
                         f"raise seq_len above {max_question_len + 3} or lower max_question_len")
    if not 1 <= doc_stride <= seq_len - max_question_len - 3:
        raise ValueError(f"objective.doc_stride={doc_stride} must be in [1, "
                         f"{seq_len - max_question_len - 3}] (the context room of a row with "
                         f"data.seq_len={seq_len} and max_question_len={max_question_len}), so "
                         "that windows cover every context token")


class QAFeatures(grain.experimental.FlatMapTransform):
    """Pipeline step: a source record → its training features (`qa_windows` less ``offsets``);
    question tokens cut to ``max_question_len`` are counted."""

    max_fan_out = 1  # only used by MapDataset flat maps; FlatMapIterDataset has no limit

    def __init__(self, tokenizer: Tokenizer, counter: TruncationCounter, **lengths: int):
        check_lengths(**lengths)
        self.tokenizer, self.counter, self.lengths = tokenizer, counter, lengths

    def flat_map(self, record):
        features, cut = qa_windows(qa_example(record), self.tokenizer, **self.lengths)
        self.counter.record(cut)
        return [{k: f[k] for k in FEATURE_KEYS} for f in features]
