"""What a run reads, decided in one place: text through a tokenizer, or images (issue 64).

A model with ``model.image_size`` set (the Vision Transformer, Dosovitskiy et al. 2021) reads
image batches (`jaxformer.data.images`: ``image`` `[B, H, W, C]`, ``label`` `[B]`, ``image_valid``
`[B]`); every other model reads text through its tokenizer (`jaxformer.data.pipeline`). `inputs_of`
picks the kind from the model; the trainer (`jaxformer.train.setup.set_up`), the config checks
(`jaxformer.train.config.validation`) and ``jaxformer-evaluate`` (`jaxformer.evaluate_run`) ask it,
rather than each testing for images:

- `TextInputs`: the train records and string labels read before the config is resolved, the data
  checks of the text pipeline, a tokenizer (the run's, ``data.tokenizer.path``, or trained), its
  special ids for the objective, ``tokenizer.model`` saved in the workdir.
- `ImageInputs`: ``data.source`` must be an image source (``digits``, ``tfds:<name>``,
  ``files:<dir>``); no tokenizer (none is trained, saved or required to resume); the objective
  (``classify``) is bound to the class count; batches come from `make_image_dataset` at the
  model's ``image_size`` and ``num_channels``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxformer.config import ModelConfig
from jaxformer.data.images import IMAGE_SOURCES, make_image_dataset
from jaxformer.data.pipeline import DataSettings, check_data_config, make_dataset
from jaxformer.data.tokenizer import Tokenizer
from jaxformer.objectives import Objective
from jaxformer.vocab import SpecialTokens

IMAGE_OBJECTIVES = ("classify",)


class TextInputs:
    """Text examples through a tokenizer (every text model)."""

    kind = "text"
    needs_tokenizer = True

    @staticmethod
    def check_data(data: DataSettings, objective: Objective) -> None:
        """The text pipeline's ``data.*`` checks (`jaxformer.data.pipeline.check_data_config`)."""
        check_data_config(data, objective=objective)

    @staticmethod
    def special(tokenizer: Tokenizer | None, model_cfg: ModelConfig) -> SpecialTokens:
        del model_cfg
        return tokenizer.special

    @staticmethod
    def dataset_maker(data: DataSettings, model_cfg: ModelConfig, tokenizer: Tokenizer | None, *,
                      seed: int, objective: Objective | str, **kwargs: Any
                      ) -> Callable[..., Any]:
        """``make_ds(split, num_epochs=None, **more)``: `jaxformer.data.pipeline.make_dataset`."""
        del model_cfg
        return functools.partial(make_dataset, data, tokenizer=tokenizer, seed=seed,
                                 objective=objective, **kwargs)

    @staticmethod
    def tokens(batch: dict, model_cfg: ModelConfig) -> float:
        """The batch's non-padding tokens (the progress bar's tokens/s)."""
        del model_cfg
        return float(np.sum(batch.get("inputs_segment_ids", batch["inputs"]) != 0))


class ImageInputs:
    """Image batches (a model with ``model.image_size``): no tokenizer."""

    kind = "images"
    needs_tokenizer = False

    @staticmethod
    def check_data(data: DataSettings, objective: Objective) -> None:
        """ValueError naming the field: an image source, an image objective, a batch size."""
        kind, _, rest = data.source.partition(":")
        if not (data.source == "digits" or (kind in ("tfds", "files") and rest)):
            raise ValueError(f"data.source={data.source!r} is not an image source; an image model "
                             f"(model.image_size set) reads one of {IMAGE_SOURCES}")
        if objective.name not in IMAGE_OBJECTIVES:
            raise ValueError(f"objective.name={objective.name!r} does not train on images; an "
                             f"image model (model.image_size set) trains with {IMAGE_OBJECTIVES}")
        if not isinstance(data.batch_size, int) or data.batch_size < 1:
            raise ValueError(f"data.batch_size={data.batch_size!r} is invalid: must be an integer "
                             ">= 1")

    @staticmethod
    def special(tokenizer: Tokenizer | None, model_cfg: ModelConfig) -> SpecialTokens:
        """No vocabulary: ids sized to the model's (the image objective reads none of them)."""
        del tokenizer
        return SpecialTokens(model_cfg.vocab_size)

    @staticmethod
    def dataset_maker(data: DataSettings, model_cfg: ModelConfig, tokenizer: Tokenizer | None, *,
                      seed: int, objective: Objective | str, options: Any = None,
                      report: bool = False, **kwargs: Any) -> Callable[..., Any]:
        """``make_ds(split, num_epochs=None, **more)``: `jaxformer.data.images.make_image_dataset`
        at the model's ``image_size`` and ``num_channels`` (``objective``, ``options``,
        ``report``: the text pipeline's, which image batches do not read)."""
        del tokenizer, objective, options, report

        def make_ds(split: str, num_epochs: int | None = None, report: bool = False, **more):
            del report
            return make_image_dataset(data, split, image_size=model_cfg.image_size,
                                      num_channels=model_cfg.num_channels, seed=seed,
                                      num_epochs=num_epochs, **kwargs, **more)
        return make_ds

    @staticmethod
    def batch_shapes(data: DataSettings, model_cfg: ModelConfig) -> dict[str, tuple[tuple, Any]]:
        """``{feature: (shape, dtype)}`` of one global batch as `make_image_dataset` yields it
        (what a compile-only plan lowers the step with, `jaxformer.plan.abstract_batch`)."""
        b, s = data.batch_size, model_cfg.image_size
        return {"image": ((b, s, s, model_cfg.num_channels), np.float32),
                "label": ((b,), np.int32), "image_valid": ((b,), np.float32)}

    @staticmethod
    def tokens(batch: dict, model_cfg: ModelConfig) -> float:
        """The tokens the batch's images become (``model_cfg.image_length`` each; padding rows
        not counted)."""
        return float(np.sum(batch["image_valid"])) * model_cfg.image_length


Inputs = type[TextInputs] | type[ImageInputs]


def inputs_of(model_cfg: ModelConfig | dict) -> Inputs:
    """What a run of ``model_cfg`` (a `ModelConfig` or its field dict) reads: `ImageInputs` when
    ``image_size`` is set, else `TextInputs`."""
    image_size = (model_cfg.get("image_size") if isinstance(model_cfg, dict)
                  else model_cfg.image_size)
    return ImageInputs if image_size else TextInputs
