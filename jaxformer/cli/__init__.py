"""The command lines, one module per command: ``python -m jaxformer.cli.<command> --help``, or the
installed console script ``jaxformer-<command>`` (`[project.scripts]` in pyproject.toml).

- `train`: train any family from a config file (``python train.py`` at the repository root too)
- `evaluate`: score a finished run on a split or a file, results as JSON (`jaxformer.evaluate_run`)
- `predict`: predictions for a file from a run's checkpoint, as JSONL (`jaxformer.predict`)
- `generate`: print generations from a run's checkpoint (`jaxformer.decode`)
- `answer`: answer questions about a context with an extractive-QA run (`jaxformer.decode.span`)
- `checkpoints`: list a run's checkpoints, verified, and remove the damaged (`jaxformer.checkpoint`)
- `plan`: memory and FLOPs of a config or preset, nothing allocated (`jaxformer.plan`)
- `compile`: compile the train step for a TPU topology this host lacks (`jaxformer.compile`)
- `convert`: a Hugging Face directory to a jaxformer checkpoint, or back (`jaxformer.convert`)

Each module holds flag definitions, ``main(argv)`` and ``run()`` (what the console script calls);
the work itself is in the library module named above. Nothing in the library imports this package.
Importing it, which every command does first, calls `jaxformer.host.skip_absent_tpu`: on a host
with libtpu installed but no TPU chip, JAX then starts only the CPU backend, without libtpu's failed
start and the lines it prints.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path

from absl import app, flags
from absl import logging as absl_logging

from jaxformer.host import skip_absent_tpu

skip_absent_tpu()  # before any command asks JAX for devices


def run_absl(main: Callable[[list[str]], object], module_name: str) -> None:
    """``absl.app.run(main)`` for the command module ``module_name``, with its ``--help`` whatever
    started it. absl's help prints the ``__main__`` module's docstring and key flags; started by a
    console script or the root ``train.py``, ``__main__`` is that wrapper, not the command module,
    so the command's docstring and key flags are lent to it first."""
    command, entry = sys.modules[module_name], sys.modules["__main__"]
    if entry is not command:
        entry.__doc__ = command.__doc__
        for flag in flags.FLAGS.get_key_flags_for_module(command):
            flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)

    def with_plain_lines(argv: list[str]) -> object:
        plain_own_lines()  # absl's handler exists once app.run has started
        return main(argv)

    app.run(with_plain_lines)


class OwnLinesPlain(logging.Formatter):
    """jaxformer's own log records as plain lines (``warning: optimizer.warmup_steps=…``), among
    the command's other plain lines; other libraries' keep absl's format (``W1128 09:41:20.701422
    … file.py:109] …``), given by ``fallback``."""

    def __init__(self, fallback: logging.Formatter):
        super().__init__()
        self.fallback = fallback

    def format(self, record: logging.LogRecord) -> str:
        if not Path(record.pathname).resolve().is_relative_to(PACKAGE_DIR):
            return self.fallback.format(record)
        text = record.getMessage()
        if record.levelno >= logging.WARNING:
            text = f"{record.levelname.lower()}: {text}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


PACKAGE_DIR = Path(__file__).resolve().parents[1]  # jaxformer/


def plain_own_lines() -> None:
    """Give absl's handler (stderr) the `OwnLinesPlain` format."""
    handler = absl_logging.get_absl_handler()
    handler.setFormatter(OwnLinesPlain(handler.python_handler.formatter))


def report_bad_input(command: str, work: Callable[[], object]) -> int:
    """Run ``work()``; bad input (`ValueError`, `FileNotFoundError`: their messages say what was wrong
    and the fix) prints one line, ``python -m jaxformer.cli.<command>: error: <message>``, to stderr
    and returns exit status 2, instead of a traceback. Returns 0 when ``work`` finishes."""
    try:
        work()
    except (ValueError, FileNotFoundError) as e:
        print(f"python -m jaxformer.cli.{command}: error: {e}", file=sys.stderr)
        return 2
    return 0
