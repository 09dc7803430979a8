"""docs/training.md's DPO example end to end, on a small random local Llama checkpoint (no torch, no
download): SFT (configs/llama_sft.py), then DPO (configs/llama_dpo.py) from the SFT run, in full and
with LoRA (the reference is the base, no second copy); held-out reward accuracy, sampling, and the
LoRA-DPO run exported to Hugging Face with the adapters merged. Also the toy of bench/dpo_toy.py,
shortened: reward accuracy → 1, the chosen log-ratio above the rejected one."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import jax
import numpy as np
import pytest
from test_fast_tokenizer import build_llama2_tokenizer
from test_llama_sft import WORDS, _llama_directory

from jaxformer.checkpoint import read_metrics
from jaxformer.cli.convert import main as convert_main
from jaxformer.convert import load_hf
from jaxformer.convert.lora import load_merged
from jaxformer.decode import generate_text
from jaxformer.models import build_model
from jaxformer.train import config as train_config
from jaxformer.train.config import set_key
from jaxformer.train.dpo_run import evaluate_trainer
from jaxformer.train.loop import Trainer

ROOT = Path(__file__).resolve().parents[1]
COMMON = {"model.dtype": "float32", "model.remat_policy": "none", "data.seq_len": 48,
          "data.batch_size": 8, "optimizer.warmup_steps": 2, "log_every_steps": 1,
          "eval.num_batches": 2, "progress_bar": False}


def _toy():
    spec = importlib.util.spec_from_file_location("dpo_toy", ROOT / "bench" / "dpo_toy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_toy_preference_is_learned():
    """SFT 40 steps, DPO 40 (bench/dpo_toy.py's run, shortened): on held-out pairs the DPO model
    prefers the chosen responses (reward accuracy ≥ 0.8), and its log-ratio of the chosen responses
    is above that of the rejected, which fell."""
    out = _toy().run(seed=0, sft_steps=40, dpo_steps=40, beta=0.5, batch_size=16, held_out=64)
    print(out)
    assert out["train_loss_first"] == pytest.approx(np.log(2), rel=1e-5)  # step 0: π = π_ref
    assert out["train_reward_accuracy_first"] <= 0.1  # ties (rewards 0) are not accurate
    assert out["test_reward_accuracy"] >= 0.8, out  # measured 0.92 (0.99 after 60 steps of 32)
    assert out["test_rejected_log_ratio"] < -1.0, out  # measured −2.99
    assert out["test_chosen_log_ratio"] > out["test_rejected_log_ratio"] + 1.0, out  # −0.69


def _write(path: Path, rows) -> str:
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return f"files:{path}"


def _config(name: str, overrides: dict):
    config = train_config.load_config(ROOT / "configs" / name)
    for key, value in {**COMMON, **overrides}.items():
        set_key(config, key, value)
    return config


def _first_last(workdir: Path, key: str) -> tuple[float, float]:
    values = [r[key] for r in read_metrics(workdir) if key in r]
    return values[0], values[-1]


@pytest.mark.slow
def test_sft_then_dpo_full_and_lora_from_a_llama_checkpoint(tmp_path):
    hf_dir = _llama_directory(tmp_path / "llama", build_llama2_tokenizer)
    sft_data = _write(tmp_path / "sft.jsonl", ({"prompt": f"Repeat: {w}.", "response": f" {w} {w}"}
                                               for w in WORDS * 20))
    sft = tmp_path / "sft"
    Trainer(_config("llama_sft.py", {"init_from": hf_dir, "data.source": sft_data,
                                     "num_train_steps": 30, "optimizer.peak_lr": 3e-3,
                                     "eval.every_steps": 30, "checkpoint.every_steps": 30}),
            sft).run()
    # the preference: repeat the word (chosen), not the next word of the list (rejected)
    pairs = _write(tmp_path / "pairs.jsonl", (
        {"prompt": f"Repeat: {w}.", "chosen": f" {w} {w}",
         "rejected": f" {WORDS[(i + 1) % len(WORDS)]} {WORDS[(i + 1) % len(WORDS)]}"}
        for i, w in enumerate(WORDS * 20)))
    runs = {}
    for kind, extra in (("full", {}), ("lora", {"optimizer.lora.rank": 4,
                                                "optimizer.lora.alpha": 8.0})):
        workdir = tmp_path / f"dpo_{kind}"
        trainer = Trainer(_config("llama_dpo.py", {
            "init_from": str(sft), "data.source": pairs, "num_train_steps": 15,
            "optimizer.peak_lr": 2e-3 if kind == "lora" else 5e-4, "optimizer.end_lr": 1e-5,
            "objective.dpo_beta": 0.5, "eval.every_steps": 15, "checkpoint.every_steps": 15,
            **extra}), workdir)
        if kind == "lora":  # the reference is LoRA's frozen base: the state holds adapters only
            assert set(trainer.state.params) == {"lora"}
        before = evaluate_trainer(trainer)
        assert before["rewards_accuracies"] == 0.0 and before["loss"] == pytest.approx(np.log(2))
        trainer.run()
        after = evaluate_trainer(trainer)
        trainer.lock.release()
        first, last = _first_last(workdir, "rewards_accuracies")
        loss_first, loss_last = _first_last(workdir, "loss")
        print(kind, before, after, (first, last), (loss_first, loss_last))
        assert loss_first == pytest.approx(np.log(2), rel=1e-5)  # step 0: the policy is the reference
        assert after["rewards_accuracies"] >= 0.9 and after["rewards_margins"] > 0
        assert after["rewards_rejected"] < 0
        runs[kind] = workdir
    # sample from the LoRA-DPO model (the SFT run's weights with the adapters merged) and export it
    cfg, params, tokenizer = load_merged(runs["lora"])
    greedy = generate_text(build_model(cfg), params, tokenizer, ["Repeat: ocean."],
                           max_new_tokens=8, add_bos=True)
    assert isinstance(greedy[0], str)
    out = tmp_path / "exported"
    assert convert_main(["--from", str(runs["lora"]), "--to-hf", str(out)]) == 0
    exported = dict(jax.tree_util.tree_leaves_with_path(load_hf(out)[1]))
    for path, value in jax.tree_util.tree_leaves_with_path(params):
        np.testing.assert_allclose(exported[path], value, rtol=1e-6, atol=1e-7)
