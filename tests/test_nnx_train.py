"""The trainer on the NNX model: ``module_api`` (``"nnx"``, ``"linen"``: the former modules' setting,
which ran the same program) is a legacy key, accepted and ignored with a note, so runs saved with
either setting resume; and ``init_from`` a Hugging Face directory. A run written by the former Linen
modules resumes in tests/test_legacy_checkpoint.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxformer.checkpoint import read_metrics
from jaxformer.models import Model
from jaxformer.train import config as train_config
from jaxformer.train.config import validate_config
from jaxformer.train.loop import Trainer

ROOT = Path(__file__).resolve().parents[1]
TINY_MODEL = dict(d_model=32, num_heads=2, d_ff=64, num_layers=1, max_len=64, vocab_size=512)
# dropout off, so that a resumed run recomputes the uninterrupted one's steps
SETTINGS = {"num_train_steps": 4, "log_every_steps": 1, "eval.num_batches": 0,
            "optimizer.schedule": "constant", "optimizer.peak_lr": 3e-3, "progress_bar": False,
            "checkpoint.every_steps": 2, "checkpoint.async_save": False,
            "data.tokenizer.vocab_size": 512, "data.tokenizer.max_train_texts": 500,
            "data.seq_len": 32, "data.batch_size": 8,
            **{f"model.{k}": v for k, v in TINY_MODEL.items()}}


def load_config(name: str, **overrides):
    return train_config.load_config(ROOT / "configs" / f"{name}.py", overrides)


def losses(workdir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(workdir) if "loss" in r}


def with_module_api(config, api: str):
    """``config`` as a config file that still sets ``module_api`` writes it (the key is no longer
    declared, so ``--config.module_api=…`` is refused as unknown)."""
    with config.unlocked():
        config.module_api = api
    return config


@pytest.mark.parametrize("api", ["linen", "nnx", "flax"])
def test_module_api_is_a_legacy_key_ignored_with_one_note(api, caplog):
    """Whatever its value, ``module_api`` is skipped by the schema check, leaves the typed settings
    as the config without it builds them, logs its note once, and ``--print_config`` (the schema's
    keys) no longer lists it."""
    from jaxformer.train.config import check_config, key_docs

    plain = load_config("gpt_pretrain_tiny")
    config = with_module_api(load_config("gpt_pretrain_tiny"), api)
    caplog.clear()
    with caplog.at_level("WARNING"):
        model_cfg = validate_config(config)
    assert [r.getMessage() for r in caplog.records if "module_api" in r.getMessage()] == [
        f"config key module_api={api!r}: ignored: there is one model implementation (the former "
        "'linen' and 'nnx' ran the same program)"]
    assert check_config(config, model_cfg)[0] == check_config(plain, validate_config(plain))[0]
    assert "module_api" not in key_docs() and "module_api" not in train_config.base_config()


def _resume_other_api(run: Path, copy: Path, api: str, **overrides) -> dict[int, float]:
    """Copy ``run``, drop its last checkpoint and resume it with ``module_api=api``."""
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "checkpoints" / "4")
    trainer = Trainer(with_module_api(load_config("gpt_pretrain_tiny", **SETTINGS, **overrides), api),
                      copy)
    assert trainer.start_step == 2
    assert isinstance(trainer.model, Model)
    trainer.run()
    return losses(copy)


@pytest.mark.slow
def test_checkpoints_resume_across_module_apis_and_train_alike(tmp_path):
    """A run saved with ``module_api="linen"`` resumed with "nnx", and the other way round: the
    resumed steps equal the uninterrupted run's (same parameters, same batches, dropout off;
    bitwise on CPU with jax 0.12, compared to float tolerance)."""
    linen_run, nnx_run = tmp_path / "linen", tmp_path / "nnx"
    Trainer(with_module_api(load_config("gpt_pretrain_tiny", **SETTINGS), "linen"), linen_run).run()
    tok = {"data.tokenizer.path": str(linen_run / "tokenizer.model")}  # no second tokenizer
    Trainer(with_module_api(load_config("gpt_pretrain_tiny", **SETTINGS, **tok), "nnx"), nnx_run).run()
    for run, api, extra in [(linen_run, "nnx", {}), (nnx_run, "linen", tok)]:
        want = losses(run)
        got = _resume_other_api(run, tmp_path / f"{run.name}_by_{api}", api, **extra)
        assert sorted(got) == [1, 2, 3, 4]
        np.testing.assert_allclose([got[s] for s in (3, 4)], [want[s] for s in (3, 4)],
                                   rtol=2e-5, err_msg=f"{run.name} resumed by {api}")
    # the two settings run one program: the two runs are the same run
    assert losses(linen_run) == losses(nnx_run)


@pytest.mark.slow
def test_init_from_hugging_face_directory_with_nnx(tmp_path):
    from golden import golden_dir
    from safetensors.numpy import load_file

    hf = golden_dir("gpt2_v512")  # a tiny random HF GPT-2 (tests/golden.py)
    config = load_config("gpt_finetune_tiny", init_from=hf,
                         num_train_steps=2, **{"eval.num_batches": 1, "progress_bar": False,
                                               "optimizer.warmup_steps": 1,
                                               "data.tokenizer.max_train_texts": 500,
                                               "data.tokenizer.vocab_size": 512})
    trainer = Trainer(config, tmp_path / "run")
    assert isinstance(trainer.model, Model)
    wte = load_file(f"{hf}/model.safetensors")["transformer.wte.weight"]
    params = jax.device_get(trainer.state.params)
    np.testing.assert_array_equal(params["token_embed"]["embedding"], wte)
    assert "classifier" in params  # the new head (load_hf initialises heads the checkpoint lacks)
    metrics = trainer.run()  # dropout 0.1: the NNX model draws its masks from the step key
    assert np.isfinite(metrics["loss"]) and np.isfinite(metrics["eval_loss"])
