"""The command lines live in `jaxformer.cli`, one module per command, each with ``main`` and ``run``;
every one answers ``python -m jaxformer.cli.<command> --help``; the console scripts of
pyproject.toml are exactly these ``run`` functions; and no library module imports the package
(the CLI sits above everything it drives)."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from test_imports import package_edges, reachable

import jaxformer.cli

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = sorted(p.stem for p in (ROOT / "jaxformer" / "cli").glob("*.py") if p.stem != "__init__")


def test_the_commands_are_the_ones_the_package_lists():
    """``jaxformer/cli/__init__.py`` lists each command once (``- `name`: …``), none missing, none
    extra; the root ``train.py`` only starts `jaxformer.cli.train`."""
    listed = re.findall(r"^- `(\w+)`:", jaxformer.cli.__doc__, flags=re.M)
    assert sorted(listed) == COMMANDS and len(listed) == len(set(listed)), (listed, COMMANDS)
    assert {"train", "evaluate", "predict", "generate", "answer", "checkpoints", "plan", "compile",
            "convert"} <= set(COMMANDS)
    assert "from jaxformer.cli.train import run" in (ROOT / "train.py").read_text()


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_has_main_and_run(command):
    module = importlib.import_module(f"jaxformer.cli.{command}")
    assert callable(getattr(module, "main", None)) and callable(getattr(module, "run", None))
    assert 'if __name__ == "__main__":\n    run()' in Path(module.__file__).read_text()


def test_console_scripts_are_the_run_of_each_command():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {f"jaxformer-{c}": f"jaxformer.cli.{c}:run" for c in COMMANDS}
    for target in scripts.values():  # each resolves to a function
        module, _, name = target.partition(":")
        assert callable(getattr(importlib.import_module(module), name))


@pytest.mark.slow  # one interpreter per command: ~3 s each (jax and the command's imports)
@pytest.mark.parametrize("command", COMMANDS)
def test_help_lists_the_flags(command):
    """argparse commands exit 0 after ``--help``; absl's (``train``, ``evaluate``, ``plan``,
    ``compile``: those with ``define_flags``) print the same kind of usage on stdout and exit 1,
    absl's own convention (`absl.app.HelpFlag`), ending with its "Try --helpfull" line."""
    proc = subprocess.run([sys.executable, "-m", f"jaxformer.cli.{command}", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    uses_absl = hasattr(importlib.import_module(f"jaxformer.cli.{command}"), "define_flags")
    assert proc.returncode == (1 if uses_absl else 0), proc.stderr[-2000:]
    assert re.search(r"^\s+--(\[no\])?[\w-]+", proc.stdout, flags=re.M), proc.stdout[-2000:]  # flags
    assert ("Try --helpfull" in proc.stdout) == uses_absl, proc.stdout[-500:]


@pytest.mark.slow  # two interpreters, ~4 s each
def test_absl_help_is_the_commands_when_started_by_a_wrapper():
    """Started by the root ``train.py`` or a console script (``__main__`` is then the wrapper),
    ``--help`` still shows the command's docstring and its flags (`jaxformer.cli.run_absl`);
    ``compile`` lists ``plan``'s flags as its own."""
    wrappers = {"train": ([str(ROOT / "train.py")], {"config", "workdir", "print_config"}),
                "compile": (["-c", "import sys; sys.argv[0] = 'jaxformer-compile'; "
                                   "from jaxformer.cli.compile import run; run()"],
                            {"config", "preset", "topology", "mesh", "json"})}
    for command, (args, expected) in wrappers.items():
        proc = subprocess.run([sys.executable, *args, "--help"], cwd=ROOT, capture_output=True,
                              text=True, timeout=300)
        doc = importlib.import_module(f"jaxformer.cli.{command}").__doc__
        assert proc.returncode == 1 and doc.splitlines()[0] in proc.stdout, proc.stdout[-2000:]
        listed = set(re.findall(r"^\s+--(?:\[no\])?(\w+)", proc.stdout, flags=re.M))
        assert expected <= listed, (command, listed)


def test_no_library_module_imports_the_command_lines():
    edges = package_edges(ROOT / "jaxformer")
    importers = {p: reachable(edges, p) for p in edges if p != "jaxformer.cli"}
    bad = {p: " → ".join(paths["jaxformer.cli"]) for p, paths in importers.items()
           if "jaxformer.cli" in paths}
    assert not bad, f"library packages import jaxformer.cli (it drives them, not the reverse): {bad}"
