"""Sentence-pair rows for next-sentence prediction (BERT, Devlin et al. 2019, §3.1 Task #2) and
sentence-order prediction (ALBERT, Lan et al. 2019, §4.1): the ``sentence_pairs`` data task
(``objective.sentence_pairs="nsp"|"sop"`` of the ``mlm`` objective).

Documents and segments. A *document* is one source example (a ``text``: a Shakespeare paragraph,
i.e. a speech, the Sonnets' sonnets; a KJV verse; a movie-review sentence; a line or JSONL record
of the user's files). Its *segments* are its non-blank lines, or, for a one-line text, its
sentences (split after ``.``, ``!`` or ``?`` followed by whitespace) — `text_segments`. Each
segment is tokenized on its own; documents with fewer than two segments give no pair (counted as
skipped in the first-epoch summary).

Pairs, as BERT's ``create_pretraining_data.py`` builds them: consecutive segments are gathered
into a chunk until it holds ``seq_len - 3`` tokens and at least two segments (BERT closes a chunk
at the length alone; a long segment would then make a chunk without a pair), or the document
ends; a chunk of at least two segments is cut at a uniform point ``1 ≤ a_end < len(chunk)``
into A = its first ``a_end`` segments and B = the rest, so A and B are adjacent stretches of the
document. Then

* ``"sop"``: A and B are swapped with probability 0.5 — ``nsp_label`` 1 = swapped, 0 = in order;
* ``"nsp"``: with probability 0.5 B is replaced by segments of another document of the dataset
  (uniform, never the same one; from a uniform segment on, up to the tokens A leaves) —
  ``nsp_label`` 1 = NotNext, 0 = IsNext (BERT's convention); the unused segments of the chunk start
  the next chunk, as in BERT.

A pair longer than ``seq_len - 3`` is cut from its longer side (BERT's ``truncate_seq_pair``), in
document order (before SOP's swap): the earlier stretch from its start, the later one from its
end, so the junction the label is about stays intact. Rows are
``[CLS] A [SEP] B [SEP]`` with ``inputs_token_types`` 0 on ``[CLS] A [SEP]`` and 1 on ``B [SEP]``,
one pair per row (never packed). Everything is a function of the data seed and the example's
index in the (shuffled, repeated) dataset, so it is deterministic, differs per epoch and needs no
iterator state beyond Grain's own (checkpointable).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import grain
import numpy as np

from jaxformer.data.packing import TruncationCounter
from jaxformer.data.tokenizer import Tokenizer
from jaxformer.vocab import SpecialTokens

PAIR_MODES = ("nsp", "sop")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def text_segments(text: str) -> list[str]:
    """A document's segments: its non-blank lines (stripped), or a one-line text's sentences."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) != 1:
        return lines
    return [s for s in _SENTENCE_END.split(lines[0]) if s]


