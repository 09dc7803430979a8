"""TFDS catalog datasets as random-access sources (``data.source="tfds:<name>"``), read through
`tfds.data_source` (array_record: reading needs no TensorFlow)."""

from __future__ import annotations

import importlib
import re
from collections.abc import Sequence
from typing import Any

import tensorflow_datasets as tfds

from jaxformer.data import builders, fetch

# Legacy TFDS catalog modules (glue, c4, wmt14_translate, …) that `import tensorflow_datasets`
# only registers lazily; without TensorFlow `tfds.builder("glue")` fails until they are imported.
_LEGACY_TFDS_MODULES = ("text", "translate", "summarization", "question_answering",
                        "text_simplification")


def tfds_source(name: str, split: str, *, data_dir: str | None = None,
                download: bool | None = None) -> Sequence[dict[str, Any]]:
    """`tfds.data_source` of a TFDS catalog dataset (``"lm1b"``, ``"glue/sst2"``, …).

    Prepares it as array_record in ``data_dir`` when absent and ``download`` (default: not
    ``JAXFORMER_OFFLINE``). Records hold bytes/numpy values; `get_source` maps them to the
    text/classification/pairs schema. Generating some catalog datasets needs TensorFlow or Apache
    Beam (c4); prepare those once elsewhere (``tfds build <name> --file_format=array_record``)
    and point ``data_dir`` at the result: reading needs neither.
    """
    download = not fetch.offline() if download is None else download
    builder = _tfds_builder(name, data_dir)
    if not download and not builder.is_prepared():
        raise fetch.DataUnavailableError(
            f"TFDS dataset {name!r} is not prepared in {builder.data_dir} and downloading is off "
            f"({fetch.OFFLINE_ENV} set or tfds_download=False). Prepare it where the internet is "
            f"reachable: `tfds build {name} --file_format=array_record --data_dir=<dir>` or "
            f"`tfds.data_source({name!r}, data_dir=<dir>)`, then set data.tfds_data_dir=<dir>.")
    if download and not builder.is_prepared():
        builders.require_build_dependencies()
    try:
        with builders.no_tempdir_leak():
            return tfds.data_source(name, split=split, data_dir=data_dir, download=download)
    except NotImplementedError as e:  # prepared as tfrecord, which has no random access
        raise ValueError(f"TFDS dataset {name!r} in {builder.data_dir} is not in array_record "
                         f"format; re-prepare it with file_format='array_record'. ({e})") from e


def _tfds_builder(name: str, data_dir: str | None) -> tfds.core.DatasetBuilder:
    try:
        with builders.no_tempdir_leak():
            return tfds.builder(name, data_dir=data_dir, file_format="array_record")
    except tfds.core.registered.DatasetNotFoundError:
        for module in _LEGACY_TFDS_MODULES:
            importlib.import_module(f"tensorflow_datasets.{module}")
    try:
        with builders.no_tempdir_leak():
            return tfds.builder(name, data_dir=data_dir, file_format="array_record")
    except tfds.core.registered.DatasetNotFoundError:
        raise ValueError(f"{name!r} is not a TFDS catalog dataset; see "
                         f"https://www.tensorflow.org/datasets/catalog/overview for names "
                         f"(e.g. 'lm1b', 'glue/sst2', 'imdb_reviews', 'wmt14_translate/de-en')"
                         ) from None


def tfds_name(spec: str) -> str:
    """``glue:sst2`` → ``glue/sst2``; ``glue/sst2:2.0.0`` and ``lm1b:1.1.0`` pass through."""
    if "/" not in spec and ":" in spec:
        name, rest = spec.split(":", 1)
        if not re.fullmatch(r"\d+\.\d+\.\d+", rest):
            return f"{name}/{rest}"
    return spec
