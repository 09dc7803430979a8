"""A validation split held out from a train split by the hash of each example's text.

``data.validation_from_train`` (e.g. 0.1): the validation split is that fraction of the train
split (`held_out`), and train is the rest; equal texts fall on the same side. The mask is cached
per files read (their sizes and modification times), so an evaluation that reopens its split does
not hash every train text again.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxformer.data import builders
from jaxformer.data.builders import user_files
from jaxformer.data.containers import MappedSource, Subset, read_records


def check_held_out(fraction: Any, spec: str = "") -> None:
    """ValueError unless ``data.validation_from_train`` is a fraction in [0, 1) that ``spec`` can
    use (a ``files:`` glob without ``{split}`` holds out validation by ``data.split_fractions``)."""
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 <= fraction < 1:
        raise ValueError(f"data.validation_from_train={fraction!r} must be a fraction in [0, 1), "
                         "e.g. 0.1 (0 = the source's own validation split)")
    hashed = [p for p in spec.removeprefix("concat:").split(",")
              if p.strip().startswith("files:") and "{split}" not in p]
    if fraction and "tokens:" in spec:
        raise ValueError(f"data.validation_from_train={fraction} cannot hold out texts of "
                         f"pre-tokenized data.source={spec!r}: tokenize with it set instead "
                         "(the shards then hold that validation split); leave it at 0")
    if fraction and hashed:
        raise ValueError(f"data.validation_from_train={fraction} applies to sources with a train "
                         f"split of their own; {hashed[0].strip()!r} has no '{{split}}', so its "
                         "lines are already split by hash with data.split_fractions; leave "
                         "data.validation_from_train at 0")


def held_out(train: Sequence[dict[str, Any]], split: str, fraction: float) -> Subset:
    """The ``"train"`` or ``"validation"`` part of ``train`` when ``fraction`` of it is held out
    for validation: each example goes by `jaxformer.data.builders.hash_split` of its text
    (``text``, else ``source``), so equal texts (a corpus's repeated questions) fall on the same
    side, whatever the order or the number of the lines."""
    held = _held_out_mask(train, fraction)
    return Subset(train, np.flatnonzero(held if split == "validation" else ~held))


# (files read, fields, fraction) → the held-out mask: each evaluation reopens its split, and
# hashing every train text again would cost ~20 µs an example each time
_HELD_OUT_MASKS: dict[Any, np.ndarray] = {}


def _held_out_mask(train: Sequence[dict[str, Any]], fraction: float) -> np.ndarray:
    """``[N]`` bool: which examples of ``train`` are held out for validation."""
    key = _fingerprint(train, fraction)
    if key is not None and key in _HELD_OUT_MASKS:
        return _HELD_OUT_MASKS[key]
    fractions = (1.0 - fraction, fraction, 0.0)
    mask = np.array([builders.hash_split(_text_of(ex), fractions) == "validation"
                     for ex in read_records(train)], dtype=bool)
    if key is not None:
        _HELD_OUT_MASKS[key] = mask
    return mask


def _fingerprint(source: Sequence[dict[str, Any]], fraction: float) -> Any:
    """A key that changes whenever the examples of a ``files:`` source may (its files' sizes and
    modification times, its format, columns and fields); None for other sources (not cached)."""
    base = getattr(source, "base", None)
    if not isinstance(source, MappedSource) or not isinstance(base, user_files.FileSource):
        return None
    stats = tuple((p, os.stat(p).st_size, os.stat(p).st_mtime_ns) for p in base.paths)
    return stats, base.fmt, tuple(base.columns), source.fn, len(source), fraction


def _text_of(record: Mapping[str, Any]) -> str:
    return str(record.get("text", record.get("source", "")))
