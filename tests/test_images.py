"""Image data for the Vision Transformer (`jaxformer.data.images`): scikit-learn's digits, a folder
of images with labels by sub-folder, a TFDS image dataset built here from a local builder (PNG
bytes in a ``tfds.features.Image``, read without TensorFlow), the augmentation's invariants and its
determinism per seed, and objective ``classify`` on the batches."""

from __future__ import annotations

import io
import itertools

import jax
import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

from jaxformer.data.images import (
    DIGITS_SPLIT,
    DigitsSource,
    FolderSource,
    RandomCropFlip,
    TfdsImageSource,
    make_image_dataset,
)
from jaxformer.data.pipeline import DataSettings
from jaxformer.settings import read
from jaxformer.vocab import SpecialTokens


def data_settings(**kw) -> DataSettings:
    cfg = ml_collections.ConfigDict({"source": "digits", "batch_size": 8, **kw})
    return read(DataSettings, cfg)


def test_digits_splits_are_disjoint_cover_the_set_and_keep_labels():
    from sklearn.datasets import load_digits

    digits = load_digits()
    parts = {s: DigitsSource(s) for s in ("train", "validation", "test")}
    ids = [set(map(int, p.index)) for p in parts.values()]
    assert set().union(*ids) == set(range(len(digits.target)))
    assert sum(map(len, ids)) == len(digits.target)
    for p in parts.values():
        assert abs(len(p) / len(digits.target) - DIGITS_SPLIT[list(parts.values()).index(p)]) < 0.04
        rec = p[3]
        i = int(rec["id"].split(":")[1])
        np.testing.assert_array_equal(rec["image"][..., 0], digits.images[i])
        assert rec["label"] == digits.target[i]


def _png(value: int, size=(6, 6), mode="RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, (value,) * (3 if mode == "RGB" else 1) if mode == "RGB" else value).save(
        buf, format="PNG")
    return buf.getvalue()


def test_folder_source_reads_labels_by_sub_folder(tmp_path):
    for split in ("train", "test"):
        for cls, value in (("cat", 10), ("dog", 200)):
            (tmp_path / split / cls).mkdir(parents=True)
            for k in range(3):
                (tmp_path / split / cls / f"{k}.png").write_bytes(_png(value + k))
    (tmp_path / "train" / "cat" / "notes.txt").write_text("not an image")
    src = FolderSource(str(tmp_path), "train", num_channels=3)
    assert len(src) == 6
    assert [src[i]["label"] for i in range(6)] == [0, 0, 0, 1, 1, 1]
    assert src[4]["image"].shape == (6, 6, 3) and src[4]["image"][0, 0, 0] == 201
    grey = FolderSource(str(tmp_path), "test", num_channels=1, label_names=("dog", "cat"))
    assert grey[0]["image"].shape == (6, 6, 1) and grey[0]["label"] == 1  # cat is class 1 here
    with pytest.raises(ValueError, match=r"lacks the image folders \['dog'\]"):
        FolderSource(str(tmp_path), "train", num_channels=3, label_names=("cat",))


