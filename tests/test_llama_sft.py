"""docs/huggingface.md's Llama example, end to end on a small random local checkpoint (no torch, no
download): a Llama directory (weights written by `save_hf`, the tokenizer of a Llama checkpoint)
is fine-tuned with LoRA on prompt/response pairs (``configs/llama_sft.py``); the run takes and
stores the checkpoint's tokenizer, the loss falls, and the merged model samples text and exports
to a Hugging Face directory holding the same weights and tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest
from test_fast_tokenizer import SAMPLE, build_llama2_tokenizer, build_llama3_tokenizer

from jaxformer.checkpoint import read_metrics
from jaxformer.cli.convert import main as convert_main
from jaxformer.config import ModelConfig
from jaxformer.convert import load_hf, save_hf
from jaxformer.convert.hf_io import find_tokenizer
from jaxformer.convert.lora import load_merged
from jaxformer.data.tokenizer import Tokenizer
from jaxformer.decode import generate_text
from jaxformer.evaluate_run import load_run
from jaxformer.models import build_model
from jaxformer.models.presets import preset
from jaxformer.train import config as train_config
from jaxformer.train.config import set_key
from jaxformer.train.loop import Trainer

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["apple", "river", "stone", "cloud", "green", "music", "table", "light", "ocean", "tiger"]


def _llama_directory(path: Path, build_tokenizer, vocab_size: int = 512) -> str:
    """A Llama checkpoint directory: ``llama_tiny`` weights (random, seed 0) of ``vocab_size`` rows
    and a tokenizer (400 pieces: with 512 rows an untrained model can sample ids none decodes)."""
    cfg = ModelConfig.from_dict(preset("llama_tiny", vocab_size=vocab_size, init_std=0.2))  # logits of
    # a useful range through the frozen head
    params = jax.jit(lambda k: build_model(cfg).init(k))(jax.random.key(0))
    save_hf(cfg, params, path, extra_config={"bos_token_id": 1, "eos_token_id": 2})
    build_tokenizer(path)
    return str(path)


def _pairs(path: Path) -> str:
    """Prompt/response pairs of a task the model can learn in a few steps: repeat a word."""
    with open(path, "w") as f:
        for i in range(200):
            w = WORDS[i % len(WORDS)]
            f.write(json.dumps({"prompt": f"Repeat: {w}.", "response": f" {w} {w}"}) + "\n")
    return f"files:{path}"


@pytest.mark.slow
@pytest.mark.parametrize("build_tokenizer", [build_llama2_tokenizer, build_llama3_tokenizer])
def test_lora_sft_of_a_llama_checkpoint_then_sample_and_export(build_tokenizer, tmp_path):
    hf_dir = _llama_directory(tmp_path / "llama", build_tokenizer)
    config = train_config.load_config(ROOT / "configs" / "llama_sft.py")
    for key, value in {"init_from": hf_dir, "data.source": _pairs(tmp_path / "pairs.jsonl"),
                       "optimizer.lora.rank": 4, "model.dtype": "float32",
                       "model.remat_policy": "none", "data.seq_len": 32, "data.batch_size": 8,
                       "num_train_steps": 60, "optimizer.peak_lr": 1e-2,
                       "optimizer.warmup_steps": 5, "log_every_steps": 5, "eval.every_steps": 60,
                       "eval.num_batches": 2, "checkpoint.every_steps": 60,
                       "progress_bar": False}.items():
        set_key(config, key, value)
    workdir = tmp_path / "run"
    trainer = Trainer(config, workdir)
    assert set(trainer.state.params) == {"lora"}  # the Llama weights stay frozen
    trainer.run()
    trainer.lock.release()
    losses = [r["loss"] for r in read_metrics(workdir) if "loss" in r]
    assert np.mean(losses[-2:]) < 0.7 * np.mean(losses[:2]), losses
    # the checkpoint's tokenizer is the run's, stored in it
    theirs = Tokenizer.load(find_tokenizer(hf_dir))
    ours = Tokenizer.load(workdir / "tokenizer.model")
    assert type(ours) is type(theirs) and ours.encode(SAMPLE) == theirs.encode(SAMPLE)
    assert ours.special == theirs.special
    # sample from the merged model (the base read from init_from again, the adapters added)
    cfg, params, tokenizer = load_merged(workdir)
    # evaluate / predict / generate read the same merged weights (issue 60: they looked for a
    # jaxformer checkpoint under init_from, a Hugging Face directory, and raised)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(load_run(workdir).params), params)
    model = build_model(cfg)
    kwargs = dict(strategy="sample", temperature=0.7, top_p=0.9, max_new_tokens=6, add_bos=True)
    first = generate_text(model, params, tokenizer, ["Repeat: ocean."], rng=jax.random.key(0),
                          **kwargs)
    again = generate_text(model, params, tokenizer, ["Repeat: ocean."], rng=jax.random.key(0),
                          **kwargs)
    assert first == again and isinstance(first[0], str)
    greedy = generate_text(model, params, tokenizer, ["Repeat: ocean."], max_new_tokens=8,
                           add_bos=True)
    assert greedy[0].lstrip().startswith("oc"), greedy  # learning (the base model is random)
    # export: the merged weights and the run's tokenizer, for from_pretrained / AutoTokenizer
    out = tmp_path / "exported"
    assert convert_main(["--from", str(workdir), "--to-hf", str(out)]) == 0
    _, exported, _ = load_hf(out)
    leaves = jax.tree_util.tree_leaves_with_path(exported)
    want = dict(jax.tree_util.tree_leaves_with_path(params))
    for path, value in leaves:
        np.testing.assert_allclose(value, want[path], rtol=1e-6, atol=1e-7)
    assert Tokenizer.load(find_tokenizer(out)).encode(SAMPLE) == theirs.encode(SAMPLE)
