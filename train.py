"""Train any family: ``python train.py --config configs/gpt_pretrain_tiny.py --workdir runs/gpt``.

The command line is `jaxformer.cli.train` (also ``python -m jaxformer.cli.train`` and, installed,
``jaxformer-train``): its docstring lists the flags, overrides (``--config.x=y``), resuming and
``--print_config``.
"""

from jaxformer.cli.train import run

if __name__ == "__main__":
    run()
