"""Fine-tuning a Vision Transformer at another resolution (``ModelConfig.image_size``).

A pretrained ViT's learned positions are one row per patch of its ``g × g`` grid (after the class
token's). Fine-tuned on larger images with the same patch size, the sequence is longer, and the
pretrained rows no longer say where a patch is; Dosovitskiy et al. 2021 (§3.2) "perform 2D
interpolation of the pre-trained position embeddings, according to their location in the original
image". `fit_image_size` does that to a parameter tree (``init_from`` a checkpoint, a Hugging Face
import), by `jaxformer.ops.patches.resize_positions` with the target's ``position_interpolation``.
Nothing else in the parameters depends on the resolution.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.config import ModelConfig
from jaxformer.ops.patches import resize_positions

POSITIONS = "embed/pos_embedding"  # `jaxformer.models.spec.image_embedding_spec`


def fit_image_size(params: Mapping, source: ModelConfig, target: ModelConfig) -> Any:
    """``source``'s ``params`` (nested or ``"a/b"``-flat dict) with the learned position table
    resampled from ``source.image_size``'s patch grid to ``target.image_size``'s (the class token's
    row kept); unchanged when the sizes agree or the models are not image models with learned
    positions. ValueError when the patch size or the class token differ (the parameters would not
    fit the target at all)."""
    if (source.image_size is None or target.image_size is None or source.position != "learned"
            or source.image_size == target.image_size):
        return params
    for field in ("patch_size", "class_token", "position"):
        if getattr(source, field) != getattr(target, field):
            raise ValueError(f"cannot fit positions of model.{field}={getattr(source, field)!r} to "
                             f"{getattr(target, field)!r}: only image_size may change")

    def fit(path, x):
        if "/".join(str(getattr(k, "key", k)) for k in path) != POSITIONS:
            return x
        out = resize_positions(jnp.asarray(x), source.image_grid, target.image_grid,
                               leading=int(source.class_token), method=target.position_interpolation)
        return np.asarray(out) if isinstance(x, np.ndarray) else out

    return jax.tree_util.tree_map_with_path(fit, params)
