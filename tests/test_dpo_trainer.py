"""DPO through the trainer, end to end on tiny sizes: a T5 SFT run (``seq2seq``), then ``dpo_seq2seq``
from it (``init_from``) on JSONL pairs. Step 0's loss is log 2, held-out reward accuracy rises, and the
trainer's evaluation (``Trainer.evaluate``, the DPO extension's evaluator) and `evaluate_run` on the
workdir report the preference metrics that `jaxformer.train.dpo_run.evaluate_pairs` computes on the
same split; a LoRA SFT run as ``init_from`` is its base with the adapters merged."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from jaxformer.checkpoint import read_metrics
from jaxformer.evaluate_run import evaluate_run
from jaxformer.train.config import load_config
from jaxformer.train.dpo_run import evaluate_pairs
from jaxformer.train.loop import Trainer

ROOT = Path(__file__).resolve().parents[1]
WORDS = "red green blue stone river cloud light table sand wind fire snow".split()
TINY = {"model.vocab_size": 320, "model.d_model": 32, "model.num_heads": 2, "model.d_ff": 64,
        "model.num_layers": 1, "model.max_len": 32, "model.dropout_rate": 0.0,
        "data.tokenizer.vocab_size": 320, "data.seq_len": 16, "data.target_len": 32,
        "data.batch_size": 8, "log_every_steps": 1, "checkpoint.async_save": False,
        "progress_bar": False, "optimizer.warmup_steps": 2, "objective.label_smoothing": 0.0}


def _write_splits(root: Path, row, sizes=(("train", 200), ("validation", 16), ("test", 8))) -> str:
    rng = random.Random(0)
    for split, n in sizes:
        with open(root / f"{split}.jsonl", "w") as f:
            for _ in range(n):
                f.write(json.dumps(row(rng.sample(WORDS, rng.randint(2, 3)), rng)) + "\n")
    return f"files:{root}/{{split}}.jsonl"


@pytest.fixture(scope="module")
def dpo_run(tmp_path_factory):
    """(the DPO trainer after its run, its workdir, its step-0 evaluation): SFT 20 steps on
    prompt → the prompt repeated, then DPO 12 steps, chosen = the prompt repeated, rejected = one
    other word."""
    tmp = tmp_path_factory.mktemp("dpo_t5")
    (tmp / "sft_data").mkdir()
    (tmp / "pairs").mkdir()
    sft_source = _write_splits(tmp / "sft_data", lambda w, rng: {
        "prompt": " ".join(w), "response": " ".join(w)})
    Trainer(load_config(ROOT / "configs" / "t5_finetune_tiny.py", {
        **TINY, "num_train_steps": 20, "data.source": sft_source, "optimizer.peak_lr": 3e-3,
        "eval.num_batches": 0, "checkpoint.every_steps": 20}), tmp / "sft").run()
    pairs = _write_splits(tmp / "pairs", lambda w, rng: {
        "prompt": " ".join(w), "chosen": " ".join(w),
        "rejected": rng.choice([x for x in WORDS if x not in w])})
    workdir = tmp / "dpo"
    trainer = Trainer(load_config(ROOT / "configs" / "t5_finetune_tiny.py", {
        **TINY, "init_from": str(tmp / "sft"), "objective.name": "dpo_seq2seq",
        "objective.dpo_beta": 0.5, "data.source": pairs, "num_train_steps": 12,
        "optimizer.peak_lr": 2e-3, "optimizer.end_lr": 1e-4, "eval.every_steps": 12,
        "eval.num_batches": 4, "checkpoint.every_steps": 12, "checkpoint.best_metric": ""}), workdir)
    before = trainer.evaluate(trainer.model_params(trainer.state))
    trainer.run()
    yield trainer, workdir, before
    trainer.lock.release()


@pytest.fixture(scope="module")
def sft_run(dpo_run):
    """(the SFT run's workdir, its pairs' data.source) of `dpo_run`."""
    workdir = dpo_run[1]
    return workdir.parent / "sft", trainer_source(dpo_run[0])


def trainer_source(trainer) -> str:
    return trainer.settings.data.source


def test_dpo_seq2seq_from_a_t5_sft_run_through_the_trainer(dpo_run):
    trainer, workdir, before = dpo_run
    rows = [r for r in read_metrics(workdir) if "rewards_accuracies" in r]
    assert rows[0]["loss"] == pytest.approx(np.log(2), rel=1e-5)  # step 0: the policy is the reference
    assert rows[0]["rewards_accuracies"] == 0.0  # ties (rewards 0) are not accurate
    assert before["eval_loss"] == pytest.approx(np.log(2), rel=1e-5)
    assert before["eval_rewards_accuracies"] == 0.0
    after = [r for r in read_metrics(workdir) if "eval_rewards_accuracies" in r][-1]
    print(before, after)
    assert after["eval_rewards_accuracies"] >= 0.8, after
    assert after["eval_loss"] < np.log(2) and after["eval_rewards_margins"] > 0


def test_a_lora_sft_run_as_init_from_is_its_base_with_the_adapters_merged(sft_run, tmp_path):
    """DPO from a LoRA SFT run (its checkpoint holds adapters only): the policy starts from, and the
    reference is, the parameters the LoRA run's model applied (its base with the adapters merged, as
    its trainer's LoRA hook made them), not a fresh initialisation."""
    import jax

    sft, pairs = sft_run
    lora = Trainer(load_config(ROOT / "configs" / "t5_finetune_tiny.py", {
        **TINY, "init_from": str(sft), "optimizer.lora.rank": 2, "optimizer.lora.alpha": 4.0,
        "data.source": f"files:{sft.parent}/sft_data/{{split}}.jsonl", "num_train_steps": 3,
        "optimizer.peak_lr": 1e-2, "eval.num_batches": 0, "checkpoint.every_steps": 3}),
        tmp_path / "lora_sft")
    lora.run()
    applied = jax.device_get(lora.model_params(lora.state))
    lora.lock.release()
    assert set(lora.state.params) == {"lora"}  # the run's checkpoint holds the adapters only
    for kind, extra in (("full", {}), ("lora", {"optimizer.lora.rank": 2})):
        dpo = Trainer(load_config(ROOT / "configs" / "t5_finetune_tiny.py", {
            **TINY, "init_from": str(tmp_path / "lora_sft"), "objective.name": "dpo_seq2seq",
            "data.source": pairs, "num_train_steps": 1, "eval.num_batches": 0, **extra}),
            tmp_path / f"dpo_{kind}")
        start = jax.device_get(dpo.model_params(dpo.state))
        reference = jax.device_get(dpo.extension.frozen)
        dpo.lock.release()
        for tree in (start, reference):  # LoRA-DPO: the merged SFT model is its base (adapters 0)
            jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6),
                         tree, applied)