def truncate_pair(a: np.ndarray, b: np.ndarray, max_tokens: int
                  ) -> tuple[np.ndarray, np.ndarray, int]:
    """``(a', b', tokens cut)`` with ``len(a') + len(b') ≤ max_tokens``: the longer side loses a
    token until the pair fits (ties: B; BERT's ``truncate_seq_pair``), A from its start, B from its
    end."""
    excess = len(a) + len(b) - max_tokens
    if excess <= 0:
        return a, b, 0
    keep_a = min(len(a), max(-(-max_tokens // 2), max_tokens - len(b)))
    return a[len(a) - keep_a:], b[:max_tokens - keep_a], excess


def document_pairs(segments: Sequence[np.ndarray], rng: np.random.Generator, *, mode: str,
                   max_tokens: int, other: Callable[[int], np.ndarray | None] | None = None
                   ) -> list[tuple[np.ndarray, np.ndarray, int, int]]:
    """``(A, B, label, tokens cut)`` for every chunk of one document's token ``segments`` (module
    docstring). ``other(n)`` (NSP) gives about ``n`` tokens of another document (None if it finds
    none; the pair is then skipped)."""
    pairs, chunk, length, i = [], [], 0, 0
    while i < len(segments):
        chunk.append(segments[i])
        length += len(segments[i])
        if i == len(segments) - 1 or (length >= max_tokens and len(chunk) >= 2):
            if len(chunk) >= 2:
                a_end = int(rng.integers(1, len(chunk)))
                a, b, label = np.concatenate(chunk[:a_end]), np.concatenate(chunk[a_end:]), 0
                if mode == "nsp" and rng.random() < 0.5:
                    b, label = other(max_tokens - len(a)), 1
                    i -= len(chunk) - a_end  # BERT: the unused segments start the next chunk
                if b is not None and len(b):
                    a, b, cut = truncate_pair(a, b, max_tokens)  # in document order
                    if mode == "sop" and rng.random() < 0.5:
                        a, b, label = b, a, 1
                    pairs.append((a, b, label, cut))
            chunk, length = [], 0
        i += 1
    return pairs


def pair_row(a: np.ndarray, b: np.ndarray, label: int, special: SpecialTokens) -> dict:
    """``{inputs, inputs_token_types, nsp_label, nsp_weight}`` of ``[CLS] a [SEP] b [SEP]``
    (``nsp_weight`` 1; 0 on the all-padding rows that pad a finite pass's last batch)."""
    inputs = np.concatenate([[special.cls_id], a, [special.sep_id], b, [special.sep_id]])
    types = np.concatenate([np.zeros(len(a) + 2), np.ones(len(b) + 1)])
    return {"inputs": inputs.astype(np.int32), "inputs_token_types": types.astype(np.int32),
            "nsp_label": np.int32(label), "nsp_weight": np.int32(1)}


class SentencePairs(grain.MapDataset):
    """A dataset of source examples → per example ``{"rows": [pair_row, …], "cut": tokens cut}``
    (module docstring). Index ``i`` of epoch ``e = i // len`` draws NSP's other document among the
    indices of the same epoch, so the parent's per-epoch shuffle holds."""

    def __init__(self, parent: grain.MapDataset, tokenizer: Tokenizer, *, mode: str,
                 seq_len: int, seed: int):
        super().__init__(parent)
        if mode not in PAIR_MODES:
            raise ValueError(f"objective.sentence_pairs={mode!r}: the sentence_pairs data task "
                             f"builds one of {PAIR_MODES}")
        if mode == "nsp" and len(parent) < 2:
            raise ValueError("objective.sentence_pairs='nsp' needs at least two documents (B of a "
                             f"NotNext pair comes from another one); this split has {len(parent)}")
        self.tokenizer, self.mode, self.seq_len, self.seed = tokenizer, mode, seq_len, seed

    def __len__(self) -> int:
        return len(self._parent)

    def __str__(self) -> str:
        return f"SentencePairs(mode={self.mode!r}, seq_len={self.seq_len})"

    def _segments(self, index: int) -> list[np.ndarray]:
        example = self._parent[index]
        if "text" not in example:
            raise ValueError(f"the sentence_pairs data task needs text examples (key 'text'); got "
                             f"{sorted(example)}; set data.text_key to the field holding the text")
        ids = (np.asarray(self.tokenizer.encode(s), np.int32) for s in text_segments(example["text"]))
        return [x for x in ids if len(x)]

    def _other(self, index: int, rng: np.random.Generator, num_tokens: int) -> np.ndarray | None:
        n = len(self)
        for _ in range(8):  # documents without a segment (empty texts) are passed over
            j = (index // n) * n + (index % n + 1 + int(rng.integers(n - 1))) % n
            segments = self._segments(j)
            if segments:
                start = int(rng.integers(len(segments)))
                out, total = [], 0
                for s in segments[start:]:
                    out.append(s)
                    total += len(s)
                    if total >= num_tokens:
                        break
                return np.concatenate(out)
        return None

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        rng = np.random.default_rng([self.seed % 2 ** 32, index])
        pairs = document_pairs(self._segments(index), rng, mode=self.mode,
                               max_tokens=self.seq_len - 3,
                               other=lambda num_tokens: self._other(index, rng, num_tokens))
        special = self.tokenizer.special
        return {"rows": [pair_row(a, b, label, special) for a, b, label, _ in pairs],
                "cut": sum(p[3] for p in pairs)}


def pair_rows(element: dict, counter: TruncationCounter) -> list[dict]:
    """A `SentencePairs` element's rows, counted: a document without a pair as skipped, one with
    cut pairs as truncated."""
    if element["rows"]:
        counter.record(element["cut"])
    else:
        counter.record_empty()
    return element["rows"]


def check_pair_data(framing: str, packing: bool) -> None:
    """ValueError naming ``data.framing`` / ``data.packing`` when they do not fit pair rows."""
    if framing != "cls_sep":
        raise ValueError(f"data.framing={framing!r} does not fit objective.sentence_pairs: its rows "
                         "are [CLS] A [SEP] B [SEP]; set data.framing='cls_sep' (or leave it unset)")
    if packing:
        raise ValueError("data.packing=True does not fit objective.sentence_pairs: a row holds one "
                         "pair (one pair label); set data.packing=False")
