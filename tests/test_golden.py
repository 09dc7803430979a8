"""The committed Hugging Face references (`tests/golden.py`): complete, small, recorded, and checked
against the live library (the ``hf`` tier) by a check that can fail."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from golden import GOLDEN

MAKER = Path(__file__).resolve().parent / "make_golden.py"


def _case_names() -> list[str]:
    """The keys of make_golden.CASES, read from its source (importing it needs torch)."""
    tree = ast.parse(MAKER.read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "CASES":
            return sorted(k.value for k in node.value.keys)
    raise AssertionError("no CASES in make_golden.py")


def test_every_case_is_committed_small_and_recorded():
    manifest = json.loads((GOLDEN / "MANIFEST.json").read_text())
    assert manifest["cases"] == _case_names()
    assert manifest["transformers"] and manifest["torch"] and "make_golden.py" in manifest["command"]
    for name in manifest["cases"]:
        files = {p.name for p in (GOLDEN / name).iterdir()}
        assert "config.json" in files and any(f.startswith("model") and f.endswith(".safetensors")
                                              for f in files), name
    assert set(json.loads((GOLDEN / "init_stats.json").read_text())) >= {"t5_step0", "gpt2", "t5"}
    size = sum(p.stat().st_size for p in GOLDEN.rglob("*") if p.is_file())
    # 12 MiB for 18 architectures' cases (10 MiB held the first twelve); the largest, mixtral and the
    # T5 v1.1 graphs (~0.75 MiB each), are the place to shrink before raising it again
    assert size < 12 * 2**20, f"golden files are {size / 2**20:.1f} MiB: keep the models tiny"


@pytest.mark.hf
@pytest.mark.slow
def test_the_check_finds_a_changed_reference(tmp_path):
    """``make_golden.py --check`` passes on the committed files and fails, naming the case and
    output, on a reference changed by 1e-3 relative."""
    import make_golden

    shutil.copytree(GOLDEN, tmp_path / "golden")
    assert make_golden.check(tmp_path / "golden") == []
    path = tmp_path / "golden" / "gpt2" / "reference.npz"
    with np.load(path) as f:
        arrays = {k: f[k] for k in f.files}
    arrays["logits"] = arrays["logits"] * (1 + 1e-3)
    np.savez_compressed(path, **arrays)
    problems = make_golden.check(tmp_path / "golden")
    assert len(problems) == 1 and problems[0].startswith("gpt2 logits: relative error"), problems
