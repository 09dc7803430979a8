"""Orbax checkpoints: save/resume the train state with the data iterator, and fine-tune from them.

Layout of a workdir::

    <workdir>/config.json              the full training config of the run
    <workdir>/tokenizer.model          sentencepiece model used by the run
    <workdir>/checkpoints/<step>/      Orbax: "state" (TrainState) and "data" (Grain iterator state)

Orbax writes each step to a temporary directory and renames it when complete, so a killed run never
leaves a half-written checkpoint; `Checkpointer.save` additionally refuses non-finite parameters.

Orbax API. orbax-checkpoint 0.12.8 ships its v1 API only as ``orbax.checkpoint.experimental.v1``
(there is no ``orbax.checkpoint.v1``), and its ``experimental/README.md`` says those APIs are
"subject to change without notice"; its ``training.Checkpointer`` is itself a wrapper that builds
the v0 ``CheckpointManager`` (same on-disk layout). v1 covers retention/best-N, async saves, Grain
iterators (``StatefulCheckpointable``) and sharded loads, but its Checkpointer has no equivalent of
``CheckpointManager.reached_preemption(step)``, which the loop uses so that every process saves the
same step and stops after a multi-host preemption. So this module uses the v0
``CheckpointManager`` with ``args=`` items and a ``preservation_policy``, the non-deprecated form
in 0.12.8 (no DeprecationWarning and no ``/jax/orbax/deprecation/*`` event: see
``tests/test_legacy_checkpoint.py``). Checkpoints written by jaxformer 8116153 (jax 0.10.2, orbax
0.12.4) restore unchanged (``tests/data/legacy_gpt_jax010``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

HEAD_MODULES = ("lm_head", "mlm_head", "classifier", "token_classifier", "pooler", "nsp_head")


def _grain_args():
    import grain

    return grain.checkpoint.CheckpointSave, grain.checkpoint.CheckpointRestore


@jax.jit
def _all_finite(tree) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
              if jnp.issubdtype(x.dtype, jnp.floating)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


class Checkpointer:
    """Keeps the last ``keep`` checkpoints (plus the best by ``best_metric`` when given)."""

    def __init__(self, workdir: str | os.PathLike, *, keep: int = 3, best_metric: str | None = None,
                 best_mode: str = "min", async_save: bool = True):
        from orbax.checkpoint import checkpoint_managers as cm

        policies = [cm.LatestN(keep)]
        if best_metric:
            policies.append(cm.BestN(get_metric_fn=lambda m: m[best_metric], n=1,
                                     reverse=best_mode == "min"))
        options = ocp.CheckpointManagerOptions(
            preservation_policy=cm.AnyPreservationPolicy(policies),
            enable_async_checkpointing=async_save, create=True)
        self.directory = Path(workdir).absolute() / "checkpoints"
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, data_iter=None, metrics: dict | None = None) -> None:
        if not bool(_all_finite(state.params)):
            raise FloatingPointError(
                f"refusing to checkpoint step {step}: parameters contain NaN/Inf (training diverged; "
                f"the last good checkpoint is step {self.latest_step()}). Lower the learning rate or "
                "enable clipping (optimizer.clip_norm).")
        items = {"state": ocp.args.StandardSave(state)}
        if data_iter is not None and hasattr(data_iter, "get_state"):
            items["data"] = _grain_args()[0](data_iter)
        self.manager.save(step, args=ocp.args.Composite(**items), metrics=metrics)

    def restore(self, abstract_state, data_iter=None, step: int | None = None):
        """Restore onto ``abstract_state``'s shardings (any mesh); returns (state, step)."""
        step = self.latest_step() if step is None else step
        items = {"state": ocp.args.StandardRestore(abstract_state)}
        has_data = (self.directory / str(step) / "data").is_dir()
        if data_iter is not None and hasattr(data_iter, "set_state") and has_data:
            items["data"] = _grain_args()[1](data_iter)
        restored = self.manager.restore(step, args=ocp.args.Composite(**items))
        return restored["state"], step

    def preempted(self, step: int, signalled: bool) -> bool:
        """Whether to checkpoint ``step`` and stop because the job is being preempted: with several
        processes JAX's preemption sync point (every process answers True at the same step, so all
        save it together); with one, ``signalled`` (a SIGTERM seen by `PreemptionWatch`)."""
        if jax.process_count() > 1:
            return self.manager.reached_preemption(step)
        return signalled

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


class PreemptionWatch:
    """Records SIGTERM (what TPU/GPU schedulers send before preempting a job) while training, so
    the loop can checkpoint the current step and stop instead of losing the steps since the last
    periodic checkpoint. Installed only in the main thread of a single-process run (with several
    processes JAX's coordination service watches for the signal: `Checkpointer.preempted`);
    `restore` puts the previous handler back."""

    def __init__(self) -> None:
        import signal
        import threading

        self.signalled, self._installed, self._previous = False, False, None
        if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._installed = True

    def _handle(self, signum, frame) -> None:
        self.signalled = True

    def restore(self) -> None:
        import signal

        if self._installed:  # None: the previous handler was not set from Python → the default
            signal.signal(signal.SIGTERM, signal.SIG_DFL if self._previous is None else self._previous)
            self._installed = False


