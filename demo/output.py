"""What the demo shows and writes: timed stage headers, learning curves, JSONL result files.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

_START = time.perf_counter()


def start_clock() -> None:
    """Restart the clock the stage headers show."""
    global _START
    _START = time.perf_counter()


def banner(text: str) -> None:
    """A stage header with the time since the demo started."""
    m, sec = divmod(int(time.perf_counter() - _START), 60)
    print(f"\n=== [{m:02d}:{sec:02d}] {text} ===", flush=True)


def curve(rows: list[dict], key: str) -> list[tuple[int, float]]:
    """``[(step, value)]`` of the rows that logged ``key``."""
    return [(int(r["step"]), float(r[key])) for r in rows if key in r]


def write_jsonl(path: Path, records) -> int:
    """Write dict records one per line, atomically (a reader never sees half a file); returns how
    many."""
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    with tmp.open("w") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
            n += 1
    os.replace(tmp, path)
    return n


def write_tool_report(out: str | Path, stem: str, results, markdown: str) -> None:
    """A side tool's report (`demo.t5_budget`, `demo.pretrain_lr`): ``<out>/<stem>.json`` (the
    results) and ``<out>/<stem>.md`` (``markdown``), then say where they are."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    (out / f"{stem}.md").write_text(markdown)
    print(f"Wrote {out}/{stem}.json, {stem}.md")
