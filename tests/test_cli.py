"""The command lines live in `jaxformer.cli`, one module per command, each with ``main`` and ``run``;
every one answers ``python -m jaxformer.cli.<command> --help``; the console scripts of
pyproject.toml are exactly these ``run`` functions; and no library module imports the package
(the CLI sits above everything it drives). The compile-only commands (``compile``, ``plan
--topology``) leave JAX's persistent cache alone, print no libtpu start-up errors, and refuse
``--preset``'s size flags beside ``--config``."""

from __future__ import annotations

import importlib
import os
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


def _command(module: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``python -m jaxformer.cli.<module> --config configs/gpt_pretrain_tiny.py`` (1 layer)."""
    environ = {**os.environ, "JAX_PLATFORMS": "cpu", **env}
    return subprocess.run(
        [sys.executable, "-m", f"jaxformer.cli.{module}", "--config",
         str(ROOT / "configs/gpt_pretrain_tiny.py"), "--config.model.num_layers=1", *args],
        env=environ, cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("command,report", [
    ("compile", "compiled gpt_pretrain_tiny (decoder) for v5e:2x2 (TPU v5e, 4 chips)"),
    ("plan", "step compiled for 4 compile-only tpu devices")])
def test_compile_only_commands_leave_the_cache_empty_and_stderr_quiet(tmp_path, command, report):
    """A program compiled for compile-only TPU devices can be written to JAX's persistent cache but
    not loaded back: with ``JAX_COMPILATION_CACHE_DIR`` set, ``jaxformer-compile`` and
    ``jaxformer-plan --topology`` used to leave the step's executable there, and the next run warned
    and compiled again. They turn the cache off. Neither prints libtpu's failed host start-up."""
    cache = tmp_path / "xla"
    proc = _command(command, "--topology=v5e:2x2", "--config.mesh.fsdp=4",
                    JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report in proc.stdout and "mesh data=1 fsdp=4" in proc.stdout, proc.stdout
    assert not cache.exists() or not any(cache.iterdir()), sorted(cache.iterdir())
    assert "persistent compilation cache" not in proc.stderr
    # nor libtpu's start-up error block on a host without a TPU (parallel.topology.quiet_libtpu_start)
    assert "host bounds" not in proc.stderr and "worker hostname" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("command,flag,field", [("plan", "--mesh=fsdp=4", "--config.mesh.fsdp"),
                                                 ("compile", "--batch=4", "--config.data.batch_size")])
def test_preset_sizes_with_a_config_are_refused_naming_the_config_field(command, flag, field):
    """``--batch``, ``--seq_len``, ``--target_len`` and ``--mesh`` size a ``--preset``; given with
    ``--config`` they used to be ignored without a word (``--mesh fsdp=4`` planned data=4)."""
    proc = _command(command, flag, "--topology=v5e:2x2", "--nocompile")
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert f"error: {flag.split('=')[0]} sizes a --preset" in last and field in last, last


def test_our_own_warnings_are_plain_lines_among_absl_ones():
    """Issue 60 §7: ``W1128 09:41:20.701422 … schedules.py:109] …`` among plain lines. The commands'
    log handler (`jaxformer.cli.plain_own_lines`, installed by `run_absl`) writes jaxformer's own
    records as ``warning: …`` and keeps absl's format for other libraries'."""
    import logging

    from absl.logging import PythonFormatter

    from jaxformer.cli import OwnLinesPlain

    fmt = OwnLinesPlain(PythonFormatter())

    def record(path: str, level: int = logging.WARNING) -> logging.LogRecord:
        return logging.LogRecord("absl", level, path, 109, "warmup_steps=%d clipped", (5,), None)

    assert fmt.format(record(str(ROOT / "jaxformer" / "train" / "schedules.py"))) == (
        "warning: warmup_steps=5 clipped")
    assert fmt.format(record(str(ROOT / "jaxformer" / "data" / "tokenizer.py"), logging.INFO)) == (
        "warmup_steps=5 clipped")
    assert re.match(r"W\d{4} \d\d:\d\d:\d\d\.\d+ .*orbax_file.py:109\] warmup_steps=5 clipped$",
                    fmt.format(record("/site-packages/orbax/orbax_file.py")))


@pytest.mark.parametrize("value", ["2", "0", "-0.5"])
def test_generate_refuses_a_top_p_outside_0_1(value, capsys):
    """Issue 60: ``generate --top_p 2`` was accepted (read as "off") and sampled. Refused as the
    other sampling options are, before a checkpoint is read (the workdir need not exist)."""
    from jaxformer.cli.generate import main
    from jaxformer.cli.predict import main as predict

    for command in (lambda a: main(["--prompt", "x", *a]), lambda a: predict(["--input", "x", *a])):
        with pytest.raises(SystemExit) as e:
            command(["--workdir", "/nonexistent", "--strategy", "sample", "--top_p", value])
        assert e.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
            f"error: argument --top_p: {value} is outside (0, 1]: the probability mass sampling keeps "
            "(0.9 keeps the likeliest tokens up to 90%; 1 = off)")


def test_a_workdir_that_cannot_be_created_is_named_in_words(tmp_path):
    """Issue 60: a workdir under a file printed the raw errno text."""
    from jaxformer.checkpoint.lock import WorkdirLock

    (tmp_path / "afile").write_text("")
    with pytest.raises(ValueError, match=rf"^workdir '{tmp_path}/afile/run' cannot be created: not a "
                                         rf"directory; '{tmp_path}/afile' is a file, not a directory$"):
        WorkdirLock(tmp_path / "afile" / "run").acquire()


def test_checkpoints_names_the_run_meant_in_the_shared_error_form(tmp_path, capsys):
    """Issue 60: every command ends with ``<prog>: error: …`` and exit status 2 for what it refuses
    (``checkpoints`` printed a bare ``error:``), and a workdir typo gets "did you mean"."""
    from jaxformer.cli.checkpoints import main

    (tmp_path / "runs" / "clf" / "checkpoints").mkdir(parents=True)
    (tmp_path / "runs" / "clf" / "config.json").write_text("{}")
    assert main(["--workdir", str(tmp_path / "runs" / "clff")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"python -m jaxformer.cli.checkpoints: error: {tmp_path}/runs/clff/checkpoints is not a "
        f"directory: is '{tmp_path}/runs/clff' a training workdir?; did you mean "
        f"'{tmp_path}/runs/clf'?"]


def test_absl_commands_refuse_in_one_line_with_status_2(tmp_path):
    """Issue 60: ``train`` and ``evaluate`` exited 1 for what they refused (``generate``,
    ``predict``, ``convert`` and ``checkpoints`` 2), and absl's flag errors were a two-line
    "FATAL Flags parsing error" block. One convention: one line, status 2 (docs/training.md;
    ``train.py``: tests/test_train_config.py)."""
    def run(*args):
        return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})

    proc = run("-m", "jaxformer.cli.evaluate", f"--workdir={tmp_path / 'none'}")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == (
        f"python -m jaxformer.cli.evaluate: error: workdir '{tmp_path / 'none'}' does not exist"), (
        proc.stderr[-2000:])
    proc = run("-m", "jaxformer.cli.evaluate", "--bogus")  # absl's own refusal, named the same way
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "python -m jaxformer.cli.evaluate: error: Unknown command line flag 'bogus'"], proc.stderr
