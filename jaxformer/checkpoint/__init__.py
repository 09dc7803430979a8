"""Checkpoints of a training run: writing, reading, verifying, choosing and locking them.

Layout of a workdir::

    <workdir>/config.json              the full training config of the run (`run_files`)
    <workdir>/metrics.jsonl            one row per logged step (`run_files.read_metrics`)
    <workdir>/tokenizer.model          sentencepiece model used by the run
    <workdir>/.lock                    `lock`: one writer per workdir
    <workdir>/checkpoints/<step>/      Orbax: "state" (TrainState) and "data" (Grain iterator state),
                                       plus jaxformer_manifest.json (`verify`)
                                       and, with checkpoint.best_metric, metrics/metrics (the
                                       step's eval metrics: `select`)
    <workdir>/checkpoints/<step>.damaged   a damaged step set aside by a resume (never read)

One purpose per module: `write` (the `Checkpointer`: save, refuse NaN, report a failed save,
restore on a resume), `preemption` (SIGTERM), `read` (resolve a path to a step, open a run, load
its parameters for fine-tuning and inference), `run_files` (``config.json``, ``metrics.jsonl``),
`verify` (manifests of checksums, structure checks), `select` (committed steps, the best one,
retention), `lock` (the workdir lock), `bare_run` (a bare parameter tree written as a run: converted
models), `orbax_arrays` (how Orbax writes ``jax.Array`` leaves). ``python -m jaxformer.cli.checkpoints``
lists and cleans a run's checkpoints.

This package sits below `jaxformer.train`: it reads a run from its files alone, with the model
config, the parameter table and the LoRA merge (`jaxformer.models.lora`), never the trainer.
"""

from jaxformer.checkpoint.bare_run import load_params, save_params
from jaxformer.checkpoint.lock import WorkdirBusy, WorkdirLock
from jaxformer.checkpoint.preemption import PreemptionWatch
from jaxformer.checkpoint.read import (
    SavedRun,
    load_checkpoint_params,
    load_for_inference,
    load_run_params,
    open_run,
    resolve_checkpoint,
    with_shardings,
)
from jaxformer.checkpoint.run_files import load_run_config, read_metrics, save_run_config
from jaxformer.checkpoint.verify import CheckpointDamaged, StateMismatch
from jaxformer.checkpoint.write import Checkpointer, SaveFailed

__all__ = [
    "CheckpointDamaged", "Checkpointer", "PreemptionWatch", "SaveFailed", "SavedRun",
    "StateMismatch", "WorkdirBusy", "WorkdirLock", "load_checkpoint_params", "load_for_inference",
    "load_params", "load_run_config", "load_run_params", "open_run", "read_metrics",
    "resolve_checkpoint", "save_params", "save_run_config", "with_shardings",
]
