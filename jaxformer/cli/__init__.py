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
"""
