"""The house's shape stays as issue 61 left it, read statically (seconds, nothing imported from the
library): no ``option(`` reads, no default restated in a config ``.get(key, default)``, no module
name shared by two packages where it hides what a module is, and a README layout that names every
package and top-level module of ``jaxformer/``.

The counters are `bench/house_metrics.py`'s (the figures of the issue's note), so the test and
the report count the same thing; `test_the_counters_see_what_they_forbid` runs them on a small
package holding each pattern, so that a counter that found nothing could not pass for a clean tree.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_SPEC = importlib.util.spec_from_file_location("house_metrics", ROOT / "bench" / "house_metrics.py")
house_metrics = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(house_metrics)

# Module names that said nothing about their module when two packages held one (issue 61, "The map"):
# the parameter specs and their NNX holders (params.py), the config declarations (settings.py), the
# head registry and the head math (heads.py), the permutation-LM objective and its math
# (permutation.py), the QA windows and the QA objective (qa.py).
NO_TWINS = ("params.py", "settings.py", "heads.py", "permutation.py", "qa.py", "fields.py", "step.py")
README_LIMIT = 12 * 1024  # bytes: the README is a door (docs/ holds the detail)


@pytest.fixture(scope="module")
def static():
    return house_metrics.static_metrics()


def test_no_option_calls(static):
    """Functions take the typed section they read (`jaxformer.train.config.TrainSettings`'s
    sections, an objective's options dataclass) and read attributes."""
    calls = static["option_calls"]
    assert calls["total"] == 0, f"option( calls, file: lines: {calls['at']}"


def test_no_config_get_restates_a_default(static):
    """A default written in ``config.<section>.get(key, default)`` is a second copy of the one
    its ``setting()`` declares."""
    found = [c for c in static["config_get_calls"]["at"] if c["default"]]
    assert not found, "read the typed section's attribute instead: " + "; ".join(
        f"{c['at']}: {c['call']}" for c in found)


def test_no_module_name_in_two_packages_says_less_than_it_should(static):
    twins = {name: where for name, where in static["duplicate_module_names"].items() if name in NO_TWINS}
    assert not twins, f"name these modules by what they hold: {twins}"


def test_the_counters_see_what_they_forbid(tmp_path, monkeypatch):
    lib = tmp_path / "jaxformer"
    for package in ("a", "b"):
        (lib / package).mkdir(parents=True)
        (lib / package / "params.py").write_text("X = 1\n")
    (lib / "a" / "reader.py").write_text(
        "from jaxformer.options import option\n\n"
        "def f(config, cfg):\n"
        "    rate = option(config.objective, 'mask_rate')\n"
        "    steps = config.optimizer.get('grad_accum_steps', 1)\n"
        "    norm = cfg.get('normalization', 'identity')\n"
        "    hf = {}.get('n_embd', 0)  # not a config: not counted\n"
        "    return rate, steps, norm, hf\n")
    monkeypatch.setattr(house_metrics, "ROOT", tmp_path)
    monkeypatch.setattr(house_metrics, "LIB", lib)
    found = house_metrics.static_metrics()
    assert found["option_calls"]["at"] == {"jaxformer/a/reader.py": [4]}
    assert [c["at"] for c in found["config_get_calls"]["at"] if c["default"]] == [
        "jaxformer/a/reader.py:5", "jaxformer/a/reader.py:6"]
    assert found["duplicate_module_names"] == {"params.py": ["jaxformer/a/params.py",
                                                             "jaxformer/b/params.py"]}


def readme_layout() -> list[str]:
    """The names README.md's layout block lists under ``jaxformer/`` (``data/``, ``config.py``)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Layout", 1)[1]
    block = re.search(r"^```text\n(.*?)^```", section, re.M | re.S).group(1).splitlines()
    start = block.index("jaxformer/") + 1
    entries = []
    for line in block[start:]:
        if not line.startswith("  "):  # back at the checkout's root (train.py, configs/)
            break
        entries.append(line.split()[0])
    return entries


def test_the_readme_layout_names_every_package_and_top_level_module():
    lib = ROOT / "jaxformer"
    present = {f"{p.name}/" for p in lib.iterdir() if (p / "__init__.py").is_file()}
    present |= {p.name for p in lib.glob("*.py") if p.name != "__init__.py"}
    listed = readme_layout()
    assert len(listed) == len(set(listed)), f"listed twice: {listed}"
    assert not present - set(listed), f"add to README.md's layout: {sorted(present - set(listed))}"
    assert not set(listed) - present, f"remove from README.md's layout: {sorted(set(listed) - present)}"


def test_the_readme_stays_a_door():
    size = len((ROOT / "README.md").read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} bytes, over {README_LIMIT}: move detail to docs/"
