"""Image classification data for the Vision Transformer: sources, augmentation, the Grain pipeline.

``data.source`` names the images (`image_source`):

- ``"digits"``: scikit-learn's handwritten digits (``sklearn.datasets.load_digits``: 1,797 8×8
  grey images, 10 classes; shipped inside the scikit-learn wheel, so offline). Split by the hash
  of each image's id ``digits:<index>`` (`jaxformer.data.builders.base.hash_split`) into
  train/validation/test = `DIGITS_SPLIT`.
- ``"tfds:<name>"``: a TFDS image dataset (``mnist``, ``cifar10``, a local builder …) through
  `jaxformer.data.tfds_source.tfds_source`; records with an ``image`` `[H, W, C]` uint8 feature and
  ``data.label_key`` (default ``label``) as a class index.
- ``"files:<dir>"``: a folder of images, one sub-folder per class (``<dir>/<class>/*.png``; classes
  are the sorted sub-folder names, or ``data.label_names`` in that order), as torchvision's
  ``ImageFolder``. With ``<dir>/train``, ``<dir>/validation``, ``<dir>/test`` sub-folders each is its
  split; otherwise each file goes to the split `hash_split` gives its path under ``<dir>`` by
  ``data.split_fractions``. Read with PIL, converted to grey ("L") or "RGB" by the channel count.

Records are ``{"image": uint8 or float [H, W, C], "label": int}``. The pipeline (`make_image_dataset`)
resizes each image to the model's ``image_size`` (PIL bilinear, when it differs), scales its
pixels to [0, 1] by the source's `PixelRange` and normalises them to [-1, 1] (``(x - 0.5) / 0.5``,
Hugging Face's ``ViTImageProcessor`` default), then, for training, applies the standard
augmentation (`RandomCropFlip`: zero-pad ``data.image_crop_padding`` pixels a side and crop back at
a random offset, He et al. 2016 §4.2; a horizontal flip with probability 1/2 when
``data.image_flip``), seeded per example by ``seed`` through Grain's ``random_map`` (deterministic).
Batches: ``image`` `[B, H, W, C]` float32, ``label`` `[B]` int32 and ``image_valid`` `[B]` float32
(0 on the all-padding rows that fill a finite pass's last batch), what objective ``classify`` reads.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
from collections.abc import Sequence
from typing import Any

import grain
import numpy as np

from jaxformer.data.builders.base import SPLITS, hash_split

DIGITS_SPLIT = (0.6, 0.2, 0.2)  # train / validation / test of scikit-learn's 1,797 digits
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
IMAGE_SOURCES = ("digits", "tfds:<name>", "files:<dir>")


def _optional(module: str, what: str):
    """``module`` (of the ``[images]`` extra), or ImportError saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{what} needs {module.split('.')[0]} (the [images] extra): "
                          "pip install 'jaxformer[images]'") from e


@dataclasses.dataclass(frozen=True)
class PixelRange:
    """The largest pixel value of a source's images (16 for scikit-learn's 4-bit digits, 255 for
    uint8 images): pixels are divided by it to lie in [0, 1]."""

    max_value: float = 255.0


class DigitsSource:
    """scikit-learn's 8×8 digits, split ``split`` (`DIGITS_SPLIT` by the hash of ``digits:<i>``):
    ``{"image": [8, 8, 1] float32 in 0..16, "label": int, "id": "digits:<i>"}``."""

    pixels = PixelRange(16.0)

    def __init__(self, split: str):
        load_digits = _optional("sklearn.datasets", "data.source='digits'").load_digits
        if split not in SPLITS:
            raise ValueError(f"data.source='digits' has splits {SPLITS}, not {split!r}")
        digits = load_digits()
        keep = [i for i in range(len(digits.target)) if hash_split(f"digits:{i}", DIGITS_SPLIT) == split]
        self.index = np.asarray(keep, np.int64)
        self.images = digits.images[self.index].astype(np.float32)[..., None]
        self.labels = digits.target[self.index].astype(np.int32)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"image": self.images[i], "label": int(self.labels[i]), "id": f"digits:{self.index[i]}"}