class TinyImagesVit(tfds.core.GeneratorBasedBuilder):
    """A TFDS image dataset built in the test (no download): 5×5 grey squares, label = parity."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(5, 5, 1)),
            "label": tfds.features.ClassLabel(num_classes=2)}), disable_shuffling=True)

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(6), "test": self._generate_examples(3)}

    def _generate_examples(self, n):
        for i in range(n):
            yield i, {"image": _png(30 * i, (5, 5), "L"), "label": i % 2}


def test_tfds_image_dataset_through_the_pipeline(tmp_path):
    TinyImagesVit(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
    src = TfdsImageSource("tiny_images_vit", "train", data_dir=str(tmp_path), download=False)
    assert len(src) == 6 and src[2]["image"].shape == (5, 5, 1) and src[2]["label"] == 0
    data = data_settings(source="tfds:tiny_images_vit", tfds_data_dir=str(tmp_path),
                         tfds_download=False, batch_size=4, shuffle=False)
    batches = list(make_image_dataset(data, "test", image_size=10, num_channels=1, seed=0,
                                      num_epochs=1))
    assert len(batches) == 1
    b = batches[0]
    assert b["image"].shape == (4, 10, 10, 1) and b["image"].dtype == np.float32
    np.testing.assert_array_equal(b["image_valid"], [1, 1, 1, 0])  # the last row pads the pass
    np.testing.assert_allclose(b["image"][1], 30 / 255 * 2 - 1, rtol=1e-6)  # resized, normalised
    np.testing.assert_array_equal(b["label"][:3], [0, 1, 0])


def test_random_crop_is_a_window_of_the_padded_image_and_flip_mirrors():
    rng = np.random.default_rng(0)
    image = rng.normal(size=(8, 8, 1)).astype(np.float32)
    padded = np.pad(image, ((2, 2), (2, 2), (0, 0)), constant_values=-1.0)
    windows = {(dy, dx): padded[dy:dy + 8, dx:dx + 8] for dy in range(5) for dx in range(5)}
    seen, flips = set(), 0
    for seed in range(60):
        out = RandomCropFlip(2, True).random_map({"image": image}, np.random.default_rng(seed))["image"]
        match = [k for k, w in windows.items() if np.array_equal(out, w)]
        mirrored = [k for k, w in windows.items() if np.array_equal(out, w[:, ::-1])]
        assert match or mirrored
        flips += bool(mirrored) and not match
        seen.update(match or mirrored)
    assert len(seen) > 10 and 10 < flips < 50


def test_augmented_batches_are_deterministic_per_seed():
    data = data_settings(image_crop_padding=1, image_flip=True)

    def first(seed):
        it = make_image_dataset(data, "train", image_size=8, num_channels=1, seed=seed)
        return [b["image"] for b in itertools.islice(iter(it), 2)]

    a, b, c = first(3), first(3), first(4)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    plain = make_image_dataset(data, "validation", image_size=8, num_channels=1, seed=3, num_epochs=1)
    src = DigitsSource("validation")
    got = next(iter(plain))  # not the train split: no augmentation, pixels / 16 → [-1, 1]
    ids = {tuple(np.round(src[i]["image"][..., 0] / 8 - 1, 5).ravel()): i for i in range(len(src))}
    assert all(tuple(np.round(im[..., 0], 5).ravel()) in ids for im in got["image"])


def test_classify_objective_trains_a_vit_on_digit_batches():
    """Objective ``classify`` on the pipeline's image batches through the library's train step: the
    padding rows of a finite pass weigh 0, and a few steps lower the loss on a fixed batch."""
    from jaxformer.config import ModelConfig
    from jaxformer.models import build_model
    from jaxformer.objectives import bind_objective
    from jaxformer.parallel.mesh import make_mesh
    from jaxformer.train.optim import default_optimizer_config, make_optimizer
    from jaxformer.train.state import create_train_state
    from jaxformer.train.step import make_train_step

    prepare = bind_objective("classify", None, SpecialTokens(10))
    padded = {"image": np.zeros((3, 8, 8, 1), np.float32), "label": np.array([1, 2, 3]),
              "image_valid": np.array([1, 1, 0], np.float32)}
    out = prepare(padded, jax.random.key(0))
    assert set(out["model_inputs"]) == {"images"}
    np.testing.assert_array_equal(out["weights"], [1, 1, 0])
    cfg = ModelConfig(family="encoder", image_size=8, patch_size=4, num_channels=1, d_model=16,
                      num_heads=2, d_ff=32, num_layers=1, head="classify", num_classes=10,
                      norm_position="pre", dropout_rate=0.0, attention_dropout_rate=0.0)
    model = build_model(cfg)
    tx, schedule = make_optimizer(default_optimizer_config("gpt3", peak_lr=1e-2, warmup_steps=1),
                                  cfg.d_model, 20)
    state, _ = create_train_state(model, tx, make_mesh({"data": 1}, jax.devices()[:1]), seed=0)
    step = jax.jit(make_train_step(model, tx, prepare, schedule))
    batch = next(iter(make_image_dataset(data_settings(batch_size=32), "train", image_size=8,
                                         num_channels=1, seed=0)))
    losses = []
    for _ in range(15):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    assert losses[-1] < 0.85 * losses[0], losses