def test_the_trainers_evaluation_is_evaluate_pairs_on_the_same_split(dpo_run):
    """``Trainer.evaluate`` of a DPO run reports the DPO loss and TRL's eval metrics (no
    cross-entropy) and equals `evaluate_pairs` over the same batches of ``eval.split``."""
    trainer, _, _ = dpo_run
    params = trainer.model_params(trainer.state)
    s = trainer.settings
    logged = trainer.evaluate(params)
    assert "eval_perplexity" not in logged and "eval_accuracy" not in logged
    batches = [b for _, b in zip(range(s.eval.num_batches), trainer.make_ds(s.eval.split, num_epochs=1))]
    direct = evaluate_pairs(trainer.model, params, trainer.extension.frozen, batches,
                            s.objective_options, trainer.prepare)
    assert direct["pairs"] == 16  # the whole validation split
    assert set(logged) == {f"eval_{k}" for k in direct}
    for k, v in direct.items():
        assert logged[f"eval_{k}"] == pytest.approx(v, rel=1e-5, abs=1e-6), k


def test_evaluate_run_scores_a_dpo_workdir_as_the_trainer_does(dpo_run):
    """``jaxformer-evaluate`` (`evaluate_run`) on the DPO workdir: its reference read again from
    ``init_from``, the metrics the trainer logged at the last step on the same split."""
    _, workdir, _ = dpo_run
    logged = [r for r in read_metrics(workdir) if "eval_rewards_accuracies" in r][-1]
    scored = evaluate_run(workdir, split="validation", progress=False)["metrics"]
    assert scored["pairs"] == 16 and "perplexity" not in scored
    for k, v in scored.items():
        assert logged[f"eval_{k}"] == pytest.approx(v, rel=1e-5, abs=1e-6), k
