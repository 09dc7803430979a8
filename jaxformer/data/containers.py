"""Random-access sources built from others, and reading one in chunks.

Each has ``__len__`` and ``__getitem__(i) -> dict`` (Grain's ``RandomAccessDataSource``
protocol), ``__getitems__`` where reading many at once is quicker, and is picklable for Grain
worker processes: `MappedSource` (records through a function, e.g. `jaxformer.data.fields.Fields`),
`ConcatSource` (sources one after another), `PairsAsText` (a view of a pairs source as text,
`PAIR_VIEWS`) and `Subset` (the records at some indices).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

PAIR_VIEWS = ("both", "source", "target", "reverse")


def get_many(source: Sequence[Any], indices: Sequence[int]) -> list[Any]:
    """``[source[i] for i in indices]``, in one ``__getitems__`` call where the source has one."""
    if hasattr(source, "__getitems__"):
        return list(source.__getitems__(indices))
    return [source[i] for i in indices]


def read_records(source: Sequence[dict[str, Any]], indices: Sequence[int] | None = None, *,
                 chunk: int = 4096) -> Iterator[dict[str, Any]]:
    """The records of ``source`` at ``indices`` (default: all), in order, read in chunks through
    ``__getitems__`` where the source has it. A TFDS array_record source decodes a batch 2–4×
    quicker than one record at a time (27,781 ``bible_en_es`` pairs: 1.2 s vs 5.0 s). Chunks
    double from 256 up to ``chunk`` records, so a reader that stops early (the tokenizer's first
    ``max_train_texts``) reads at most twice what it takes."""
    indices = range(len(source)) if indices is None else indices
    start, size = 0, min(256, chunk)
    while start < len(indices):
        yield from get_many(source, [int(i) for i in indices[start:start + size]])
        start, size = start + size, min(2 * size, chunk)


class MappedSource:
    """A random-access source whose records pass through a picklable function."""

    def __init__(self, base: Sequence[Any], fn: Any) -> None:
        self.base, self.fn = base, fn

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.fn(self.base[index])

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        return [self.fn(r) for r in get_many(self.base, indices)]

    def __repr__(self) -> str:
        return f"MappedSource({self.base!r}, len={len(self)})"


class ConcatSource:
    """Sources one after another: index ``i`` falls in the first source with ``i < cum_len``."""

    def __init__(self, sources: Sequence[Sequence[dict[str, Any]]]) -> None:
        self.sources = list(sources)
        self.ends = np.cumsum([len(s) for s in self.sources]).tolist()

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for a source of length {len(self)}")
        k = bisect.bisect_right(self.ends, index)
        return self.sources[k][index - (self.ends[k - 1] if k else 0)]


class PairsAsText:
    """A view of a pairs source (`PAIR_VIEWS`): ``both`` = every source then every target
    as ``{"text"}`` (length 2N), ``source``/``target`` = one side as text, ``reverse`` = swapped."""

    def __init__(self, pairs: Sequence[dict[str, Any]], view: str) -> None:
        if view not in PAIR_VIEWS:
            raise ValueError(f"pair view {view!r} is not one of {PAIR_VIEWS}")
        if len(pairs) and not {"source", "target"} <= set(pairs[0]):
            raise ValueError(f"pair view {view!r} needs source/target records, got fields "
                             f"{sorted(pairs[0])}; set data.source_key and data.target_key")
        self.pairs, self.view = pairs, view

    def __len__(self) -> int:
        return len(self.pairs) * (2 if self.view == "both" else 1)

    def __getitem__(self, index: int) -> dict[str, Any]:
        side, n = self.view, len(self.pairs)
        if self.view == "both":
            if not 0 <= index < 2 * n:
                raise IndexError(f"index {index} out of range for a source of length {2 * n}")
            side, index = ("source", index) if index < n else ("target", index - n)
        pair = self.pairs[index]
        out = ({"source": pair["target"], "target": pair["source"]} if side == "reverse"
               else {"text": pair[side]})
        if "id" in pair:
            out["id"] = pair["id"] if side == "reverse" else f"{pair['id']}:{side}"
        return out


class Subset:
    """The records of ``base`` at ``indices`` (a ``[N]`` int64 array), in that order."""

    def __init__(self, base: Sequence[dict[str, Any]], indices: np.ndarray) -> None:
        self.base, self.indices = base, indices

    def __len__(self) -> int:
        return len(self.indices)

    def _base_index(self, index: int) -> int:
        """The base record of this subset's ``index``; IndexError outside ``[0, len)`` (a negative
        index would silently wrap around NumPy's ``indices``)."""
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for a source of length {len(self)}")
        return int(self.indices[index])

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.base[self._base_index(index)]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        return get_many(self.base, [self._base_index(int(i)) for i in indices])

    def __repr__(self) -> str:
        return f"Subset({self.base!r}, len={len(self)})"
