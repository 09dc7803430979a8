"""Pre-tokenized text packed in blocks: the rows of Grain's first-fit packing, byte for byte, without
Grain's per-example stages.

With the tokenizer gone (`jaxformer.data.token_shards`), what is left of the input path's time is
Grain's per-example machinery (an iterator stage per step, with statistics and tracing, and
`FirstFitPackIterDataset` placing one example at a time with NumPy over its bins: ~1.5 s per million
tokens here, docs/data.md). `PackedTokenRows` reads the shuffled examples of a
``grain.MapDataset`` in blocks (``_getitems``: one ArrayRecord ``__getitems__`` call per block),
frames each (the pipeline's own framing step) and packs first fit over the pieces' lengths in plain
Python, building each finished row once. It gives the rows `jaxformer.data.packing.pack` gives for
the same stream (Grain's algorithm, Johnson 1973: each piece into the first row it fits; when it
fits none, the buffer's rows are emitted in order and a new buffer starts with it; a finite stream
ends with its partial buffer), checked byte-equal (`tests/test_token_shards.py`). Its iterator state
is the buffer's first example and piece and the rows already emitted, so a restore rebuilds the
buffer and goes on bit for bit.

The pipeline uses it for the ``lm`` data task (``clm``, ``mlm``: no host-side transform) on a
``tokens:`` source with packing on.
"""

from __future__ import annotations

from collections.abc import Callable

import grain
import numpy as np

BLOCK = 256  # examples read per call


class PackedTokenRows(grain.IterDataset):
    """Rows ``{inputs, inputs_segment_ids, inputs_positions}`` (int32 ``[seq_len]``) of the framed
    examples of ``examples`` (a MapDataset of ``{"inputs": ids}``), ``frame(example) -> pieces``,
    packed first fit into buffers of ``num_bins`` rows."""

    def __init__(self, examples: grain.MapDataset, frame: Callable[[dict], list[dict]], *,
                 seq_len: int, num_bins: int, pad_id: int):
        super().__init__(examples)
        self.examples, self.frame = examples, frame
        self.seq_len, self.num_bins, self.pad_id = seq_len, num_bins, pad_id

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """The examples at ``sl`` only (what Grain's worker processes each read, as its
        ``PrefetchIterDataset`` does; ``sequential_slice`` is read as a strided slice too)."""
        self.examples = self.examples.slice(sl)
        self._parents = (self.examples,)

    def __iter__(self) -> grain.DatasetIterator:
        return _RowsIterator(self)


class _RowsIterator(grain.DatasetIterator):
    def __init__(self, spec: PackedTokenRows):
        super().__init__()
        self.spec = spec
        self.start = (0, 0)  # (example, piece) that begins the current buffer
        self.rows: list[dict] = []  # the current buffer's rows, once packed
        self.next_row = 0
        self.after = (0, 0)  # (example, piece) that begins the next buffer
        self.block: tuple[int, list] = (0, [])  # examples read ahead: (first index, examples)
        self.framed: tuple[int, list] = (-1, [])  # the last example framed: (index, its pieces)
        self.arange = np.arange(spec.seq_len, dtype=np.int32)

    def _example(self, i: int) -> dict | None:
        first, got = self.block
        if not first <= i < first + len(got):
            n = len(self.spec.examples)
            if i >= n:
                return None
            got = self.spec.examples._getitems(list(range(i, min(i + BLOCK, n))))  # noqa: SLF001
            self.block = first, got = i, list(got)
        return got[i - first]

    def _pack(self) -> None:
        """Pack the buffer that begins at ``self.start``."""
        L, bins = self.spec.seq_len, self.spec.num_bins
        free: list[int] = []
        members: list[list[np.ndarray]] = []
        i, skip = self.start
        while True:
            ex = self._example(i)
            if ex is None:
                self.after = (i, 0)
                break
            if self.framed[0] != i:  # an example straddling two buffers is framed (counted) once
                self.framed = i, [p["inputs"] for p in self.spec.frame(ex)]
            pieces = self.framed[1][skip:]
            full = False
            for k, piece in enumerate(pieces):
                n = len(piece)
                row = next((r for r, f in enumerate(free) if f >= n), None)
                if row is None and len(free) < bins:
                    free.append(L)
                    members.append([])
                    row = len(free) - 1
                if row is None:  # fits nowhere: this buffer is done; the piece begins the next
                    self.after, full = (i, skip + k), True
                    break
                free[row] -= n
                members[row].append(piece)
            if full:
                break
            i, skip = i + 1, 0
        self.rows = [self._row(m) for m in members]

    def _row(self, pieces: list[np.ndarray]) -> dict:
        L = self.spec.seq_len
        inputs = np.full(L, self.spec.pad_id, np.int32)
        seg, pos, at = np.zeros(L, np.int32), np.zeros(L, np.int32), 0
        for k, piece in enumerate(pieces, 1):
            n = len(piece)
            inputs[at:at + n], seg[at:at + n], pos[at:at + n] = piece, k, self.arange[:n]
            at += n
        return {"inputs": inputs, "inputs_segment_ids": seg, "inputs_positions": pos}

    def __next__(self) -> dict:
        if self.next_row >= len(self.rows):
            if self.rows:  # the buffer is spent: the next one
                self.start, self.rows, self.next_row = self.after, [], 0
            self._pack()
            if not self.rows:
                raise StopIteration
        row = self.rows[self.next_row]
        self.next_row += 1
        return row

    def get_state(self) -> dict:
        return {"example": self.start[0], "piece": self.start[1], "next_row": self.next_row}

    def set_state(self, state: dict) -> None:
        self.start, self.rows = (state["example"], state["piece"]), []
        self._pack()
        self.next_row = state["next_row"]
