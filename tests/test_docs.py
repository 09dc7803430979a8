"""docs/extending.md stays true to the tree: every path it names exists, every module it names
imports, and its map lists every test file."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GUIDE = (ROOT / "docs" / "extending.md").read_text()


def test_every_path_in_the_extending_guide_exists():
    paths = set(re.findall(r"`((?:jaxformer|tests|configs|bench|docs)/[\w/.\-]+?\.(?:py|md|sh))", GUIDE))
    assert len(paths) > 30  # the guide is made of paths; an empty match would test nothing
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"docs/extending.md names paths that do not exist: {missing}"


def test_every_function_the_guide_names_in_a_file_exists():
    named = set(re.findall(r"`(jaxformer/[\w/]+\.py)::(\w+)", GUIDE))
    assert named
    for path, name in sorted(named):
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        assert hasattr(module, name), f"docs/extending.md: {path} has no {name}"


def test_the_test_map_lists_every_test_file():
    listed = set(re.findall(r"^\| `(test_\w+\.py)` \|", GUIDE, re.M))
    files = {p.name for p in (ROOT / "tests").glob("test_*.py")}
    assert not files - listed, f"add to docs/extending.md's test map: {sorted(files - listed)}"
    assert not listed - files, f"remove from docs/extending.md's test map: {sorted(listed - files)}"
