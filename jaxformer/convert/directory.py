"""Whole directories converted: a Hugging Face model directory → a jaxformer checkpoint directory
(`import_hf_dir`), and a jaxformer checkpoint or training workdir → a Hugging Face directory
(`export_hf_dir`). The command line is `jaxformer.cli.convert`.

Tokenizer files found in HF_DIR are copied to CKPT_DIR/tokenizer/, and HF_DIR/config.json to
CKPT_DIR/hf_config.json; the export copies them back (token ids, label names survive the trip).
HF_DIR's tokenizer (sentencepiece, or the Hugging Face files of Llama 3, Qwen2, RoBERTa, BART,
DistilBERT, …: `jaxformer.data.fast_tokenizer`) becomes CKPT_DIR/tokenizer.model, and a BART's
decoder_start_token_id CKPT_DIR's objective.decoder_start_id.
Exporting a training workdir (its latest step, a chosen one, or its best) writes its tokenizer as
``tokenizer.json`` + ``tokenizer_config.json`` whose post-processor frames a text as the run did
(and a SentencePiece model also as HF_DIR/spiece.model: `jaxformer.convert.hf_tokenizer`), its
special token ids and a classifier's label names into config.json, so ``AutoTokenizer`` and
``AutoModel…`` on HF_DIR give the run's ids and predictions, and ``--config.init_from=HF_DIR``
fine-tunes with the same tokenizer. A LoRA run (``optimizer.lora.rank`` > 0) exports its adapters
merged into the base weights (W + alpha/rank · A B) of its ``init_from``.
"""

from __future__ import annotations

import json
import os
import shutil

from jaxformer.checkpoint import open_run, save_params
from jaxformer.config import ModelConfig
from jaxformer.convert.hf import load_hf, save_hf
from jaxformer.convert.hf_io import (
    CONFIG_NAME,
    copy_tokenizer_files,
    find_tokenizer,
    is_hf_directory,
    read_config,
)
from jaxformer.convert.lora import merged_params
from jaxformer.data.pipeline import DataSettings, example_framing, framing_tokens
from jaxformer.data.tokenizer import Tokenizer
from jaxformer.objectives.registry import get_objective
from jaxformer.settings import read
from jaxformer.vocab import SpecialTokens

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


def export_hf_dir(ckpt_dir: str, out: str, *, step: int | None = None, best: bool = False
                  ) -> tuple[dict, str | None]:
    """Write the jaxformer checkpoint or training workdir ``ckpt_dir`` (its latest step, ``step``,
    or the ``best`` by its ``checkpoint.best_metric``) as the Hugging Face directory ``out``;
    returns its ModelConfig fields and where its tokenizer came from: the imported files
    (``ckpt_dir/tokenizer/``, copied), the run's ``tokenizer.model`` (written for
    ``AutoTokenizer`` with the run's framing, `run_framing`), or None.

    ``config.json`` gets the run's special token ids (those its tokenizer has) and, for a
    classifier, ``id2label`` / ``label2id`` from ``data.label_names``."""
    run = open_run(ckpt_dir, step=step, best=best)
    model_cfg, params = ModelConfig.from_dict(run.run_config["model"]), merged_params(run)
    imported, tokenizer = os.path.join(ckpt_dir, TOKENIZER_DIR), None
    extra, source = {}, None
    if os.path.isfile(os.path.join(ckpt_dir, HF_CONFIG)):  # an imported model
        with open(os.path.join(ckpt_dir, HF_CONFIG)) as f:
            extra = json.load(f)
    elif is_hf_directory(run.run_config.get("init_from") or ""):  # its model type (an mT5 stays one)
        extra["model_type"] = read_config(run.run_config["init_from"])["model_type"]
    framing = None
    if os.path.isdir(imported):
        tokenizer, source = imported, imported
    elif run.tokenizer is not None:
        source = str(run.tokenizer)
        tokenizer = Tokenizer.load(source)
        special = tokenizer.special
        extra.update({f"{role}_token_id": i for role, i in (
            ("pad", special.pad_id), ("eos", special.eos_id), ("bos", special.bos_id)) if i >= 0})
        framing = run_framing(run.run_config, model_cfg, special)
    extra.update(label_maps(run.run_config, model_cfg))
    save_hf(model_cfg, params, out, tokenizer=tokenizer, framing=framing, extra_config=extra)
    return model_cfg.to_dict(), source


def run_framing(run_config: dict, model_cfg: ModelConfig, special: SpecialTokens
                ) -> tuple[list[int], list[int]] | None:
    """The ids a training run put around a text (the exported tokenizer's post-processor): an
    encoder-decoder's inputs end with EOS; a language model's prompt gets the framing's prefix only
    (BOS with ``bos_eos``: no EOS is appended to a prompt to continue); other models (classifiers,
    encoders) get the whole framing (``[CLS] … [SEP]``, ``<s> … </s>``, ``… </s>``). None for a
    checkpoint that is no training run (`jaxformer.checkpoint.save_params`'s)."""
    if "data" not in run_config or "objective" not in run_config:
        return None
    section = run_config["objective"]  # (jaxformer.train.config.run_settings: above convert)
    objective = get_objective(section["name"])
    objective = objective.resolve(objective.read_options(section))  # its options choose the task
    if model_cfg.family == "encoder_decoder" or objective.data_task in ("seq2seq", "span_corruption"):
        return [], [special.eos_id]
    framing = example_framing(read(DataSettings, run_config["data"]), objective)
    prefix, suffix = framing_tokens(framing, special)
    if model_cfg.family == "decoder" and model_cfg.head == "lm":
        return prefix if framing == "bos_eos" else [], []
    return prefix, suffix


def label_maps(run_config: dict, model_cfg: ModelConfig) -> dict:
    """``id2label`` / ``label2id`` of a classifier run's ``data.label_names`` (one per class), for
    ``config.json``; else {}."""
    names = read(DataSettings, run_config["data"] if "data" in run_config else None).label_names
    if not names or len(names) != model_cfg.num_classes:
        return {}
    return {"id2label": {str(i): n for i, n in enumerate(names)},
            "label2id": {n: i for i, n in enumerate(names)}}
