"""Train any family: ``python train.py --config configs/gpt_pretrain_tiny.py --workdir runs/gpt``.

Override any config key on the command line, e.g. ``--config.num_train_steps=200
--config.model.num_layers=2 --config.init_from=runs/gpt``. Rerunning the same command resumes from
the latest checkpoint in the workdir.
"""

import sys

from absl import app, flags

from jaxformer.train.config import define_config_flag

define_config_flag("config")
flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and the tokenizer.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    from absl import logging

    logging.set_verbosity(logging.WARNING)  # Orbax/Grain log every file operation at INFO
    from jaxformer.parallel.distributed import maybe_initialize_distributed
    from jaxformer.train.loop import Trainer

    maybe_initialize_distributed()
    try:
        trainer = Trainer(flags.FLAGS.config, flags.FLAGS.workdir)
    except (ValueError, FileNotFoundError) as e:  # a bad config or input, found during set-up:
        sys.exit(f"train.py: error: {e}")         # the message names the field, no traceback
    metrics = trainer.run()
    print({k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()})
    if "preempted_at_step" in metrics:
        sys.exit(128 + 15)  # "terminated by SIGTERM", after the checkpoint: not a finished run


if __name__ == "__main__":
    app.run(main)
