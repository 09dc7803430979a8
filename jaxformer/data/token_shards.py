"""Pre-tokenized text: a source tokenized once into sharded ArrayRecord files of token ids.

At pod scale the tokenizer, not the disk, starves the chips (Levanter's tokenized cache, MaxText's
ArrayRecord inputs). `write_token_shards` (``jaxformer-tokenize``, `jaxformer.cli.tokenize`) reads
every split of a ``data.source`` once, tokenizes each record's text with the run's tokenizer and
writes, per split, ``<split>-00000-of-00004.array_record``… plus one ``manifest.json``::

    {"format": "jaxformer-tokens/1", "tokenizer_sha256": "…", "vocab_size": 8000,
     "dtype": "uint16", "source": "shakespeare", "splits": {"train": {"records": 35082,
     "tokens": 1234567, "shards": [{"file": "train-00000-of-00004.array_record",
     "records": 8771, "tokens": 308642}, …]}, …}}

Record ``i`` of a split is the token ids (no specials: the pipeline frames them) of record ``i`` of
the text source's split, little-endian ``dtype`` (uint16 for vocabularies up to 65,536 ids: 2
bytes per token), an empty text an empty record; the shards hold consecutive ranges. So
``data.source='tokens:DIR'`` (`token_source`) gives the pipeline the very examples, in the very
order, that the text source gives after its tokenize step, and the packed rows are byte-equal
(`tests/test_token_shards.py`). Its records are ``{"inputs": int32 [n]}``, which the pipeline
passes through untokenized; only text data tasks (``lm``, ``span_corruption``) read them.

`check_token_manifest` refuses, in one line, shards made with another tokenizer than the run's
(sha256 of the tokenizer's saved file, as ``<workdir>/tokenizer.model`` holds it).
"""

from __future__ import annotations

import bisect
import concurrent.futures
import dataclasses
import hashlib
import json
import multiprocessing
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxformer.data.containers import MappedSource, read_records

FORMAT = "jaxformer-tokens/1"
MANIFEST = "manifest.json"
TOKEN_TASKS = ("lm", "span_corruption")  # the data tasks that read only a text


def tokenizer_sha256(tokenizer: Any) -> str:
    """sha256 of the file ``tokenizer.save`` writes (the bytes of a run's ``tokenizer.model``)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "tokenizer.model")
        tokenizer.save(path)
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()


def token_dtype(vocab_size: int) -> str:
    """The narrowest unsigned dtype holding ids ``0 .. vocab_size - 1``."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def shard_name(split: str, index: int, count: int) -> str:
    return f"{split}-{index:05d}-of-{count:05d}.array_record"


@dataclasses.dataclass(frozen=True)
class _ShardJob:
    """One shard to write (picklable for a worker process): records ``[start, stop)`` of
    ``split`` of the source of ``settings``."""

    settings: Any  # SourceSettings / DataSettings
    split: str
    tokenizer: Any
    start: int
    stop: int
    path: str
    dtype: str


def _text(record: dict, where: str) -> str:
    if "text" not in record:
        raise ValueError(f"{where}: pre-tokenized shards hold texts, but its records have fields "
                         f"{sorted(record)}; give a text source (or data.pair_view for pairs)")
    return record["text"]


def _write_shard(job: _ShardJob) -> tuple[int, int]:
    """Tokenize and write one shard; (records, tokens) written."""
    from array_record.python.array_record_module import ArrayRecordWriter

    from jaxformer.data.sources import get_source

    source = get_source(job.settings, job.split)
    writer = ArrayRecordWriter(job.path + ".tmp", "group_size:1,uncompressed")  # random access
    tokens = 0
    try:
        for record in read_records(source, range(job.start, job.stop)):
            ids = np.asarray(job.tokenizer.encode(_text(record, job.settings.source)), job.dtype)
            tokens += len(ids)
            writer.write(ids.astype(np.dtype(job.dtype).newbyteorder("<")).tobytes())
    finally:
        writer.close()
    os.replace(job.path + ".tmp", job.path)
    return job.stop - job.start, tokens


