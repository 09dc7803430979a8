"""Reference values of the legacy checkpoint fixture, computed in the environment that wrote it.

Run from a checkout of the previous release (commit 8116153, Python 3.11, jax 0.10.2, orbax
0.12.4, flax 0.12.8; see README.md)::

    PYTHONPATH=<old checkout> python make_reference.py <workdir> reference.json

It never writes into ``<workdir>``: the resume check trains a copy. Also imported by
``tests/test_legacy_checkpoint.py`` for `OVERRIDES`, `TOKENS` and `params_sha256`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

# train.py flags the fixture was made with (--config configs/gpt_pretrain_tiny.py).
OVERRIDES = {"model.vocab_size": 384, "model.d_model": 16, "model.num_heads": 2, "model.d_ff": 32,
             "model.num_layers": 1, "model.max_len": 32, "data.tokenizer.vocab_size": 384,
             "data.tokenizer.max_train_texts": 500, "data.seq_len": 16, "data.batch_size": 2,
             "checkpoint.every_steps": 2, "checkpoint.async_save": False, "eval.num_batches": 2,
             "eval.every_steps": 4, "log_every_steps": 1, "progress_bar": False,
             "optimizer.warmup_steps": 2}
STEPS, RESUMED_STEPS = 4, 6
TOKENS = [[2, 17, 45, 99, 120, 7, 301, 5], [2, 260, 3, 88, 14, 14, 200, 383]]  # fixed prompt ids


def params_sha256(params) -> str:
    """sha256 over every parameter (sorted by path): path, dtype, shape and raw bytes."""
    import jax

    h = hashlib.sha256()
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    for path, x in sorted(leaves, key=lambda kv: jax.tree_util.keystr(kv[0])):
        x = np.asarray(x)
        h.update(f"{jax.tree_util.keystr(path)}|{x.dtype}|{x.shape}|".encode())
        h.update(np.ascontiguousarray(x).tobytes())
    return h.hexdigest()


def make_config(root: Path, num_train_steps: int):
    import importlib.util

    from jaxformer.train.config import complete_config, set_key

    spec = importlib.util.spec_from_file_location("cfg", root / "configs" / "gpt_pretrain_tiny.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = complete_config(module.get_config())
    for key, value in {**OVERRIDES, "num_train_steps": num_train_steps}.items():
        set_key(config, key, value)
    return config


def main(workdir: str, out: str) -> None:
    import jax
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    import jaxformer
    from jaxformer.checkpoint import Checkpointer, load_for_inference, read_metrics
    from jaxformer.models import build_model
    from jaxformer.train.loop import Trainer

    root = Path(jaxformer.__file__).resolve().parents[1]
    model_cfg, params, _ = load_for_inference(workdir)
    logits = build_model(model_cfg).apply(params, jnp.asarray(TOKENS, jnp.int32))
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "run"
        shutil.copytree(workdir, copy)
        ckpt = Checkpointer(copy, async_save=False)
        step = ckpt.latest_step()
        ckpt.close()
        trainer = Trainer(make_config(root, RESUMED_STEPS), copy)  # resumes: state + iterator
        state = jax.device_get(trainer.state)
        resumed_at = trainer.train_iter.get_state()
        next_batch = next(trainer.train_iter)
        trainer.train_iter.set_state(resumed_at)  # step 5 trains on that batch
        trainer.run()
        resumed = {r["step"]: r["loss"] for r in read_metrics(copy) if r["step"] > STEPS}
    ref = {
        "made_with": {"jax": jax.__version__, "orbax-checkpoint": ocp.__version__,
                      "python": sys.version.split()[0], "jaxformer_commit": "8116153"},
        "overrides": OVERRIDES,
        "latest_step": step,
        "state_step": int(state.step),
        "rng": [int(v) for v in np.asarray(state.rng)],
        "params_sha256": params_sha256(params),
        "num_params": int(sum(np.size(x) for x in jax.tree.leaves(params))),
        "tokens": TOKENS,
        "logits_shape": list(logits.shape),
        "logits_sum": float(np.sum(np.asarray(logits, np.float64))),
        "logits_first_48": np.asarray(logits[..., :48], np.float64).round(7).tolist(),
        "next_batch_inputs": np.asarray(next_batch["inputs"]).tolist(),
        "resumed_losses": {str(k): v for k, v in sorted(resumed.items())},
    }
    lines = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in ref.items()]
    Path(out).write_text("{\n" + ",\n".join(lines) + "\n}\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
