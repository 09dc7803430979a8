"""The Vision Transformer through the trainer (issue 64): configs/vit_digits_tiny.py, shrunk, trains
on scikit-learn's digits with no tokenizer, checkpoints, resumes bit for bit, is scored by
``jaxformer-evaluate`` (against the model applied by hand to the test images), and fine-tunes with
``init_from`` at another ``image_size`` (the learned positions resampled, ViT §3.2)."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

pytest.importorskip("sklearn")  # the [images] extra

from jaxformer.checkpoint import load_checkpoint_params, read_metrics  # noqa: E402
from jaxformer.config import ModelConfig  # noqa: E402
from jaxformer.data.images import DigitsSource  # noqa: E402
from jaxformer.evaluate_run import evaluate_run  # noqa: E402
from jaxformer.flops import train_step_flops  # noqa: E402
from jaxformer.models import build_model  # noqa: E402
from jaxformer.models.image_size import fit_image_size  # noqa: E402
from jaxformer.train import config as train_config  # noqa: E402
from jaxformer.train.config import run_settings, set_key  # noqa: E402
from jaxformer.train.loop import Trainer, train_and_evaluate  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TINY = {"model.d_model": 32, "model.num_heads": 2, "model.d_ff": 64, "model.num_layers": 1,
        "data.batch_size": 64, "num_train_steps": 100, "log_every_steps": 1,
        "eval.every_steps": 100, "eval.num_batches": 2, "checkpoint.every_steps": 50,
        "checkpoint.async_save": False,
        "optimizer.schedule": "constant", "optimizer.peak_lr": 3e-3, "progress_bar": False}


def load_config(**overrides):
    c = train_config.load_config(ROOT / "configs" / "vit_digits_tiny.py")
    for key, value in {**TINY, **overrides}.items():
        set_key(c, key, value)
    return c


def losses(workdir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(workdir) if "loss" in r}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("vit_digits")
    train_and_evaluate(load_config(), workdir)
    return workdir


def test_the_config_trains_checkpoints_and_writes_no_tokenizer(run):
    ls = [v for _, v in sorted(losses(run).items())]
    assert len(ls) == 100
    first, last = np.mean(ls[:10]), np.mean(ls[-10:])
    assert last < first - 0.2, (first, last)  # ln 10 = 2.30 → 1.89 at seed 0 (a plateau of ~30 steps)
    steps = sorted(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == [50, 100]
    assert not (run / "tokenizer.model").exists()
    assert any("eval_accuracy" in r for r in read_metrics(run))


def test_a_stopped_run_resumes_bit_for_bit(run, tmp_path):
    """50 steps, then the same config to 100 in the same workdir: every loss and the final
    parameters equal the uninterrupted run's (the data iterator restored with the state)."""
    train_and_evaluate(load_config(num_train_steps=50), tmp_path)
    trainer = Trainer(load_config(), tmp_path)
    assert trainer.start_step == 50
    trainer.run()
    resumed, straight = losses(tmp_path), losses(run)
    assert resumed == straight
    jax.tree.map(np.testing.assert_array_equal, load_checkpoint_params(tmp_path),
                 load_checkpoint_params(run))


def test_evaluate_scores_the_test_split_as_the_model_applied_by_hand(run):
    """``jaxformer-evaluate``'s accuracy = the argmax of the model applied to every test image
    (pixels / 16 normalised to [-1, 1], as ViTImageProcessor), counted with NumPy."""
    results = evaluate_run(run, split="test")
    metrics = results["metrics"]
    test = DigitsSource("test")
    assert metrics["examples"] == len(test) == 381
    model = build_model(ModelConfig.from_dict(_run_model(run)))
    params = load_checkpoint_params(run)
    images = (test.images / 16.0 - 0.5) / 0.5
    predicted = np.asarray(model.apply(params, images=images)).argmax(-1)
    assert metrics["accuracy"] == pytest.approx(float(np.mean(predicted == test.labels)), abs=1e-6)
    assert np.asarray(metrics["confusion"]).sum() == len(test)


def _run_model(workdir) -> dict:
    import json
    return json.loads((Path(workdir) / "config.json").read_text())["model"]


def test_init_from_at_another_image_size_resamples_positions_and_trains(run, tmp_path):
    """Fine-tuning at 16×16 from the 8×8 run (patch 4: a 2×2 grid becomes 4×4): the start is the
    run's parameters with the position table resampled (`fit_image_size`, checked against
    PyTorch's interpolation in tests/test_vit.py), and it trains."""
    config = load_config(**{"init_from": str(run), "model.image_size": 16, "num_train_steps": 6,
                            "checkpoint.every_steps": 6, "eval.every_steps": 6})
    trainer = Trainer(config, tmp_path)
    source = ModelConfig.from_dict(_run_model(run))
    expected = fit_image_size(load_checkpoint_params(run), source, trainer.model_cfg)
    start = jax.device_get(trainer.state.params)
    assert start["embed"]["pos_embedding"].shape == (1 + 4 * 4, 32)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), start,
                 jax.device_get(expected))
    np.testing.assert_array_equal(start["embed"]["pos_embedding"][0],  # the class token's row
                                  load_checkpoint_params(run)["embed"]["pos_embedding"][0])
    trainer.run()
    ls = losses(tmp_path)
    assert sorted(ls) == list(range(1, 7)) and all(np.isfinite(list(ls.values())))
    assert (tmp_path / "checkpoints" / "6").is_dir()
    assert _run_model(tmp_path)["image_size"] == 16


def test_an_image_run_counts_the_tokens_its_images_become():
    """MFU's FLOPs: rows of ``image_length`` = (8/4)² patches + the class token, not data.seq_len."""
    settings = run_settings(load_config().to_dict())
    params = jax.eval_shape(build_model(settings.model).init, jax.random.key(0))
    flops = train_step_flops(settings, params)
    assert flops["tokens_per_step"] == 64 * 5


@pytest.mark.parametrize("key, value, message", [
    ("data.source", "tiny_shakespeare", "is not an image source"),
    ("objective.name", "mlm", "does not train on images"),
])
def test_an_image_run_refuses_text_data_naming_the_field(tmp_path, key, value, message):
    with pytest.raises(ValueError, match=message):
        Trainer(load_config(**{key: value}), tmp_path / "w")
    assert not (tmp_path / "w").exists()


def test_a_compile_only_plan_lowers_the_batches_the_image_pipeline_yields():
    """`jaxformer.plan.abstract_batch` (what ``jaxformer-compile`` lowers the step with) = the shapes
    and dtypes of a real batch of the image pipeline."""
    from jaxformer.data.images import make_image_dataset
    from jaxformer.plan import abstract_batch

    settings = run_settings(load_config().to_dict())
    declared = abstract_batch(settings.data, settings.model, "classify")
    batch = next(iter(make_image_dataset(settings.data, "train", image_size=8, num_channels=1,
                                         seed=0)))
    assert {k: (v.shape, v.dtype) for k, v in declared.items()} == {
        k: (np.asarray(v).shape, np.asarray(v).dtype) for k, v in batch.items()}


def test_a_config_that_leaves_image_size_to_init_from_reads_images(run):
    """``init_from`` a ViT run with ``model.image_size`` unset: the run's model decides (images)."""
    from jaxformer.train.inputs import ImageInputs, TextInputs
    from jaxformer.train.setup import stated_inputs

    assert stated_inputs(load_config(**{"init_from": str(run), "model.image_size": None})) is ImageInputs
    assert stated_inputs(load_config(**{"model.image_size": None})) is TextInputs
