"""Metrics out: ``<workdir>/metrics.jsonl``, TensorBoard event files, and a console progress bar.

Only process 0 writes. Each JSONL line is one logged step: ``{"step": s, "loss": …, …}`` with eval
metrics prefixed ``eval_`` when evaluated at that step. The step's count of what the loss averages
over is named for what it counts: ``tokens`` for token-level objectives, ``examples`` for
classification (one label per example). A training row also holds ``step_time_s``,
``tokens_per_s`` / ``examples_per_s``, ``tflops_per_device`` and ``mfu`` of the steps since the
previous row (`jaxformer.train.throughput`: evaluation, checkpoints and compilation left out).
With the progress bar off (a redirected log) each row is also printed as one plain line.

A resumed run first cuts both back to the step it resumes from (`truncate_metrics`): the rows and
events a killed run wrote after its last checkpoint are written again, once.
The rows are read back by `jaxformer.checkpoint.run_files.read_metrics` (below the trainer:
the best-checkpoint choice reads them).
"""

from __future__ import annotations

import datetime
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


def _import_event_writing() -> tuple[type, type, type]:
    """tensorboardX's ``EventsWriter`` and its ``Event`` / ``Summary`` protos, imported without
    torch: tensorboardX imports torch (when installed) only to recognise torch tensors, which are
    never logged here, and that import costs ~1.5 s of CPU in every training process. torch is
    hidden from that one import (unless already loaded), then visible again."""
    hidden = "torch" not in sys.modules
    if hidden:
        sys.modules["torch"] = None  # `import torch` raises ImportError, which tensorboardX expects
    try:
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary
    finally:
        if hidden:
            del sys.modules["torch"]
    return EventsWriter, Event, Summary


EventsWriter, Event, Summary = _import_event_writing()

COUNT_NAMES = ("tokens", "examples")


