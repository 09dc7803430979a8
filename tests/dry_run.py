"""Read command lines as their programs would, and stop there (tests/test_docs.py's dry runs).

Each program runs as ``python`` would start it (``runpy``), up to its own argument parsing: absl's
(``app.run``'s flag parser: an unknown flag or a bad value is refused, and ``train.py``'s config file
is loaded with its ``--config.*`` overrides, then checked whole by `validate_config`) or argparse's
(``parse_args``); the work after it is never started. So a renamed flag, a stale config key or an
override of the wrong type fails here without training, converting or compiling anything.

Usage: ``python tests/dry_run.py`` with a JSON list of argv lists on stdin (each ``["train.py",
...]``, ``["-m", "jaxformer.cli.evaluate", ...]`` or ``["bench/x.py", ...]``, as after ``python``);
prints one JSON object per line: ``{"argv": ..., "error": null | "<what the program printed>"}``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import runpy
import sys

from absl import app, flags


class Parsed(Exception):
    """The program's arguments were read without error: the dry run stops here."""


_parse_args = argparse.ArgumentParser.parse_args


def _argparse_then_stop(self, args=None, namespace=None):
    _parse_args(self, args, namespace)  # an unknown flag or a bad value: SystemExit(2), a message
    raise Parsed


def _absl_then_stop(main, argv=None, flags_parser=None):
    (flags_parser or flags.FLAGS)(sys.argv if argv is None else argv)
    if "print_config" in flags.FLAGS and "config" in flags.FLAGS:  # train: the config, checked whole
        from jaxformer.train.config import split_list_options
        from jaxformer.train.config.validation import validate_config

        if flags.FLAGS.config is not None:
            validate_config(split_list_options(flags.FLAGS.config))
    raise Parsed


def dry_run(argv: list[str], base_flags: set[str]) -> str | None:
    """None if ``argv`` (after ``python``) is read without error, else what the program printed."""
    for name in set(flags.FLAGS) - base_flags:  # the previous program's flags
        delattr(flags.FLAGS, name)
    flags.FLAGS.unparse_flags()
    module = argv[1] if argv[0] == "-m" else None
    sys.argv = [argv[0] if module is None else module, *argv[2 if module else 1:]]
    out = io.StringIO()
    try:
        with contextlib.redirect_stderr(out), contextlib.redirect_stdout(out):
            if module:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(argv[0], run_name="__main__")
    except Parsed:
        return None
    except SystemExit as e:
        return None if e.code in (0, None) else out.getvalue().strip() or f"exit status {e.code}"
    except Exception as e:  # noqa: BLE001 - reported, with its type, as the dry run's failure
        return f"{type(e).__name__}: {e}\n{out.getvalue()}".strip()
    return f"ran to the end without parsing its arguments:\n{out.getvalue()}"


def main() -> None:
    argparse.ArgumentParser.parse_args = _argparse_then_stop
    app.run = _absl_then_stop
    base_flags = set(flags.FLAGS)
    for argv in json.load(sys.stdin):
        print(json.dumps({"argv": argv, "error": dry_run(argv, base_flags)}), flush=True)


if __name__ == "__main__":
    main()
