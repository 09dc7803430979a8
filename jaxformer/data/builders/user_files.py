"""Bring your own data: random access to the lines of text, JSONL or TSV files.

One example per non-blank line. Opening a source reads each file once to record the byte
offset of every example line (``int64`` arrays, 16 bytes per example); records are then read
on demand with ``os.pread``, so corpora larger than memory work and the source pickles small
for Grain worker processes.

Raw records (field names are mapped by `jaxformer.data.fields.Fields`):

- ``text``:  ``{"text": line, "id": ...}``
- ``jsonl``: the parsed JSON object plus ``"id"`` (unless it has one)
- ``tsv``:   ``{column: cell}`` plus ``"id"``; columns from the file's first row, or ``columns``
  for files without a header row. Cells are split on tabs, without quoting.

``id`` is ``<file path>:<line number>`` (from 1), the path relative to the glob's directory (the
part before its first wildcard): ``a.txt:3`` for ``data/*.txt``, ``x/a.txt:3`` for
``data/**/*.txt``, so files of the same name in different folders keep distinct ids. Without
``{split}`` in the glob, a line belongs to the split `hash_split(id, split_fractions)` picks, so
the splits are disjoint and stable.

Compressed files (``.gz``, ``.bz2``, ``.xz``; the format comes from the extension before it, e.g.
``train.jsonl.gz``) are decompressed once into ``<cache>/decompressed/`` (keyed by the file's
absolute path, size and modification time; written atomically) and read from there, so random
access stays cheap. Ids drop the compression suffix (``a.jsonl:3`` for ``a.jsonl.gz``), so
compressing a file keeps every line in its split.
"""

from __future__ import annotations

import bz2
import difflib
import fnmatch
import glob as globlib
import gzip
import hashlib
import json
import lzma
import os
import pathlib
import re
import shutil
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxformer.data import fetch
from jaxformer.data.builders.base import SPLITS, hash_split

FORMATS = ("text", "jsonl", "tsv")
EXTENSIONS = {".txt": "text", ".text": "text", ".jsonl": "jsonl", ".json": "jsonl",
              ".tsv": "tsv"}
COMPRESSIONS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}


def _without_compression(path: str) -> str:
    """``a.jsonl`` for ``a.jsonl.gz`` (and for ``a.jsonl``)."""
    suffix = pathlib.Path(path).suffix
    return path[:-len(suffix)] if suffix.lower() in COMPRESSIONS else path


def _data_suffix(path: str) -> str:
    """The extension naming the format: ``.jsonl`` for both ``a.jsonl`` and ``a.jsonl.gz``."""
    return pathlib.Path(_without_compression(path)).suffix


def _infer_format(paths: Sequence[str], pattern: str) -> str:
    found = {EXTENSIONS.get(_data_suffix(p).lower()) for p in paths}
    if len(found) != 1 or None in found:
        raise ValueError(f"files {pattern!r}: cannot tell the format from the file extensions "
                         f"({sorted({_data_suffix(p) for p in paths})}); set data.format "
                         f"to one of {FORMATS}")
    return found.pop()


