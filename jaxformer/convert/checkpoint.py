"""The jaxformer side of a conversion: a directory in the trainer's own workdir layout.

``directory`` looks like a training run that stopped at step 0::

    config.json                 {"model": ModelConfig fields, ...}
    checkpoints/0/state/        Orbax: {"params": ...}
    tokenizer.model             when the source model ships a sentencepiece model (T5)

so ``train.py --config.init_from=<directory>``, ``python -m jaxformer.generate --workdir
<directory>`` and ``--from <any training workdir>`` all work without another format.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from jaxformer.config import ModelConfig


def save_params(directory: str | os.PathLike, model_cfg: ModelConfig | dict[str, Any],
                params: dict) -> None:
    """Write ``config.json`` and ``checkpoints/0`` under ``directory`` (which must not hold a run)."""
    import orbax.checkpoint as ocp

    cfg = model_cfg if isinstance(model_cfg, ModelConfig) else ModelConfig.from_dict(model_cfg)
    d = Path(directory).absolute()
    if (d / "checkpoints").exists():
        raise ValueError(f"{d / 'checkpoints'} already exists; choose an empty directory")
    d.mkdir(parents=True, exist_ok=True)
    with ocp.CheckpointManager(d / "checkpoints") as mngr:
        mngr.save(0, args=ocp.args.Composite(state=ocp.args.StandardSave({"params": params})))
        mngr.wait_until_finished()
    (d / "config.json").write_text(json.dumps({"name": "converted", "model": cfg.to_dict()},
                                              indent=2, sort_keys=True))


def load_params(directory: str | os.PathLike) -> tuple[dict[str, Any], dict]:
    """(ModelConfig fields, params as NumPy arrays) of the latest checkpoint of a jaxformer
    directory: one written by `save_params` or any training workdir."""
    from jaxformer.train.checkpoint import load_params as load_latest
    from jaxformer.train.checkpoint import load_run_config

    cfg = ModelConfig.from_dict(load_run_config(directory)["model"])
    return cfg.to_dict(), load_latest(directory)
