"""Metrics out: ``<workdir>/metrics.jsonl``, TensorBoard event files, and a console progress bar.

Only process 0 writes. Each JSONL line is one logged step: ``{"step": s, "loss": …, …}`` with eval
metrics prefixed ``eval_`` when evaluated at that step. The step's count of what the loss averages
over is named for what it counts: ``tokens`` for token-level objectives, ``examples`` for
classification (one label per example); ``tokens_per_s`` / ``examples_per_s`` is that count times
the steps since the previous row, over the wall time since it (evaluation and checkpoints
included; absent from a run's first row, whose time includes compilation).

A resumed run first cuts both back to the step it resumes from (`truncate_metrics`): the rows and
events a killed run wrote after its last checkpoint are written again, once.
The rows are read back by `jaxformer.checkpoint.run_files.read_metrics` (below the trainer:
the best-checkpoint choice reads them).
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import jax
from tqdm.auto import tqdm

from jaxformer.checkpoint.run_files import METRICS_FILE
from jaxformer.progress import bar_disabled


def _import_summary_writer() -> type:
    """tensorboardX's ``SummaryWriter``, imported without torch: tensorboardX imports torch (when
    installed) only to recognise torch tensors, which are never logged here, and that import costs
    ~1.5 s of CPU in every training process. torch is hidden from that one import (unless already
    loaded), then visible again."""
    if "torch" in sys.modules:
        from tensorboardX import SummaryWriter
        return SummaryWriter
    sys.modules["torch"] = None  # `import torch` raises ImportError, which tensorboardX expects
    try:
        from tensorboardX import SummaryWriter
    finally:
        del sys.modules["torch"]
    return SummaryWriter


SummaryWriter = _import_summary_writer()

COUNT_NAMES = ("tokens", "examples")


class MetricWriter:
    """Appends rows to ``metrics.jsonl`` and TensorBoard; ``count_name`` ("tokens" or "examples")
    is the name the train step's ``tokens`` count is written under (module docstring)."""

    def __init__(self, workdir: str | os.PathLike, *, enabled: bool | None = None,
                 count_name: str = "tokens"):
        if count_name not in COUNT_NAMES:
            raise ValueError(f"count_name={count_name!r} must be one of {COUNT_NAMES}")
        self.enabled = jax.process_index() == 0 if enabled is None else enabled
        self.path = Path(workdir) / METRICS_FILE
        self.count_name = count_name
        self._last: tuple[int, float] | None = None  # (step, time) of the last row with a count
        self._tb = None
        if self.enabled:
            self._tb = SummaryWriter(str(Path(workdir) / "tensorboard"))

    def named(self, metrics: dict) -> dict:
        """``metrics`` with the step's count under its honest name (``tokens`` or ``examples``)."""
        return {self.count_name if k == "tokens" else k: v for k, v in metrics.items()}

    def write(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        row = {"step": int(step), **{k: _py(v) for k, v in self.named(metrics).items()}}
        if self.count_name in row:
            now = time.perf_counter()
            if self._last is not None and step > self._last[0]:
                rate = row[self.count_name] * (step - self._last[0]) / (now - self._last[1])
                row[f"{self.count_name}_per_s"] = rate
            self._last = (int(step), now)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        for k, v in row.items():
            if k != "step" and isinstance(v, (int, float)):
                self._tb.add_scalar(k, v, int(step))
        self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def _py(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return v


def truncate_metrics(workdir: str | os.PathLike, step: int) -> None:
    """Drop the rows and TensorBoard events of steps after ``step`` (written by a run killed after
    its last checkpoint, which the resumed run writes again) and any torn last line or record;
    each file changed is replaced atomically."""
    _truncate_events(Path(workdir), step)
    path = Path(workdir) / METRICS_FILE
    if not path.exists():
        return
    lines = path.read_text().splitlines(keepends=True)
    kept = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if line.endswith("\n") and isinstance(row, dict) and row.get("step", step + 1) <= step:
            kept.append(line)
    if kept != lines:
        tmp = path.with_name(METRICS_FILE + ".tmp")
        tmp.write_text("".join(kept))
        os.replace(tmp, path)


def _event_records(path: Path) -> tuple[list[bytes], bool]:
    """The records of a TensorBoard event file (TFRecord framing: uint64 length, its masked
    crc32c, the bytes, their masked crc32c) and whether a torn record follows them."""
    data, records, i = path.read_bytes(), [], 0
    while i + 12 <= len(data):
        (n,) = struct.unpack_from("<Q", data, i)
        if i + 16 + n > len(data):
            break
        records.append(data[i + 12:i + 12 + n])
        i += 16 + n
    return records, i != len(data)


def _event_files(workdir: Path) -> list[Path]:
    return sorted((workdir / "tensorboard").glob("events.out.tfevents.*"))


def _truncate_events(workdir: Path, step: int) -> None:
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.record_writer import masked_crc32c

    for path in _event_files(workdir):
        records, torn = _event_records(path)
        kept = [r for r in records if Event.FromString(r).step <= step]
        if len(kept) == len(records) and not torn:
            continue
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("wb") as f:
            for r in kept:
                header = struct.pack("<Q", len(r))
                f.write(header + struct.pack("<I", masked_crc32c(header)) + r
                        + struct.pack("<I", masked_crc32c(r)))
        os.replace(tmp, path)


def read_events(workdir: str | os.PathLike) -> Iterator[tuple[str, int, float]]:
    """(tag, step, value) of every scalar in ``<workdir>/tensorboard``'s event files, in order."""
    from tensorboardX.proto.event_pb2 import Event

    for path in _event_files(Path(workdir)):
        for record in _event_records(path)[0]:
            event = Event.FromString(record)
            for value in event.summary.value:
                yield value.tag, event.step, value.simple_value


class Progress:
    """tqdm bar showing step, loss, tokens/s, learning rate and ETA (process 0; ``enabled``:
    `jaxformer.progress.bar_disabled`, None = only when stderr is a terminal)."""

    def __init__(self, start: int, total: int, *, enabled: bool | None = None,
                 desc: str = "train"):
        self.bar = tqdm(total=total, initial=start, desc=desc, unit="step", dynamic_ncols=True,
                        disable=True if jax.process_index() != 0 else bar_disabled(enabled),
                        mininterval=1.0)
        self._t0, self._tokens, self._steps = None, 0.0, 0

    def update(self, n: int, *, loss: float | None, lr: float | None, tokens: float) -> None:
        """Advance ``n`` steps. ``loss`` / ``lr`` are the last logged values (None: not logged
        yet, not shown). tokens/s averages over the run so far, from the end of the first step
        (which includes compilation)."""
        now = time.perf_counter()
        if self._t0 is None:
            self._t0 = now
        else:
            self._tokens += tokens
        rate = self._tokens / max(now - self._t0, 1e-9)
        shown = {"loss": None if loss is None else f"{loss:.4f}", "tok_s": f"{rate:,.0f}",
                 "lr": None if lr is None else f"{lr:.2e}"}
        self.bar.set_postfix({k: v for k, v in shown.items() if v is not None}, refresh=False)
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()