class MetricWriter:
    """Appends rows to ``metrics.jsonl`` and TensorBoard; ``count_name`` ("tokens" or "examples")
    is the name the train step's ``tokens`` count is written under (module docstring).

    Each row's scalars are one TensorBoard event, written and flushed to the file before `write`
    returns. tensorboardX's ``SummaryWriter`` queues events for a thread that writes them later,
    and its ``flush`` does not wait for that queue: a run killed after a checkpoint commit lost
    that step's events for good (the resume starts after the step), though metrics.jsonl kept
    its row. Written here, a row is on disk before the step's checkpoint is saved."""

    def __init__(self, workdir: str | os.PathLike, *, enabled: bool | None = None,
                 count_name: str = "tokens"):
        if count_name not in COUNT_NAMES:
            raise ValueError(f"count_name={count_name!r} must be one of {COUNT_NAMES}")
        self.enabled = jax.process_index() == 0 if enabled is None else enabled
        self.path = Path(workdir) / METRICS_FILE
        self.count_name = count_name
        self._tb = None
        if self.enabled:
            (Path(workdir) / "tensorboard").mkdir(parents=True, exist_ok=True)
            self._tb = EventsWriter(str(Path(workdir) / "tensorboard" / "events"),
                                    filename_suffix=f".{os.getpid()}")  # a file per process

    def named(self, metrics: dict) -> dict:
        """``metrics`` with the step's count under its honest name (``tokens`` or ``examples``)."""
        return {self.count_name if k == "tokens" else k: v for k, v in metrics.items()}

    def write(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        row = {"step": int(step), **{k: _py(v) for k, v in self.named(metrics).items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        values = [Summary.Value(tag=k, simple_value=v) for k, v in row.items()
                  if k != "step" and isinstance(v, (int, float))]
        self._tb.write_event(Event(wall_time=time.time(), step=int(step),
                                   summary=Summary(value=values)))
        self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


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
    `jaxformer.progress.bar_disabled`, None = only when stderr is a terminal). With the bar off
    (a redirected log), `log` prints each logged row and each evaluation as one plain line
    instead, as Hugging Face's Trainer logs, so a slow run can be told from a hung one."""

    def __init__(self, start: int, total: int, *, enabled: bool | None = None,
                 desc: str = "train"):
        self.bar = tqdm(total=total, initial=start, desc=desc, unit="step", dynamic_ncols=True,
                        disable=True if jax.process_index() != 0 else bar_disabled(enabled),
                        mininterval=1.0)
        self.lines = jax.process_index() == 0 and self.bar.disable  # tqdm resolved None here
        self.start, self.total = start, total
        self._t0, self._tokens, self._steps = None, 0.0, 0

    def update(self, n: int, *, loss: float | None, lr: float | None, tokens: float,
               mfu: float | None = None) -> None:
        """Advance ``n`` steps. ``loss`` / ``lr`` / ``mfu`` are the last logged values (None: not
        logged yet, not shown). tokens/s averages over the run so far, from the end of the first
        step (which includes compilation)."""
        now = time.perf_counter()
        if self._t0 is None:
            self._t0 = now
        else:
            self._tokens += tokens
            self._steps += n
        rate = self._tokens / max(now - self._t0, 1e-9)
        shown = {"loss": None if loss is None else f"{loss:.4f}", "tok_s": f"{rate:,.0f}",
                 "mfu": None if mfu is None else f"{100 * mfu:.1f}%",
                 "lr": None if lr is None else f"{lr:.2e}"}
        self.bar.set_postfix({k: v for k, v in shown.items() if v is not None}, refresh=False)
        self.bar.update(n)

    def eta_seconds(self, step: int) -> float | None:
        """Seconds left to ``total`` at the pace since the end of the first step (evaluations
        and checkpoints included), or None before a second step."""
        if self._t0 is None or self._steps == 0:
            return None
        return (time.perf_counter() - self._t0) / self._steps * (self.total - step)

    def log(self, step: int, row: dict) -> None:
        """With the bar off: ``step 100/1000: loss 2.3456, lr 1.00e-04, tokens/s 12,345, 0.012
        TFLOP/s/device, MFU 1.2%, ETA 0:05:12`` for a training row, ``step 100/1000 eval:
        eval_loss 2.1000, eval_accuracy 0.5000`` for its evaluation."""
        if not self.lines:
            return
        train, evals = plain_lines(step, self.total, row, self.eta_seconds(step))
        for line in (train, evals):
            if line:
                print(line, flush=True)

    def close(self) -> None:
        self.bar.close()


def plain_lines(step: int, total: int, row: dict, eta: float | None) -> tuple[str, str]:
    """The training and evaluation lines of a metrics row for a log without a bar (`Progress.log`);
    each is "" when the row has no such metrics."""
    parts = [f"{k} {row[k]:.4f}" for k in ("loss",) if row.get(k) is not None]
    if row.get("learning_rate") is not None:
        parts.append(f"lr {row['learning_rate']:.2e}")
    for name in COUNT_NAMES:
        if row.get(f"{name}_per_s") is not None:
            parts.append(f"{name}/s {row[f'{name}_per_s']:,.0f}")
    if row.get("tflops_per_device") is not None:
        parts.append(f"{row['tflops_per_device']:.3g} TFLOP/s/device")
    if row.get("mfu") is not None:
        parts.append(f"MFU {100 * row['mfu']:.1f}%")
    if row.get("skipped_updates"):
        parts.append(f"skipped updates {row['skipped_updates']}")
    if parts and eta is not None:
        parts.append(f"ETA {datetime.timedelta(seconds=round(eta))}")
    evals = [f"{k} {v:.4f}" for k, v in row.items() if k.startswith("eval_")
             and isinstance(v, (int, float))]
    where = f"step {step}/{total}"
    return (f"{where}: {', '.join(parts)}" if parts else "",
            f"{where} eval: {', '.join(evals)}" if evals else "")
