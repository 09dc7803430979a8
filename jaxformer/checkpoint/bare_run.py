"""A bare parameter tree written as a run (the jaxformer side of a conversion), and read back.

``directory`` looks like a training run that stopped at step 0::

    config.json                 {"model": ModelConfig fields, ...}
    checkpoints/0/state/        Orbax: {"params": ...}
    tokenizer.model             the source model's tokenizer: sentencepiece (T5, Llama 2) or Hugging
                                Face (Llama 3, RoBERTa, BART, DistilBERT, …:
                                `jaxformer.data.fast_tokenizer`)

so ``train.py --config.init_from=<directory>``, ``python -m jaxformer.cli.generate --workdir
<directory>`` and ``--from <any training workdir>`` all work without another format.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from jaxformer.checkpoint.read import load_checkpoint_params, open_run
from jaxformer.checkpoint.run_files import save_run_config
from jaxformer.checkpoint.write import Checkpointer
from jaxformer.config import ModelConfig
from jaxformer.data.fast_tokenizer import is_saved_fast_tokenizer
from jaxformer.data.tokenizer import Tokenizer


def save_params(directory: str | os.PathLike, model_cfg: ModelConfig | dict[str, Any],
                params: dict, tokenizer: str | os.PathLike | None = None,
                objective: dict[str, Any] | None = None) -> None:
    """Write ``config.json``, ``tokenizer.model`` (``tokenizer``, when given: a SentencePiece model,
    copied; or a Hugging Face ``tokenizer.json`` or tokenizer directory,
    `jaxformer.convert.hf_io.find_tokenizer`, as `jaxformer.data.fast_tokenizer.FastTokenizer.save`
    writes it) and a verified ``checkpoints/0`` under ``directory`` (which must not hold a run).
    ``objective``: ``config.json``'s objective settings of the model (BART's
    ``{"decoder_start_id": 2}``), which ``init_from`` and `jaxformer.cli.generate` read."""
    cfg = model_cfg if isinstance(model_cfg, ModelConfig) else ModelConfig.from_dict(model_cfg)
    d = Path(directory).absolute()
    if (d / "checkpoints").exists():
        raise ValueError(f"{d / 'checkpoints'} already exists; choose an empty directory")
    d.mkdir(parents=True, exist_ok=True)
    save_run_config(d, {"name": "converted", "model": cfg.to_dict(),
                        **({"objective": dict(objective)} if objective else {})})
    if tokenizer:  # before the checkpoint, whose manifest records its checksum
        if os.path.isfile(tokenizer) and not is_saved_fast_tokenizer(tokenizer):
            shutil.copyfile(tokenizer, d / "tokenizer.model")  # SentencePiece, as it is
        else:  # Hugging Face files: one JSON document with the special ids
            Tokenizer.load(tokenizer).save(d / "tokenizer.model")
    ckpt = Checkpointer(d, async_save=False)
    try:
        ckpt.save(0, {"params": params})
    finally:
        ckpt.close()


def load_params(directory: str | os.PathLike) -> tuple[dict[str, Any], dict]:
    """(ModelConfig fields, params as NumPy arrays) of the latest checkpoint of a jaxformer
    directory: one written by `save_params` or any training workdir (verified first)."""
    run = open_run(directory)
    params = load_checkpoint_params(run.step_dir, verified=True)
    return ModelConfig.from_dict(run.run_config["model"]).to_dict(), params
