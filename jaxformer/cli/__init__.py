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
- `tokenize`: a data source tokenized once into ArrayRecord shards of ids (`jaxformer.data.token_shards`)

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
from typing import NoReturn

from absl import app, flags
from absl import logging as absl_logging

from jaxformer.host import skip_absent_tpu

skip_absent_tpu()  # before any command asks JAX for devices


# Exit statuses, the same for every command (docs/training.md, "Exit statuses"), argparse's convention:
REFUSED = 2  # what was given was refused before any work: a flag, the config, data, workdir, checkpoint
FAILED = 1  # the work started and failed: a save (disk full), divergence, a busy workdir, a lost peer


def error_line(prog: str, message: object) -> str:
    """``<prog>: error: <message>`` on one line (argparse's form), the line every command ends with."""
    return f"{prog}: error: {' '.join(str(message).split())}"


def exit_with_error(prog: str, message: object, status: int = REFUSED) -> NoReturn:
    """Print `error_line` to stderr and exit with ``status`` (`REFUSED` or `FAILED`)."""
    print(error_line(prog, message), file=sys.stderr)
    sys.exit(status)


def run_absl(main: Callable[[list[str]], object], module_name: str, prog: str | None = None) -> None:
    """``absl.app.run(main)`` for the command module ``module_name``, with its ``--help`` whatever
    started it, and a flag that cannot be parsed (a bad value, an unknown flag, a config file that
    gives no config) reported as one `error_line`, exit status `REFUSED`, instead of absl's
    "FATAL Flags parsing error" block (exit 1). absl's help prints the ``__main__`` module's
    docstring and key flags; started by a console script or the root ``train.py``, ``__main__`` is
    that wrapper, not the command module, so the command's docstring and key flags are lent to it
    first. ``prog`` names the command in error lines (default ``python -m <module_name>``)."""
    command, entry = sys.modules[module_name], sys.modules["__main__"]
    if entry is not command:
        entry.__doc__ = command.__doc__
        for flag in flags.FLAGS.get_key_flags_for_module(command):
            flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    spec = getattr(command, "__spec__", None)  # started as ``python -m``: module_name is __main__
    prog = prog or f"python -m {spec.name if spec else module_name}"

    def parse(argv: list[str]) -> list[str]:
        try:
            return flags.FLAGS(argv)
        except flags.Error as e:  # a config that cannot be built (ConfigError) is
            from jaxformer.train.config.loading import ConfigError  # the message; absl adds its flag
            cause = e.__context__
            exit_with_error(prog, cause if isinstance(cause, ConfigError) else e)

    def with_plain_lines(argv: list[str]) -> object:
        plain_own_lines()  # absl's handler exists once app.run has started
        return main(argv)

    app.run(with_plain_lines, flags_parser=parse)


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
    and the fix) prints one `error_line`, ``python -m jaxformer.cli.<command>: error: <message>``, to
    stderr and returns `REFUSED`, instead of a traceback. Returns 0 when ``work`` finishes."""
    try:
        work()
    except (ValueError, FileNotFoundError) as e:
        print(error_line(f"python -m jaxformer.cli.{command}", e), file=sys.stderr)
        return REFUSED
    return 0
