"""Files of a Hugging Face model directory: ``config.json``, weights, tokenizer files.

Weights are read as NumPy arrays without PyTorch from ``model.safetensors`` or a sharded
``model.safetensors.index.json`` (lazily, one tensor at a time; bfloat16 tensors, which
`safetensors.numpy` cannot represent, are read through `ml_dtypes`). ``pytorch_model.bin`` needs
``torch`` and is only imported for it. Writing produces one ``model.safetensors``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator, Mapping

import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from jaxformer.data.fast_tokenizer import (
    SENTENCEPIECE_FILES,
    TOKENIZER_JSON,
    has_tokenizer_files,
    read_generically,
    sentencepiece_file,
    sentencepiece_style,
)

CONFIG_NAME = "config.json"
SAFETENSORS_NAME = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_NAME = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"
TOKENIZER_FILES = SENTENCEPIECE_FILES + (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
    "vocab.json", "merges.txt", "added_tokens.json")


def is_hf_directory(path: str | os.PathLike) -> bool:
    """True if ``path`` is a directory holding a ``config.json`` with a ``model_type`` key."""
    cfg = os.path.join(os.fspath(path), CONFIG_NAME)
    if not os.path.isfile(cfg):
        return False
    try:
        with open(cfg) as f:
            return "model_type" in json.load(f)
    except (OSError, ValueError):
        return False


def read_config(directory: str | os.PathLike) -> dict:
    """The parsed ``config.json`` of ``directory`` (ValueError if absent or without model_type)."""
    path = os.path.join(os.fspath(directory), CONFIG_NAME)
    if not os.path.isfile(path):
        raise ValueError(f"{os.fspath(directory)!r} is not a Hugging Face model directory: "
                         f"{CONFIG_NAME} is missing")
    with open(path) as f:
        cfg = json.load(f)
    if "model_type" not in cfg:
        raise ValueError(f"{path} has no 'model_type'; expected one of gpt2, bert, albert, "
                         "roberta, distilbert, t5, mt5, bart, llama, mistral, qwen2, mixtral, "
                         "qwen2_moe, switch_transformers")
    return cfg


def _bf16_reader(path: str):
    """Reader of bfloat16 tensors from a safetensors file (its header gives byte offsets)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))

    def read(key: str) -> np.ndarray:
        info = header[key]
        start, end = info["data_offsets"]
        raw = np.fromfile(path, dtype=np.uint8, count=end - start, offset=8 + n + start)
        return raw.view(ml_dtypes.bfloat16).reshape(info["shape"])

    return read


class SafetensorsSource(Mapping):
    """Read-only ``{name: np.ndarray}`` view of one or more safetensors files, loaded on access."""

    def __init__(self, files: list[str]):
        self._where: dict[str, str] = {}
        self._dtype: dict[str, str] = {}
        for path in files:
            with safe_open(path, framework="np") as f:
                for k in f.keys():
                    self._where[k] = path
                    self._dtype[k] = f.get_slice(k).get_dtype()

    def __getitem__(self, key: str) -> np.ndarray:
        path = self._where[key]
        if self._dtype[key] == "BF16":
            return _bf16_reader(path)(key)
        with safe_open(path, framework="np") as f:
            return f.get_tensor(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


def _torch_load(files: list[str]) -> dict[str, np.ndarray]:
    try:
        import torch
    except ImportError:
        raise ValueError(f"{files[0]} is a PyTorch pickle and reading it needs torch "
                         "(pip install torch), or convert the model to safetensors") from None
    out = {}
    for path in files:
        for k, v in torch.load(path, map_location="cpu", weights_only=True).items():
            v = v.detach()
            out[k] = (v.float() if v.dtype == torch.bfloat16 else v).numpy()
    return out


def _index_files(directory: str, index: str) -> list[str]:
    with open(os.path.join(directory, index)) as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
    return [os.path.join(directory, s) for s in shards]


def read_tensors(directory: str | os.PathLike) -> Mapping[str, np.ndarray]:
    """The checkpoint tensors of ``directory`` by Hugging Face name (safetensors preferred)."""
    d = os.fspath(directory)
    if os.path.isfile(os.path.join(d, SAFETENSORS_NAME)):
        return SafetensorsSource([os.path.join(d, SAFETENSORS_NAME)])
    if os.path.isfile(os.path.join(d, SAFETENSORS_INDEX)):
        return SafetensorsSource(_index_files(d, SAFETENSORS_INDEX))
    if os.path.isfile(os.path.join(d, BIN_NAME)):
        return _torch_load([os.path.join(d, BIN_NAME)])
    if os.path.isfile(os.path.join(d, BIN_INDEX)):
        return _torch_load(_index_files(d, BIN_INDEX))
    raise ValueError(f"no weights in {d!r}: expected {SAFETENSORS_NAME}, {SAFETENSORS_INDEX}, "
                     f"{BIN_NAME} or {BIN_INDEX}")


def write_model(directory: str | os.PathLike, hf_config: dict,
                tensors: Mapping[str, np.ndarray]) -> None:
    """Write ``config.json`` and ``model.safetensors`` (format "pt", as transformers expects)."""
    d = os.fspath(directory)
    os.makedirs(d, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
              os.path.join(d, SAFETENSORS_NAME), metadata={"format": "pt"})
    with open(os.path.join(d, CONFIG_NAME), "w") as f:
        json.dump(hf_config, f, indent=2, sort_keys=True)


def find_tokenizer(directory: str | os.PathLike) -> str | None:
    """What becomes a run's tokenizer (`jaxformer.data.tokenizer.Tokenizer.load` reads it), the one
    ``AutoTokenizer`` reads there: the directory itself for an ALBERT or Llama SentencePiece
    model (`jaxformer.data.fast_tokenizer.sentencepiece_style`: transformers reads it its own way);
    a Mistral's ``tokenizer.json`` (`read_generically`); else the directory's SentencePiece
    model (T5's ``spiece.model``), else its
    ``tokenizer.json`` (Llama 3, Qwen2, GPT-2, RoBERTa, BART, BERT: `jaxformer.data.fast_tokenizer`),
    else the directory itself when it holds a slow tokenizer's files (``vocab.json`` +
    ``merges.txt`` or ``vocab.txt``), else None."""
    json_path = os.path.join(os.fspath(directory), TOKENIZER_JSON)
    if sentencepiece_style(directory):
        return os.fspath(directory)
    if read_generically(directory) and os.path.isfile(json_path):  # Mistral's: as transformers 5
        return json_path
    if spm := sentencepiece_file(directory):
        return spm
    if os.path.isfile(json_path):
        return json_path
    return os.fspath(directory) if has_tokenizer_files(directory) else None


def copy_tokenizer_files(src: str | os.PathLike, dst: str | os.PathLike) -> list[str]:
    """Copy the tokenizer files of `TOKENIZER_FILES` found in ``src`` to ``dst``; their names.

    A single SentencePiece file as ``src`` is copied as ``dst/spiece.model``.
    """
    src, dst = os.fspath(src), os.fspath(dst)
    if os.path.isfile(src):
        os.makedirs(dst, exist_ok=True)
        shutil.copyfile(src, os.path.join(dst, "spiece.model"))
        return ["spiece.model"]
    if not os.path.isdir(src):
        raise ValueError(f"tokenizer path {src!r} is neither a file nor a directory")
    names = [n for n in TOKENIZER_FILES if os.path.isfile(os.path.join(src, n))]
    for n in names:
        os.makedirs(dst, exist_ok=True)
        shutil.copyfile(os.path.join(src, n), os.path.join(dst, n))
    return names
