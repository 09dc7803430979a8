"""Vocabulary padding (``ModelConfig.vocab_pad_multiple``): parameters moved between paddings.

The tables on the ``vocab`` logical axis (`jaxformer.models.spec`: the token embedding, an untied
LM / MLM output kernel, the output bias) hold ``cfg.padded_vocab_size`` rows, ``vocab_size`` rounded
up to a multiple of ``vocab_pad_multiple`` so that a tensor-parallel mesh divides them (Megatron's
``--make-vocab-size-divisible-by``, 128 by default there; Shoeybi et al. 2019 §3). Rows from
``vocab_size`` on are padding: no id looks them up (ids are checked against ``vocab_size``) and their
logits are masked (`jaxformer.ops.heads.mask_padded_vocab`), so they get zero gradient and the model
computes the function of its first ``vocab_size`` rows, whatever the padding.

`fit_vocab` re-pads a parameter tree to another padding: Hugging Face import pads with zeros, export
cuts back to ``vocab_size``, and ``init_from`` reads a checkpoint saved with another padding.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.config import ModelConfig
from jaxformer.models.spec import ParamSpec, model_spec

VOCAB = "vocab"  # the logical axis of the vocabulary (`jaxformer.parallel.rules`: over ``tensor``)


def _path(path) -> str:
    return "/".join(str(getattr(k, "key", k)) for k in path)


def vocab_axes(cfg: ModelConfig) -> dict[str, int]:
    """``{"token_embed/embedding": 0, "lm_head/kernel": 1, …}``: each parameter of ``cfg``'s model
    that has a ``vocab`` axis, and that axis' index (from the one spec table)."""
    leaves = jax.tree_util.tree_flatten_with_path(
        model_spec(cfg), is_leaf=lambda s: isinstance(s, ParamSpec))[0]
    return {_path(p): s.axes.index(VOCAB) for p, s in leaves if VOCAB in s.axes}


def fit_vocab(params: Mapping, source: ModelConfig, target: ModelConfig) -> Any:
    """``source``'s ``params`` (a nested or ``"a/b"``-flat dict of NumPy or jax arrays) with every
    vocabulary table re-padded to ``target``'s rows: cut to ``vocab_size`` and padded with zeros to
    ``target.padded_vocab_size`` (``vocab_pad_multiple=1`` unpads). Only tables holding exactly
    ``source.padded_vocab_size`` rows change; anything else is returned as it is (not copied), for
    the model's shape check to name. ValueError when the two configs' vocabularies differ."""
    if source.vocab_size != target.vocab_size:
        raise ValueError(f"cannot re-pad a vocabulary of {source.vocab_size} tokens to "
                         f"model.vocab_size={target.vocab_size}")
    have, rows, keep = source.padded_vocab_size, target.padded_vocab_size, target.vocab_size
    axes = vocab_axes(source)

    def fit(path, x):
        axis = axes.get(_path(path))
        if axis is None or have == rows or x.shape[axis] != have:
            return x
        xp = np if isinstance(x, np.ndarray) else jnp
        cut = [slice(None)] * x.ndim
        cut[axis] = slice(0, keep)
        pad = [(0, 0)] * x.ndim
        pad[axis] = (0, rows - keep)
        return xp.pad(x[tuple(cut)], pad)

    return jax.tree_util.tree_map_with_path(fit, params)