def with_shardings(abstract, shardings):
    """Attach shardings to a tree of ShapeDtypeStructs (Orbax restores directly into them)."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract, shardings)


# --------------------------------------------------------------------------------------------------
# Reading checkpoints back: for fine-tuning (init_from) and inference.


def resolve_checkpoint(path: str | os.PathLike) -> tuple[Path, int]:
    """``path`` = a workdir, its ``checkpoints`` dir, or one step dir → (checkpoints dir, step)."""
    p = Path(path).absolute()
    if not p.exists():
        raise FileNotFoundError(f"init_from={str(path)!r} does not exist")
    for d in (p / "checkpoints", p):
        if d.is_dir():
            steps = sorted(int(c.name) for c in d.iterdir() if c.name.isdigit())
            if steps:
                return d, steps[-1]
    if p.name.isdigit() and p.parent.is_dir():
        return p.parent, int(p.name)
    raise FileNotFoundError(
        f"no checkpoint found under {str(path)!r} (expected <workdir>/checkpoints/<step>)")


def load_params(path: str | os.PathLike) -> dict:
    """Parameters (host numpy arrays) of the latest checkpoint under ``path``; no optimizer state.

    Reads only the ``params`` subtree of the saved TrainState (Orbax partial restore), so the
    optimizer moments are never loaded.
    """
    ckpt_dir, step = resolve_checkpoint(path)
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


def _flat(tree) -> dict[tuple[str, ...], Any]:
    return {tuple(str(k.key) for k in path): v
            for path, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def merge_backbone(new_params, pretrained, *, head_modules: Iterable[str] = HEAD_MODULES):
    """Copy every pretrained parameter into ``new_params``; keep fresh init only for new heads.

    Raises ValueError naming the parameter path when a shape differs, or when a non-head parameter
    of the new model is missing from the checkpoint. Returns (merged params, list of fresh paths).
    """
    new_flat, old_flat = _flat(new_params), _flat(pretrained)
    fresh, merged = [], {}
    for path, value in new_flat.items():
        name = "/".join(path)
        if path in old_flat:
            old = old_flat[path]
            if tuple(old.shape) != tuple(value.shape):
                raise ValueError(f"init_from: parameter {name} has shape {tuple(old.shape)} in the "
                                 f"checkpoint but {tuple(value.shape)} in the model")
            merged[path] = np.asarray(old, dtype=value.dtype)  # on the host until sharded
        elif path[0] in head_modules:
            merged[path] = value
            fresh.append(name)
        else:
            raise ValueError(f"init_from: backbone parameter {name} (shape {tuple(value.shape)}) is "
                             f"missing from the checkpoint; {_layout_hint(path, old_flat)}")
    leaves = [merged[p] for p in new_flat]
    return jax.tree_util.tree_unflatten(jax.tree.structure(new_params), leaves), fresh


def _layout_hint(missing: tuple[str, ...], old_flat: dict) -> str:
    """Why a parameter may be missing: a scanned (``layers``) vs unrolled (``layer_i``) stack."""
    scanned_old = any("layers" in p for p in old_flat)
    scanned_new = "layers" in missing
    if scanned_old != scanned_new:
        return (f"the checkpoint's layers are {'stacked' if scanned_old else 'unrolled'}: set "
                f"model.scan_layers={scanned_old} to read it")
    return "is the architecture the same?"


def save_run_config(workdir: str | os.PathLike, config) -> None:
    path = Path(workdir) / "config.json"
    path.write_text(json.dumps(config.to_dict() if hasattr(config, "to_dict") else dict(config),
                               indent=2, sort_keys=True, default=str))


def load_run_config(workdir: str | os.PathLike) -> dict:
    path = Path(workdir) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {workdir!r} a jaxformer training workdir?")
    return json.loads(path.read_text())


def load_for_inference(workdir: str | os.PathLike):
    """(ModelConfig, params, tokenizer or None) of the latest checkpoint of a training workdir."""
    from jaxformer.config import ModelConfig

    cfg = load_run_config(workdir)
    model_cfg = ModelConfig.from_dict(cfg["model"])
    params = jax.tree.map(jnp.asarray, load_params(workdir))
    tok_path = Path(workdir) / "tokenizer.model"
    tokenizer = None
    if tok_path.exists():
        from jaxformer.data.tokenizer import Tokenizer

        tokenizer = Tokenizer.load(str(tok_path))
    return model_cfg, params, tokenizer