class FolderSource:
    """Images in ``<root>/<class>/…`` (or ``<root>/<split>/<class>/…``), read lazily with PIL:
    ``{"image": uint8 [H, W, C], "label": int, "id": relative path}``."""

    pixels = PixelRange(255.0)

    def __init__(self, root: str, split: str, *, num_channels: int,
                 label_names: Sequence[str] | None = None,
                 split_fractions: tuple[float, ...] = (0.9, 0.05, 0.05)):
        if not os.path.isdir(root):
            raise ValueError(f"data.source='files:{root}': no such folder; an image folder holds one "
                             "sub-folder of images per class")
        by_split = os.path.isdir(os.path.join(root, split)) and split in SPLITS
        top = os.path.join(root, split) if by_split else root
        classes = sorted(d for d in os.listdir(top) if os.path.isdir(os.path.join(top, d))
                         and not (not by_split and d in SPLITS))
        names = list(label_names) if label_names else classes
        unknown = sorted(set(classes) - set(names))
        if unknown:
            raise ValueError(f"data.label_names={tuple(names)} lacks the image folders {unknown} of "
                             f"{top}; name every class folder")
        self.paths, self.labels = [], []
        for name in classes:
            for dirpath, _, files in sorted(os.walk(os.path.join(top, name))):
                for f in sorted(files):
                    path = os.path.join(dirpath, f)
                    if not f.lower().endswith(IMAGE_EXTENSIONS):
                        continue
                    if by_split or hash_split(os.path.relpath(path, root), split_fractions) == split:
                        self.paths.append(path)
                        self.labels.append(names.index(name))
        self.root, self.mode = root, {1: "L", 3: "RGB"}.get(num_channels)
        if self.mode is None:
            raise ValueError(f"model.num_channels={num_channels} is invalid for image files: use 1 "
                             "(grey) or 3 (RGB)")

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict[str, Any]:
        image = _optional("PIL.Image", "an image folder")
        with image.open(self.paths[i]) as im:
            pixels = np.asarray(im.convert(self.mode), np.uint8)
        return {"image": pixels.reshape(*pixels.shape[:2], -1), "label": int(self.labels[i]),
                "id": os.path.relpath(self.paths[i], self.root)}


class TfdsImageSource:
    """A TFDS image dataset: ``{"image": uint8 [H, W, C], "label": int}`` from its ``image`` and
    ``label_key`` features."""

    pixels = PixelRange(255.0)

    def __init__(self, name: str, split: str, *, label_key: str = "label",
                 data_dir: str | None = None, download: bool | None = None):
        from jaxformer.data.tfds_source import tfds_name, tfds_source

        self.name, self.label_key = tfds_name(name), label_key
        self.base = tfds_source(self.name, split, data_dir=data_dir, download=download)
        features = getattr(getattr(self.base, "dataset_info", None), "features", None)
        if features is not None and not {"image", label_key} <= set(features.keys()):
            raise ValueError(f"TFDS dataset {self.name!r} has features {sorted(features.keys())}; an "
                             f"image source needs 'image' and data.label_key={label_key!r}")

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> dict[str, Any]:
        record = self.base[i]
        return {"image": np.asarray(record["image"]), "label": int(record[self.label_key])}


def image_source(data: Any, split: str, *, num_channels: int):
    """The image source ``data.source`` names (module docstring) for ``split``; ``data`` is
    ``config.data`` (`jaxformer.data.pipeline.DataSettings`: ``source``, ``label_key``,
    ``label_names``, ``split_fractions``, ``tfds_data_dir``, ``tfds_download``)."""
    kind, _, rest = data.source.partition(":")
    if data.source == "digits":
        return DigitsSource(split)
    if kind == "tfds" and rest:
        return TfdsImageSource(rest, split, label_key=data.label_key or "label",
                               data_dir=data.tfds_data_dir, download=data.tfds_download)
    if kind == "files" and rest:
        return FolderSource(rest, split, num_channels=num_channels, label_names=data.label_names,
                            split_fractions=tuple(data.split_fractions))
    raise ValueError(f"data.source={data.source!r} is not an image source; an image model "
                     f"(model.image_size set) reads one of {IMAGE_SOURCES}")


