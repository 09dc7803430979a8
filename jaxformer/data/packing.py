"""Fixed-length rows from variable-length examples: first-fit packing or padding.

An example is a dict of 1-D int arrays (``inputs``, optionally ``targets``, ``inputs_loss_mask``)
plus optional scalars (``label``). A row of length ``L`` holding examples ``e1, e2, …`` is

    inputs              [e1 tokens | e2 tokens | … | pad …]            pad = ``pad_id``
    inputs_segment_ids  [1 1 … 1   | 2 2 … 2   | … | 0 …]              0 = padding
    inputs_positions    [0 1 … n1-1| 0 1 … n2-1| … | 0 …]              restart per segment

and the same for ``targets`` with *aligned* segment ids (segment ``k`` of the targets belongs to
segment ``k`` of the inputs). Packing is Grain's `FirstFitPackIterDataset` (first-fit bin packing,
Johnson 1973, over a buffer of ``num_bins`` rows: each example goes into the first row where *every*
feature fits; when one fits nowhere, all rows are emitted in order and a new buffer starts). It is
deterministic and checkpointable (its state is its parent's state plus the next row to emit).

Examples must already fit (Grain raises otherwise): the pipeline truncates over-long examples
first and counts them with `TruncationCounter`, which reports them in one line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import grain
import numpy as np
from tqdm.auto import tqdm


class TruncationCounter:
    """Counts the examples read, those cut to fit the row length and the empty ones skipped, and
    reports them in one line, once (not a warning per example breaking up a progress bar): when
    ``epoch_size`` examples have been read (one epoch), else at `close` if any was cut or skipped.

    One counter per pipeline (per process; each Grain worker process counts its own).
    """

    def __init__(self, name: str, epoch_size: int | None = None, *, report: bool = True):
        self.name, self.epoch_size, self.report = name, epoch_size, report
        self.seen = 0
        self.truncated = 0
        self.tokens_cut = 0
        self.empty = 0
        self.reported = False

    def record_empty(self) -> None:
        """Record one example skipped because it holds no tokens."""
        self.empty += 1
        self._count()

    def record(self, tokens_cut: int) -> None:
        """Record one example; ``tokens_cut`` > 0 means it was truncated by that many tokens."""
        if tokens_cut > 0:
            self.truncated += 1
            self.tokens_cut += int(tokens_cut)
        self._count()

    def _count(self) -> None:
        self.seen += 1
        if self.seen == self.epoch_size:
            self._print()

    def summary(self) -> str:
        """``data <name>: read all N examples (one epoch); T truncated to fit the row length (C
        tokens cut); E empty skipped``; before the epoch ends ``N examples; of the first n read,
        T truncated …`` (the split's size stated, so the probe of one batch does not read as the
        split's size), or ``read n examples so far; …`` when N is unknown."""
        whole = self.epoch_size is not None and self.seen >= self.epoch_size
        if whole:
            read = f"read all {self.seen:,} examples (one epoch);"
        elif self.epoch_size is not None:
            read = f"{self.epoch_size:,} examples; of the first {self.seen:,} read,"
        else:
            read = f"read {self.seen:,} examples so far;"
        return (f"data {self.name}: {read} {self.truncated:,} truncated to fit the row length "
                f"({self.tokens_cut:,} tokens cut); {self.empty:,} empty skipped")

    def close(self) -> None:
        """Report now, unless reported already or nothing was cut or skipped."""
        if self.truncated or self.empty:
            self._print()

    def _print(self) -> None:
        if self.report and not self.reported:
            self.reported = True
            tqdm.write(self.summary())  # above a progress bar, not through it


def _check_lengths(example: Mapping, lengths: Mapping[str, int]) -> None:
    for k, n in lengths.items():
        if k not in example:
            raise ValueError(f"example has no feature {k!r} to pack; it has {sorted(example)}")
        if len(example[k]) > n:
            raise ValueError(f"feature {k!r} has {len(example[k])} tokens, more than the row "
                             f"length {n}; truncate before packing/padding")


def pad_example(example: Mapping, lengths: Mapping[str, int], *, pad_id: int = 0,
                meta_features: Sequence[str] = ()) -> dict:
    """No-packing mode: one example per row, padded to ``lengths``.

    Adds ``{k}_segment_ids`` (1 on tokens, 0 on padding) and ``{k}_positions`` (``0..n-1``, then 0)
    for every feature ``k`` in ``lengths`` except ``meta_features`` (padded with 0). Other keys
    (e.g. a scalar ``label``) pass through.
    """
    _check_lengths(example, lengths)
    out = dict(example)
    for k, n in lengths.items():
        x = np.asarray(example[k])
        m = len(x)
        fill = 0 if k in meta_features else pad_id
        out[k] = np.concatenate([x, np.full(n - m, fill, x.dtype)])
        if k not in meta_features:
            out[f"{k}_segment_ids"] = (np.arange(n) < m).astype(np.int32)
            out[f"{k}_positions"] = np.where(np.arange(n) < m, np.arange(n), 0).astype(np.int32)
    return out


class PadToLength(grain.transforms.Map):
    """Grain map step applying `pad_example`."""

    def __init__(self, lengths: Mapping[str, int], *, pad_id: int = 0,
                 meta_features: Sequence[str] = ()):
        self.lengths = dict(lengths)
        self.pad_id = pad_id
        self.meta_features = tuple(meta_features)

    def map(self, element):
        return pad_example(element, self.lengths, pad_id=self.pad_id,
                           meta_features=self.meta_features)


def pack(ds: grain.IterDataset, lengths: Mapping[str, int], *, num_bins: int, pad_id: int = 0,
         meta_features: Sequence[str] = ()) -> grain.IterDataset:
    """First-fit pack a stream of examples into rows of ``lengths`` (see module docstring).

    Args:
      ds: examples, dicts with 1-D arrays for every key of ``lengths``; other keys are dropped.
      lengths: row length per feature, e.g. ``{"inputs": 512, "targets": 114}``.
      num_bins: rows packed at once (more rows: less padding, more look-ahead).
      pad_id: value of padding tokens.
      meta_features: keys of ``lengths`` packed alongside (e.g. ``inputs_loss_mask``, padded with
        0) that get no ``_segment_ids`` / ``_positions`` of their own.

    Returns:
      rows: ``{k: [L_k]}`` plus ``{k}_segment_ids`` and ``{k}_positions`` `[L_k]` int32.
    """
    if num_bins <= 0:
        raise ValueError(f"num_bins={num_bins} is invalid: must be a positive integer")
    meta = tuple(meta_features)
    padding = {k: (0 if k in meta else pad_id) for k in lengths}
    return grain.experimental.FirstFitPackIterDataset(
        ds, length_struct=dict(lengths), num_packing_bins=num_bins, shuffle_bins=False,
        meta_features=meta, padding_struct=padding)


def unpack_row(row: Mapping[str, np.ndarray], feature: str) -> list[np.ndarray]:
    """Inverse of packing for one row: the tokens of each segment of ``feature``, in order."""
    seg = np.asarray(row[f"{feature}_segment_ids"])
    x = np.asarray(row[feature])
    return [x[seg == s] for s in np.unique(seg[seg > 0])]
