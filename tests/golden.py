"""Committed Hugging Face references, read without torch (made by `tests/make_golden.py`).

Each case is a directory ``tests/data/golden/<name>/`` holding what ``save_pretrained`` wrote for a
tiny random transformers model (``config.json``, ``model.safetensors``) and, where the tests compare
outputs, ``reference.npz``: the inputs the model was run on and its outputs (logits, greedy tokens),
computed by PyTorch in float32 with eager attention. ``init_stats.json`` holds the per-tensor mean
and std of transformers' fresh initialisation and T5's step-0 losses (`tests/test_init.py`).
``MANIFEST.json`` records the transformers and torch versions and the command that made them.

The tests compare jaxformer with these files: import parity (logits), export (our safetensors and
config against the HF-saved originals, tensor for tensor and key for key). The live comparisons stay
as the ``hf`` tier (`make test-hf`), which also re-runs the committed models in the installed
transformers (``python tests/make_golden.py --check``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

GOLDEN = Path(__file__).resolve().parent / "data" / "golden"


def golden_dir(name: str) -> str:
    """The case's HF model directory (read-only: copy it before editing)."""
    path = GOLDEN / name
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no golden case {name!r} under {GOLDEN}: run "
                                "`python tests/make_golden.py` (needs the [hf] extra)")
    return str(path)


def golden_copy(name: str, dest: Path) -> str:
    """A writable copy of the case's directory at ``dest``."""
    shutil.copytree(golden_dir(name), dest)
    return str(dest)


def reference(name: str) -> dict[str, np.ndarray]:
    """The case's inputs and reference outputs, by name (``input_ids``, ``logits``, …)."""
    with np.load(Path(golden_dir(name)) / "reference.npz") as f:
        return {k: f[k] for k in f.files}


def init_stats() -> dict:
    """{case: {"config": jaxformer config dict, "stats": {path: [mean, std]}}, "t5_step0": …}."""
    return json.loads((GOLDEN / "init_stats.json").read_text())


def rel_err(ours, ref) -> float:
    """max |ours - ref| / max |ref|, in float64."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))
