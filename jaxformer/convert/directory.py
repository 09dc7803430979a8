"""Whole directories converted: a Hugging Face model directory → a jaxformer checkpoint directory
(`import_hf_dir`), and a jaxformer checkpoint or training workdir → a Hugging Face directory
(`export_hf_dir`). The command line is `jaxformer.cli.convert`.

Tokenizer files found in HF_DIR are copied to CKPT_DIR/tokenizer/, and HF_DIR/config.json to
CKPT_DIR/hf_config.json; the export copies them back (token ids, label names survive the trip).
HF_DIR's tokenizer (sentencepiece, or the Hugging Face files of Llama 3, Qwen2, RoBERTa, BART,
DistilBERT, …: `jaxformer.data.fast_tokenizer`) becomes CKPT_DIR/tokenizer.model, and a BART's
decoder_start_token_id CKPT_DIR's objective.decoder_start_id.
Exporting a training workdir writes its ``tokenizer.model`` as HF_DIR/spiece.model (a run on a
Hugging Face tokenizer: ``tokenizer.json`` and a ``tokenizer_config.json``) and its special token
ids into config.json, so ``--config.init_from=HF_DIR`` fine-tunes with the same tokenizer;
GPT-2 / BERT exports also get an equivalent ``tokenizer.json`` for ``AutoTokenizer``.
A LoRA run (``optimizer.lora.rank`` > 0) exports its adapters merged into the base weights
(W + alpha/rank · A B) of its ``init_from``.
"""

from __future__ import annotations

import json
import os
import shutil

from jaxformer.checkpoint import load_params, save_params
from jaxformer.convert.hf import load_hf, save_hf
from jaxformer.convert.hf_io import CONFIG_NAME, copy_tokenizer_files, find_tokenizer, read_config
from jaxformer.convert.lora import load_merged
from jaxformer.data.tokenizer import Tokenizer
from jaxformer.models.lora import is_lora

TOKENIZER_DIR = "tokenizer"
HF_CONFIG = "hf_config.json"


def import_hf_dir(hf_dir: str, out: str, *, scan_layers: bool = False, head: str | None = None,
                  num_classes: int | None = None, vocab_pad_multiple: int = 1
                  ) -> tuple[dict, list[str]]:
    """Write ``hf_dir``'s model as the jaxformer checkpoint directory ``out``; returns its
    ModelConfig fields and the tokenizer files copied to ``out/tokenizer/``."""
    cfg, params, _ = load_hf(hf_dir, scan_layers=scan_layers, head=head, num_classes=num_classes,
                             vocab_pad_multiple=vocab_pad_multiple)
    # as <workdir>/tokenizer.model (sentencepiece, or the HF tokenizer of RoBERTa, BART, …),
    # which the trainer and `jaxformer.cli.generate` read
    start = read_config(hf_dir).get("decoder_start_token_id")
    objective = {"decoder_start_id": start} if cfg["family"] == "encoder_decoder" and \
        isinstance(start, int) else None  # BART's 2; T5's 0
    save_params(out, cfg, params, tokenizer=find_tokenizer(hf_dir), objective=objective)
    shutil.copyfile(os.path.join(hf_dir, CONFIG_NAME), os.path.join(out, HF_CONFIG))
    return cfg, copy_tokenizer_files(hf_dir, os.path.join(out, TOKENIZER_DIR))


def export_hf_dir(ckpt_dir: str, out: str) -> tuple[dict, str | None]:
    """Write the jaxformer checkpoint or training workdir ``ckpt_dir`` as the Hugging Face
    directory ``out``; returns its ModelConfig fields and the tokenizer written with it: the
    imported files (``ckpt_dir/tokenizer/``), a training run's ``tokenizer.model``, or None."""
    cfg, params = load_model(ckpt_dir)
    tok = os.path.join(ckpt_dir, TOKENIZER_DIR)
    spm = os.path.join(ckpt_dir, "tokenizer.model")
    extra, tokenizer = None, None
    if os.path.isfile(os.path.join(ckpt_dir, HF_CONFIG)):  # an imported model
        with open(os.path.join(ckpt_dir, HF_CONFIG)) as f:
            extra = json.load(f)
    if os.path.isdir(tok):
        tokenizer = tok
    elif os.path.isfile(spm):  # a training workdir: its tokenizer and special ids
        tokenizer, special = spm, Tokenizer.load(spm).special
        extra = {"pad_token_id": special.pad_id, "eos_token_id": special.eos_id,
                 "bos_token_id": special.bos_id, **(extra or {})}
    save_hf(cfg, params, out, tokenizer_path=tokenizer, extra_config=extra)
    return cfg, tokenizer


def load_model(path: str) -> tuple[dict, dict]:
    """(ModelConfig fields, params) of a jaxformer directory; a LoRA run's adapters merged into
    the base weights of its init_from (`jaxformer.convert.lora.load_merged`)."""
    run_config = os.path.join(path, "config.json")
    if os.path.isfile(run_config):
        with open(run_config) as f:
            if is_lora(json.load(f)):
                cfg, params, _ = load_merged(path)
                return cfg.to_dict(), params
    return load_params(path)