def write_token_shards(settings: Any, tokenizer: Any, out: str | os.PathLike,
                       splits: Sequence[str], *, num_shards: int = 4,
                       processes: int = 1) -> dict:
    """Tokenize ``splits`` of the source of ``settings`` (`SourceSettings`) into ``out`` (module
    docstring), ``num_shards`` files per split written by ``processes`` worker processes (spawned:
    each opens the source itself); returns the manifest, also written as ``out/manifest.json``
    (last, so a directory without one is incomplete). The tokenizer is saved as
    ``out/tokenizer.model``."""
    from jaxformer.data.sources import get_source

    if num_shards < 1 or processes < 1:
        raise ValueError(f"num_shards={num_shards} and processes={processes} must be >= 1")
    out = os.fspath(out)
    os.makedirs(out, exist_ok=True)
    dtype = token_dtype(tokenizer.vocab_size)
    jobs: dict[str, list[_ShardJob]] = {}
    for split in splits:
        n = len(get_source(settings, split))
        bounds = np.linspace(0, n, num_shards + 1).astype(int)
        jobs[split] = [_ShardJob(settings, split, tokenizer, int(a), int(b),
                                 os.path.join(out, shard_name(split, i, num_shards)), dtype)
                       for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
    flat = [j for js in jobs.values() for j in js]
    if processes == 1:
        done = [_write_shard(j) for j in flat]
    else:
        with concurrent.futures.ProcessPoolExecutor(
                processes, mp_context=multiprocessing.get_context("spawn")) as pool:
            done = list(pool.map(_write_shard, flat))
    counts = iter(done)
    manifest = {"format": FORMAT, "tokenizer_sha256": tokenizer_sha256(tokenizer),
                "vocab_size": int(tokenizer.vocab_size), "dtype": dtype,
                "source": settings.source, "splits": {}}
    for split, js in jobs.items():
        shards = [{"file": os.path.basename(j.path), "records": r, "tokens": t}
                  for j, (r, t) in zip(js, (next(counts) for _ in js))]
        manifest["splits"][split] = {"records": sum(s["records"] for s in shards),
                                     "tokens": sum(s["tokens"] for s in shards),
                                     "shards": shards}
    tokenizer.save(os.path.join(out, "tokenizer.model"))
    with open(os.path.join(out, MANIFEST + ".tmp"), "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(os.path.join(out, MANIFEST + ".tmp"), os.path.join(out, MANIFEST))
    return manifest


def read_manifest(directory: str | os.PathLike) -> dict:
    """``directory/manifest.json``; ValueError naming the directory when it has none."""
    path = os.path.join(os.fspath(directory), MANIFEST)
    if not os.path.isfile(path):
        raise ValueError(f"data.source='tokens:{directory}': no {MANIFEST} there; make the shards "
                         f"with jaxformer-tokenize --config <run config> --out {directory}")
    with open(path) as f:
        manifest = json.load(f)
    if manifest.get("format") != FORMAT:
        raise ValueError(f"data.source='tokens:{directory}': {MANIFEST} has format "
                         f"{manifest.get('format')!r}, not {FORMAT!r}; remake the shards")
    return manifest


class TokenRecords:
    """Random access to the records of a split's shard files (bytes), its ArrayRecord readers
    opened on first use in each process (picklable for Grain workers). One record is read as the
    range ``[j, j + 1)``: 14 µs here, where a read of the positions ``[j]`` (what
    ``grain.sources.ArrayRecordDataSource`` does) took 79 µs; many at once with ``__getitems__``."""

    def __init__(self, files: Sequence[str], counts: Sequence[int]):
        self.files, self.ends = list(files), np.cumsum(counts).tolist()
        self._readers: dict[int, Any] = {}

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    def _locate(self, index: int) -> tuple[Any, int]:
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for a source of length {len(self)}")
        k = bisect.bisect_right(self.ends, index)
        if k not in self._readers:
            from array_record.python.array_record_module import ArrayRecordReader
            self._readers[k] = ArrayRecordReader(self.files[k], "readahead_buffer_size:0")
        return self._readers[k], index - (self.ends[k - 1] if k else 0)

    def __getitem__(self, index: int) -> bytes:
        reader, j = self._locate(int(index))
        return reader.read(j, j + 1)[0]

    def __getitems__(self, indices: Sequence[int]) -> list[bytes]:
        return [self[i] for i in indices]

    def __getstate__(self) -> dict:
        return {"files": self.files, "ends": self.ends}

    def __setstate__(self, state: dict) -> None:
        self.files, self.ends, self._readers = state["files"], state["ends"], {}


class _Decode:
    """ArrayRecord bytes → ``{"inputs": int32 [n]}`` (picklable for Grain workers)."""

    def __init__(self, dtype: str):
        self.dtype = np.dtype(dtype).newbyteorder("<")

    def __call__(self, raw: bytes) -> dict[str, np.ndarray]:
        return {"inputs": np.frombuffer(raw, self.dtype).astype(np.int32)}


def token_source(directory: str, split: str) -> MappedSource:
    """The records of ``split`` of the shards in ``directory`` (module docstring): a random-access
    source of ``{"inputs": int32 [n]}``, in the text source's order."""
    manifest = read_manifest(directory)
    if split not in manifest["splits"]:
        raise ValueError(f"data.source='tokens:{directory}' has splits "
                         f"{sorted(manifest['splits'])}, not {split!r}; tokenize that split too "
                         "(jaxformer-tokenize --splits)")
    shards = manifest["splits"][split]["shards"]
    return MappedSource(TokenRecords([os.path.join(directory, s["file"]) for s in shards],
                                     [s["records"] for s in shards]), _Decode(manifest["dtype"]))


def check_token_manifest(directory: str, tokenizer: Any, task: str) -> None:
    """ValueError, in one line, when the shards in ``directory`` were made with another tokenizer
    than ``tokenizer`` (the run's), or ``task`` reads more than a text."""
    manifest = read_manifest(directory)
    if task not in TOKEN_TASKS:
        raise ValueError(f"data.source='tokens:{directory}' holds texts' token ids, which the "
                         f"{task!r} data task cannot read; use it with objectives of data tasks "
                         f"{TOKEN_TASKS} (clm, mlm, span corruption)")
    digest = tokenizer_sha256(tokenizer)
    if manifest["tokenizer_sha256"] != digest:
        raise ValueError(f"data.source='tokens:{directory}' was tokenized with tokenizer sha256 "
                         f"{manifest['tokenizer_sha256'][:12]}…, not the run's "
                         f"({digest[:12]}…); set data.tokenizer.path={directory}/tokenizer.model "
                         "or remake the shards with this run's tokenizer")