class ToPixels(grain.transforms.Map):
    """A record → ``{"image": float32 [S, S, C] in [-1, 1], "label": int32, "image_valid": 1.0}``:
    resized to ``image_size`` (PIL bilinear, only when it differs), scaled by ``max_value``."""

    def __init__(self, image_size: int, num_channels: int, max_value: float):
        self.size, self.channels, self.max_value = image_size, num_channels, max_value

    def map(self, record):
        image = np.asarray(record["image"])
        image = image.reshape(*image.shape[:2], -1)
        if image.shape[-1] != self.channels:
            raise ValueError(f"an image of {image.shape[-1]} channel(s) (record "
                             f"{record.get('id', '')!s}) for model.num_channels={self.channels}")
        if image.shape[:2] != (self.size, self.size):
            pil = _optional("PIL.Image", "resizing images")
            planes = [np.asarray(pil.fromarray(image[..., c].astype(np.float32)).resize(
                (self.size, self.size), pil.BILINEAR)) for c in range(self.channels)]
            image = np.stack(planes, -1)
        pixels = image.astype(np.float32) / np.float32(self.max_value)
        return {"image": (pixels - 0.5) / 0.5, "label": np.int32(record["label"]),
                "image_valid": np.float32(1.0)}


class RandomCropFlip(grain.transforms.RandomMap):
    """Training augmentation: zero-pad ``padding`` pixels on every side, crop the original size at
    a uniformly random offset (He et al. 2016 §4.2; ViT's fine-tuning used Inception crops), and,
    with ``flip``, mirror left-right with probability 1/2. Padding is the normalised zero (-1)."""

    def __init__(self, padding: int, flip: bool):
        self.padding, self.flip = padding, flip

    def random_map(self, example, rng: np.random.Generator):
        image, p = example["image"], self.padding
        if p:
            h, w = image.shape[:2]
            padded = np.full((h + 2 * p, w + 2 * p, image.shape[2]), -1.0, image.dtype)
            padded[p:p + h, p:p + w] = image
            dy, dx = rng.integers(0, 2 * p + 1, size=2)
            image = padded[dy:dy + h, dx:dx + w]
        if self.flip and rng.random() < 0.5:
            image = image[:, ::-1]
        return {**example, "image": np.ascontiguousarray(image)}


def make_image_dataset(data: Any, split: str, *, image_size: int, num_channels: int, seed: int,
                       num_epochs: int | None = None, augment: bool | None = None,
                       process_index: int = 0, process_count: int = 1,
                       source: Sequence[dict] | None = None) -> grain.IterDataset:
    """This process's image batches of ``split`` (module docstring).

    Args:
      data: ``config.data`` (`jaxformer.data.pipeline.DataSettings`): the source keys, ``batch_size``,
        ``shuffle``, ``read_threads`` (0: inline, the fastest for in-memory sources),
        ``read_buffer``, ``image_crop_padding``, ``image_flip``.
      image_size, num_channels: the model's (``model.image_size``, ``model.num_channels``).
      seed: shuffling and augmentation.
      num_epochs: None repeats forever (training, full batches); an int makes a finite pass whose last
        batch is padded with rows of ``image_valid`` 0.
      augment: `RandomCropFlip` on (default: on the train split only).
      source: a random-access source of records to use instead of ``data.source``'s (its pixel
        range: its ``pixels`` attribute, else 255).
    """
    src = image_source(data, split, num_channels=num_channels) if source is None else source
    if len(src) == 0:
        raise ValueError(f"split {split!r} of data.source={data.source!r} holds no images")
    pixels = getattr(src, "pixels", PixelRange())
    ds = grain.MapDataset.source(src)[process_index::process_count].seed(seed)
    if data.shuffle:
        ds = ds.shuffle()
    it = ds.map(ToPixels(image_size, num_channels, pixels.max_value)).repeat(num_epochs)
    it = it.to_iter_dataset(grain.ReadOptions(num_threads=data.read_threads,
                                              prefetch_buffer_size=data.read_buffer))
    if split == "train" if augment is None else augment:
        it = it.random_map(RandomCropFlip(data.image_crop_padding, data.image_flip), seed=seed)
    local_batch = data.batch_size // process_count
    if num_epochs is None:
        return it.batch(local_batch, drop_remainder=True)
    return it.batch(local_batch, batch_fn=functools.partial(grain.experimental.batch_and_pad,
                                                            batch_size=local_batch))
