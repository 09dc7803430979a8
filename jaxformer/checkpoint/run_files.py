"""A run's own files beside its checkpoints: ``config.json`` (the run config) and ``metrics.jsonl``.

The trainer writes both (`save_run_config`; rows: `jaxformer.train.metrics.MetricWriter`); every
reader of a run (resume, fine-tuning, inference, best-checkpoint selection, the demo) reads them
here.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path

from jaxformer.checkpoint.verify import MANIFEST

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"


def save_run_config(workdir: str | os.PathLike, config) -> None:
    """``<workdir>/config.json``, replaced atomically (a crash leaves the old or the new one)."""
    path = Path(workdir) / CONFIG_FILE
    tmp = path.with_name(CONFIG_FILE + ".tmp")
    tmp.write_text(json.dumps(config.to_dict() if hasattr(config, "to_dict") else dict(config),
                              indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


def workdir_hint(workdir: str | os.PathLike) -> str:
    """For a workdir that does not exist: ``"; did you mean 'runs/clf'?"`` naming the training
    workdirs (directories holding ``config.json``) of a close name beside it, or that its parent
    directory does not exist; "" when neither helps (e.g. it exists)."""
    path = Path(workdir).expanduser()
    if path.exists():
        return ""
    parent = path.parent
    if not parent.is_dir():
        return f"; the directory {str(parent)!r} does not exist"
    runs = sorted(p.name for p in parent.iterdir() if (p / CONFIG_FILE).is_file())
    close = difflib.get_close_matches(path.name, runs, n=3, cutoff=0.6)
    return ("; did you mean " + " or ".join(repr(os.path.join(os.path.dirname(str(workdir)), c))
                                            for c in close) + "?") if close else ""


def load_run_config(workdir: str | os.PathLike, manifest: dict | None = None) -> dict:
    """The run config (the training config a run saved as ``config.json``): the copy ``manifest``
    (a checkpoint's) recorded, else ``<workdir>/config.json``."""
    if manifest and isinstance(manifest.get("config"), dict):
        return manifest["config"]
    path = Path(workdir) / CONFIG_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {workdir!r} a jaxformer training workdir?"
                                f"{workdir_hint(workdir)}")
    try:
        run_config = json.loads(path.read_text())
        if not isinstance(run_config, dict) or "model" not in run_config:
            raise ValueError("no 'model' section")
    except ValueError as e:  # JSONDecodeError included
        raise ValueError(f"{path} is not a run config ({'empty' if not path.stat().st_size else e}); "
                         "put the run's config.json back (checkpoints written by this version "
                         f"carry a copy in checkpoints/<step>/{MANIFEST})") from None
    return run_config


def read_metrics(workdir: str | os.PathLike) -> list[dict]:
    """All rows of ``<workdir>/metrics.jsonl`` (but a last line torn by a kill mid-write)."""
    path = Path(workdir) / METRICS_FILE
    if not path.exists():
        return []
    text = path.read_text()
    lines = text.splitlines()
    if lines and not text.endswith("\n"):
        lines.pop()
    return [json.loads(line) for line in lines if line.strip()]
