"""Command line: train any family.

    python -m jaxformer.cli.train --config configs/gpt_pretrain_tiny.py --workdir runs/gpt
    python train.py --config configs/gpt_pretrain_tiny.py --workdir runs/gpt   # the same


Override any config key on the command line, e.g. ``--config.num_train_steps=200
--config.model.num_layers=2 --config.init_from=runs/gpt``. Rerunning the same command resumes from
the latest checkpoint in the workdir.

List every config key with its value, its base default and a one-line description (then exit,
training nothing): ``python -m jaxformer.cli.train --config configs/<name>.py --print_config`` (overrides
included, e.g. ``--config.data.seq_len=64``); without ``--config``, the base config's keys. Flags go in
any order (an override may come before ``--config``).

Exit status: 0 done, 2 refused before training (a flag, the config, the data, the workdir), 1 the run
failed (a save, the nonfinite policy, a bad record met mid-run, a busy workdir), 143 preempted after its
checkpoint.
"""

import sys
from pathlib import Path

import jax
from absl import flags, logging

from jaxformer.checkpoint import SaveFailed
from jaxformer.checkpoint.lock import WorkdirBusy
from jaxformer.cli import FAILED, REFUSED, exit_with_error, run_absl
from jaxformer.compilation_cache import enable_compilation_cache
from jaxformer.data.builders.user_files import BadRecord
from jaxformer.parallel.distributed import await_lost_peer, maybe_initialize_distributed
from jaxformer.train.config import base_config, define_config_flag, split_list_options
from jaxformer.train.config.printing import format_config
from jaxformer.train.loop import Trainer


def define_flags() -> None:
    """The flags of this command (absl: defined once per process, by `run`)."""
    define_config_flag("config")
    flags.declare_key_flag("config")  # listed by --help (it is defined in jaxformer.train.config)
    flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and the tokenizer "
                        "(required unless --print_config).")
    flags.DEFINE_bool("print_config", False, "Print every key of the config (value, base default, "
                      "description; overrides applied) and exit without training; without --config, "
                      "the base config's keys.")


def _prog() -> str:
    """How the command was started, for its error lines: ``train.py`` (the root file, or ``python -m
    jaxformer.cli.train``) or ``jaxformer-train``."""
    return Path(sys.argv[0]).name


def config_first(argv: list[str]) -> list[str]:
    """``argv`` with ``--config <file>`` (or ``--config=<file>``) moved to the front, so that an
    override given before it (``--config.num_train_steps=5 --config c.py``) applies to that file:
    ml_collections reads overrides only after the file."""
    for i, arg in enumerate(argv[1:], 1):
        if arg.startswith("--config="):
            return [argv[0], arg, *argv[1:i], *argv[i + 1:]]
        if arg == "--config" and i + 1 < len(argv):
            return [argv[0], *argv[i:i + 2], *argv[1:i], *argv[i + 2:]]
    return argv


def main(argv):
    del argv
    config = flags.FLAGS.config  # overrides applied: their list options split
    config = split_list_options(config) if config is not None else None
    if flags.FLAGS.print_config:
        print(format_config(config if config is not None else base_config()))
        return
    if config is None:
        exit_with_error(_prog(), "--config is required: a configs/<name>.py file (--print_config alone "
                        "lists the base config's keys)")
    if flags.FLAGS.workdir is None:
        exit_with_error(_prog(), "--workdir is required (or --print_config to list the keys)")
    logging.set_verbosity(logging.WARNING)  # Orbax/Grain log every file operation at INFO
    enable_compilation_cache()  # a rerun skips XLA compilation (jaxformer.compilation_cache)
    maybe_initialize_distributed()
    try:
        try:  # a bad config, input, or checkpoint found during set-up: the message names it
            trainer = Trainer(config, flags.FLAGS.workdir)
        except (ValueError, FileNotFoundError) as e:
            exit_with_error(_prog(), e, REFUSED)
        except WorkdirBusy as e:  # another run holds it: nothing wrong with what was given
            exit_with_error(_prog(), e, FAILED)
        try:
            metrics = trainer.run()
        except (FloatingPointError, SaveFailed) as e:  # the nonfinite policy stopped the run (or
            exit_with_error(_prog(), e, FAILED)  # a NaN checkpoint), or a save failed
        except BadRecord as e:  # read by the data pipeline mid-run (set-up reads only some)
            exit_with_error(_prog(), f"{e}; {trainer.ckpt.resume_point()}; fix or remove that "
                            "record and rerun the same command", FAILED)
    except jax.errors.JaxRuntimeError:  # with several processes: a collective whose peer died?
        await_lost_peer()  # if so, the watchdog ends the process with one line naming it
        raise
    print({k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()})
    if "preempted_at_step" in metrics:
        sys.exit(128 + 15)  # "terminated by SIGTERM", after the checkpoint: not a finished run


def run() -> None:
    """The console script (`[project.scripts]`): defines the flags, then absl runs `main` (`run_absl`)."""
    define_flags()
    sys.argv = config_first(sys.argv)
    run_absl(main, __name__, prog=_prog())


if __name__ == "__main__":
    run()