def decompressed(path: str) -> str:
    """``path`` itself, or for a ``.gz`` / ``.bz2`` / ``.xz`` file its decompressed copy under
    ``<cache>/decompressed/``, made once per version of the file (under an inter-process lock,
    written to a temporary name and renamed, so a killed run never leaves half a copy)."""
    suffix = pathlib.Path(path).suffix.lower()
    if suffix not in COMPRESSIONS:
        return path
    stat = os.stat(path)
    key = hashlib.sha256(f"{os.path.abspath(path)}|{stat.st_size}|{stat.st_mtime_ns}"
                         .encode()).hexdigest()[:16]
    out = fetch.cache_dir() / "decompressed" / f"{key}-{pathlib.Path(path).stem}"
    if out.exists():
        return str(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with fetch.file_lock(f"decompress-{key}"):
        if not out.exists():
            tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
            try:
                with COMPRESSIONS[suffix](path, "rb") as src, open(tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            except (OSError, EOFError, lzma.LZMAError) as e:
                tmp.unlink(missing_ok=True)
                raise ValueError(f"{path}: cannot decompress as {suffix} ({e})") from None
            os.replace(tmp, out)
    return str(out)


def available_splits(pattern: str) -> list[str]:
    """The names that the files matching ``pattern`` (a glob with ``{split}``) give ``{split}``."""
    pattern = os.path.expanduser(pattern)
    head, _, tail = pattern.partition("{split}")
    marker = "\x00"  # a character no path holds, translated as itself
    regex = re.compile(fnmatch.translate(head + marker + tail.replace("{split}", "*"))
                       .replace(marker, "(?P<split>[^/]+?)", 1))
    matches = (regex.match(p) for p in globlib.glob(pattern.replace("{split}", "*"),
                                                    recursive=True))
    return sorted({m.group("split") for m in matches if m})


def _near_misses(glob: str) -> str:
    """For a glob that matches nothing: its directory's files of a close name (a typo), or that
    the directory does not exist ("" when neither helps)."""
    folder, name = os.path.split(os.path.expanduser(glob))
    if os.path.isdir(os.path.expanduser(glob)):  # a folder: its files are what is meant
        kinds = sorted({os.path.splitext(f)[1] for f in os.listdir(os.path.expanduser(glob))
                        if os.path.splitext(f)[1]})[:3] or [""]
        return (f"; {glob!r} is a directory: give a glob of its files, e.g. "
                + " or ".join(repr(os.path.join(glob, "*" + k)) for k in kinds))
    if any(ch in folder for ch in "*?["):
        return ""
    if folder and not os.path.isdir(folder):
        return f"; the directory {folder!r} does not exist"
    close = difflib.get_close_matches(name, sorted(os.listdir(folder or ".")), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(os.path.join(folder, c)) for c in close)}?" if close \
        else ""


def _glob_root(pattern: str) -> str:
    """The directory of ``pattern`` before its first wildcard ("" = use base names)."""
    cut = min((i for i, ch in enumerate(pattern) if ch in "*?["), default=None)
    if cut is None:
        return ""  # one file: its base name
    return os.path.dirname(pattern[:cut])


class BadRecord(ValueError):
    """A record of the data that cannot be an example (not UTF-8, invalid JSON, a TSV row of
    another width, a missing field, a label outside the classes): one line naming the record
    (``file:line``), what is wrong and the fix. Raised as the record is read: at set-up for the
    records read then (`jaxformer.data.sources.label_names_from_data` reads a classifier's whole
    train split, and `jaxformer.data.pipeline.check_train_records` every `files:` train split), else
    from the data pipeline during training."""


class FileSource:
    """The example lines of the files matching ``pattern`` that belong to ``split``."""

    def __init__(self, pattern: str, split: str, *, fmt: str | None = None,
                 columns: Sequence[str] | None = None,
                 split_fractions: tuple[float, float, float] = (0.9, 0.05, 0.05)) -> None:
        hashed = "{split}" not in pattern
        # the glob read, as messages name it; a pattern of just "{split}" takes the whole glob as
        # its split (`jaxformer.evaluate_run.with_data`: every line of the files)
        glob = pattern.replace("{split}", split)
        named = repr(glob) + ("" if hashed or pattern == "{split}" else
                              f" (split {split!r} of {pattern!r})")
        if not hashed and tuple(split_fractions) != (0.9, 0.05, 0.05):
            raise ValueError(f"files {pattern!r}: data.split_fractions applies to globs without "
                             "'{split}' (lines split by hash); this glob names each split's files")
        if hashed and split not in SPLITS:
            raise ValueError(f"files {pattern!r}: split {split!r} must be one of {SPLITS} when "
                             f"the glob has no '{{split}}' (lines are split by hash of their id)")
        self.paths = sorted(globlib.glob(os.path.expanduser(glob), recursive=True))
        self.paths = [p for p in self.paths if os.path.isfile(p)]
        root = _glob_root(os.path.expanduser(glob))
        self.names = [_without_compression(os.path.relpath(p, root) if root else
                                           os.path.basename(p)) for p in self.paths]
        if not self.paths:
            splits = [] if hashed or pattern == "{split}" else available_splits(pattern)
            found = _near_misses(glob) if not splits else (
                f"; the glob's files hold the splits {splits}")
            fix = "" if hashed or split == "train" or pattern == "{split}" else (
                "; add that file" + (", or hold out part of train with "
                                     "data.validation_from_train=0.1" if split == "validation"
                                     else "") +
                f", or drop '{{split}}' from the glob and let the splits come by "
                f"hash (e.g. data.source='files:{pattern.replace('{split}', 'train')}' with "
                "data.split_fractions, default 0.9/0.05/0.05)")
            raise ValueError(f"files {named}: no file matches it{found}{fix}")
        self.fmt = fmt or _infer_format(self.paths, glob)
        if self.fmt not in FORMATS:
            raise ValueError(f"data.format {self.fmt!r} is not one of {FORMATS}")
        self.columns: list[tuple[str, ...] | None] = []
        self.read_paths = [decompressed(p) for p in self.paths]
        file_ids, offsets, lengths, lines, total_lines = [], [], [], [], 0
        for k, path in enumerate(self.read_paths):
            header = self.fmt == "tsv" and not columns
            starts, sizes, numbers, first = _index_lines(path, skip_first=header,
                                                         name=self.paths[k], line_id=self.names[k])
            total_lines += len(numbers)
            if self.fmt == "tsv":
                self.columns.append(tuple(columns) if columns else
                                    tuple(first.rstrip("\r\n").split("\t")))
            else:
                self.columns.append(None)
            if hashed:
                name = self.names[k]
                keep = np.array([hash_split(f"{name}:{n}", split_fractions) == split
                                 for n in numbers.tolist()], dtype=bool)
                starts, sizes, numbers = starts[keep], sizes[keep], numbers[keep]
            file_ids.append(np.full(len(starts), k, np.int32))
            offsets.append(starts)
            lengths.append(sizes)
            lines.append(numbers)
        if not total_lines:  # e.g. an empty train file: say which, not "no text" later
            header = self.fmt == "tsv" and not columns
            what = ("only a header row (if that row is an example, name the columns with "
                    "data.columns)") if header and any(any(c) for c in self.columns if c) else (
                "no non-blank line")
            raise ValueError(f"files {named}: {', '.join(self.paths)} "
                             f"{'has' if len(self.paths) == 1 else 'have'} {what}: no example")
        self.file_ids = np.concatenate(file_ids)
        self.offsets, self.lengths = np.concatenate(offsets), np.concatenate(lengths)
        self.line_numbers = np.concatenate(lines)
        self._fds: dict[int, int] = {}
        self._pid = os.getpid()

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} examples")
        k = int(self.file_ids[index])
        raw = os.pread(self._fd(k), int(self.lengths[index]), int(self.offsets[index]))
        where = f"{self.names[k]}:{int(self.line_numbers[index])}"  # the id
        try:
            line = raw.decode("utf-8").rstrip("\r\n").lstrip("\ufeff")
        except UnicodeDecodeError as e:
            raise BadRecord(f"{where} ({self.paths[k]}): not UTF-8 ({e.reason} at byte "
                            f"{e.start}); files: sources read UTF-8 text (or .gz/.bz2/.xz "
                            "of it)") from None
        if self.fmt == "text":
            record: dict[str, Any] = {"text": line}
        elif self.fmt == "jsonl":
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                at = "" if e.msg.endswith(" at") else " at"  # "Unterminated string starting at"
                raise BadRecord(f"{where} ({self.paths[k]}): invalid JSON ({e.msg}{at} column "
                                f"{e.colno})") from None
            if not isinstance(record, dict):
                raise BadRecord(f"{where} ({self.paths[k]}): expected a JSON object, got "
                                f"{type(record).__name__}")
        else:
            cells = line.split("\t")
            if len(cells) != len(self.columns[k]):
                raise BadRecord(f"{where} ({self.paths[k]}): {len(cells)} tab-separated "
                                f"cells, expected {len(self.columns[k])} ({self.columns[k]})")
            record = dict(zip(self.columns[k], cells))
        record.setdefault("id", where)
        return record

    def _fd(self, k: int) -> int:
        if self._pid != os.getpid():  # forked: descriptors are not ours to share
            self._fds, self._pid = {}, os.getpid()
        if k not in self._fds:
            self._fds[k] = os.open(self.read_paths[k], os.O_RDONLY)
        return self._fds[k]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fds": {}}

    def __del__(self, _getpid=os.getpid, _close=os.close) -> None:
        # os functions bound as defaults: at interpreter exit the module globals may be gone
        if getattr(self, "_pid", None) == _getpid():
            for fd in getattr(self, "_fds", {}).values():
                _close(fd)

    def __repr__(self) -> str:
        return f"FileSource({len(self.paths)} files, format={self.fmt!r}, len={len(self)})"


def _index_lines(path: str, skip_first: bool, name: str, line_id: str = ""
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """Byte offsets, byte lengths and 1-based numbers of the non-blank lines of ``path``, and
    its first line (decoded; a TSV header when ``skip_first``). ``name`` is the path errors
    show (the compressed file for a decompressed copy), ``line_id`` the file's part of the ids.
    Every line is decoded on the way (a small part of the cost of reading it), so text that is not
    UTF-8 is a `BadRecord` as soon as the files are opened, for every split and task."""
    starts, sizes, numbers, first, pos = [], [], [], "", 0
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as e:
                what = f"{name}:1 (the TSV header)" if number == 1 and skip_first else (
                    f"{line_id or name}:{number} ({name})")
                raise BadRecord(f"{what}: not UTF-8 ({e.reason} at byte {e.start}); files: "
                                "sources read UTF-8 text (or .gz/.bz2/.xz of it)") from None
            if number == 1 and skip_first:
                first = text.lstrip("\ufeff")
            elif line.strip():
                starts.append(pos)
                sizes.append(len(line))
                numbers.append(number)
            pos += len(line)
    return (np.array(starts, np.int64), np.array(sizes, np.int64), np.array(numbers, np.int64),
            first)
