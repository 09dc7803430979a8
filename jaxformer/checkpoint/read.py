"""Reading checkpoints back, for fine-tuning (``init_from``), inference, evaluation and export.

`resolve_checkpoint` turns a path (a workdir, its ``checkpoints`` dir or one step dir) plus
``step=`` / ``best=`` into the step every reader opens; `open_run` verifies it (`SavedRun`); then
`load_checkpoint_params` reads the parameters alone (never the optimizer moments),
`load_run_params` merges a LoRA run into its base, and `load_for_inference` gives (ModelConfig,
params, tokenizer). Nothing here needs the trainer: a run is read from its files alone.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from jaxformer.checkpoint.run_files import load_run_config, workdir_hint
from jaxformer.checkpoint.select import best_step, committed_steps
from jaxformer.checkpoint.verify import read_manifest, verify_for_reading, verify_tokenizer
from jaxformer.config import ModelConfig
from jaxformer.data.tokenizer import Tokenizer
from jaxformer.models import lora
from jaxformer.models.spec import model_spec


def with_shardings(abstract, shardings):
    """Attach shardings to a tree of ShapeDtypeStructs (Orbax restores directly into them)."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract, shardings)



def resolve_checkpoint(path: str | os.PathLike, *, step: int | None = None, best: bool = False
                       ) -> tuple[Path, int]:
    """``path`` = a workdir, its ``checkpoints`` dir, or one step dir ``<run>/checkpoints/<N>`` →
    (checkpoints dir, step): the latest step, ``step``, or with ``best`` the best by the run's
    ``checkpoint.best_metric`` (`jaxformer.checkpoint.select.best_step`). A step that is
    not there is a FileNotFoundError listing the steps that are."""
    if best and step is not None:
        raise ValueError(f"choose a step ({step}) or the best checkpoint, not both")
    p = Path(path).absolute()
    if (p / "checkpoints").is_dir() or committed_steps(p):
        ckpt_dir = p / "checkpoints" if (p / "checkpoints").is_dir() else p
    elif p.name.isdigit() and committed_steps(p.parent):  # a step dir, there or not
        ckpt_dir, named = p.parent, int(p.name)
        if best or step not in (None, named):
            raise ValueError(f"{str(path)!r} is step {named}; give the run {str(ckpt_dir.parent)!r}"
                             f" to choose {'the best step' if best else f'step {step}'}")
        step = named
    elif not p.exists():
        raise FileNotFoundError(f"{str(path)!r} does not exist{workdir_hint(p)}")
    else:
        raise FileNotFoundError(
            f"no checkpoint found under {str(path)!r} (expected <workdir>/checkpoints/<step>)")
    steps = committed_steps(ckpt_dir)
    if not steps:
        raise FileNotFoundError(f"no checkpoint found under {str(path)!r} (its {ckpt_dir.name} "
                                "directory holds no step)")
    if best:
        return ckpt_dir, best_step(ckpt_dir, steps, load_run_config(ckpt_dir.parent)["checkpoint"])
    if step is None:
        return ckpt_dir, steps[-1]
    if step not in steps:
        raise FileNotFoundError(f"{ckpt_dir} has no step {step}: its steps are {steps} (a run "
                                "keeps the checkpoint.keep latest and the best by "
                                "checkpoint.best_metric)")
    return ckpt_dir, step


def load_checkpoint_params(path: str | os.PathLike, *, verified: bool = False) -> dict:
    """Parameters (host numpy arrays) of the latest checkpoint under ``path``, verified first (unless
    the caller just did: ``verified``); only the ``params`` subtree of the saved TrainState is read
    (Orbax partial restore): never the optimizer moments."""
    ckpt_dir, step = resolve_checkpoint(path)
    if not verified:
        verify_for_reading(ckpt_dir, step)
    item = ckpt_dir / str(step) / "state"
    handler = ocp.PyTreeCheckpointHandler()  # the item's own handler: the step-level metadata
    try:                                     # file lives one level up, so no Checkpointer here
        tree = handler.metadata(item)
        target = {"params": jax.tree.map(lambda m: np.zeros(m.shape, m.dtype), tree["params"])}
        restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), target)
        restored = handler.restore(item, args=ocp.args.PyTreeRestore(
            item=target, restore_args=restore_args, partial_restore=True))
    finally:
        handler.close()
    return restored["params"]


@dataclasses.dataclass(frozen=True)
class SavedRun:
    """The newest checkpoint under a path, verified: what fine-tuning and inference read.

    Attributes:
      run_config: the run's training config (its ``config.json``, or the checkpoint's copy).
      step_dir: ``<run>/checkpoints/<step>``; its parameters: `load_checkpoint_params`.
      manifest: the step's manifest of checksums (None for checkpoints older than manifests).
      tokenizer: the run's ``tokenizer.model``, checked against the manifest; None if it has none.
    """

    run_config: dict
    step_dir: Path
    manifest: dict | None
    tokenizer: Path | None


def open_run(path: str | os.PathLike, *, step: int | None = None, best: bool = False,
             verify: bool = True) -> SavedRun:
    """The checkpoint under ``path`` (a workdir, its ``checkpoints`` dir or one step dir) that
    `resolve_checkpoint` picks (the latest, ``step``, or the ``best``), its parameters not read.
    ``verify``: check every file first (`CheckpointDamaged` names the damaged one); else only the
    manifest is read (`load_checkpoint_params` verifies)."""
    if not Path(path).is_dir() and not Path(path).name.isdigit():  # (a missing step: its run's
        load_run_config(path)  # steps are listed) raises "<path>/config.json not found: …"
    ckpt_dir, step = resolve_checkpoint(path, step=step, best=best)
    manifest = (verify_for_reading(ckpt_dir, step) if verify
                else read_manifest(ckpt_dir / str(step)))
    run_dir = ckpt_dir.parent
    return SavedRun(load_run_config(run_dir, manifest), ckpt_dir / str(step), manifest,
                    verify_tokenizer(run_dir, manifest, required=False))


def load_run_params(run: SavedRun) -> Any:
    """The parameters ``run``'s model applies, verified; a LoRA run's adapters and heads merged into
    its ``init_from``'s (`lora.inference_params`, the model's parts from its parameter table
    `jaxformer.models.spec.model_spec`; a Hugging Face base: `jaxformer.convert.lora.load_merged`)."""
    params, c = load_checkpoint_params(run.step_dir, verified=True), run.run_config
    if not lora.is_lora(c):
        return params
    base = open_run(c["init_from"], step=c.get("init_from_step") or None,
                    best=bool(c.get("init_from_best")), verify=False)  # verified as it is read
    return lora.inference_params(load_checkpoint_params(base.step_dir), params,
                                 c["optimizer"]["lora"], model_spec(ModelConfig.from_dict(c["model"])))


def load_for_inference(workdir: str | os.PathLike, *, step: int | None = None, best: bool = False
                       ) -> tuple[ModelConfig, Any, Tokenizer | None]:
    """(ModelConfig, params, tokenizer or None) of a checkpoint of a training workdir (or of one
    step dir): the latest, ``step`` or the ``best`` (`resolve_checkpoint`), verified
    (`CheckpointDamaged` names the damaged file); a LoRA run's merged: `load_run_params`."""
    run = open_run(workdir, step=step, best=best)
    tokenizer = None if run.tokenizer is None else Tokenizer.load(str(run.tokenizer))
    return (ModelConfig.from_dict(run.run_config["model"]),
            jax.tree.map(jnp.asarray, load_run_params(run)), tokenizer)
