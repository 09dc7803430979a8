"""The jaxformer side of a conversion: a model config and its params on disk.

Layout of ``directory``::

    model_config.json   ModelConfig fields (`ModelConfig.to_dict`)
    params/             the params pytree, written by `orbax.checkpoint.StandardCheckpointer`

This is the only place the converter touches jaxformer checkpoints; point it at the trainer's own
format (``jaxformer.train.checkpoint``) once that exists.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax

from jaxformer.config import ModelConfig
from jaxformer.convert.mapping import unflatten

CONFIG_FILE = "model_config.json"
PARAMS_DIR = "params"


def save_params(directory: str | os.PathLike, model_cfg: ModelConfig | dict[str, Any],
                params: dict) -> None:
    """Write ``model_config.json`` and ``params/`` under ``directory`` (without ``params/`` yet)."""
    import orbax.checkpoint as ocp

    cfg = model_cfg if isinstance(model_cfg, ModelConfig) else ModelConfig.from_dict(model_cfg)
    d = os.path.abspath(os.fspath(directory))
    if os.path.exists(os.path.join(d, PARAMS_DIR)):
        raise ValueError(f"{os.path.join(d, PARAMS_DIR)} already exists; choose an empty directory")
    os.makedirs(d, exist_ok=True)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(os.path.join(d, PARAMS_DIR), params)
        ckptr.wait_until_finished()
    with open(os.path.join(d, CONFIG_FILE), "w") as f:
        json.dump(cfg.to_dict(), f, indent=2, sort_keys=True)


def load_params(directory: str | os.PathLike) -> tuple[dict[str, Any], dict]:
    """(ModelConfig fields, params as NumPy arrays) from a directory written by `save_params`."""
    import orbax.checkpoint as ocp

    from jaxformer.convert.hf import param_shapes  # the expected tree restores NumPy leaves

    d = os.path.abspath(os.fspath(directory))
    cfg_path = os.path.join(d, CONFIG_FILE)
    if not os.path.isfile(cfg_path) or not os.path.isdir(os.path.join(d, PARAMS_DIR)):
        raise ValueError(f"{d} is not a converted jaxformer checkpoint: expected {CONFIG_FILE} "
                         f"and {PARAMS_DIR}/")
    with open(cfg_path) as f:
        cfg = ModelConfig.from_dict(json.load(f))
    target = unflatten({p: jax.ShapeDtypeStruct(s.shape, s.dtype)
                        for p, s in param_shapes(cfg).items()})
    with ocp.StandardCheckpointer() as ckptr:
        params = ckptr.restore(os.path.join(d, PARAMS_DIR), target)
    return cfg.to_dict(), params
