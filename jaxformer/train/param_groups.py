"""Parameters by depth: layer-wise learning-rate decay and embedding freezing.

Depth (`layer_depths`) orders a model's parameters from the input up, by module name
(`jaxformer.models.spec.model_spec`), for every family:

* depth 0 — the embeddings (`EMBEDDING_MODULES`): the token table (also the tied output
  projection), learned position and token-type tables, BERT's embedding norm, ALBERT's embedding
  projection, T5's relative-position bias tables and XLNet's jump offsets: everything before the
  first layer;
* layer ``i`` (0-based) of the stack — depth ``i + 1``. Encoder-decoder models count the encoder's
  ``E`` layers first (depths 1 … E), then the decoder's (depths E + 1 … E + L_dec); the encoder's
  final norm (``encoder_norm``) sits with the encoder's last layer (depth E);
* the last stack's final norm and every head module (`jaxformer.models.head_parts.HEAD_MODULE_NAMES`:
  ``lm_head``, ``mlm_head``, ``pooler``, ``classifier``, …) — depth ``D`` = number of layers + 1
  (encoder-decoder: E + L_dec + 1).

A scanned stack (``model.scan_layers``) holds its layers along the leading ``layers`` axis, so its
depth is a ``[layers]`` vector, one entry per slice: scanned and unrolled models get equal
multipliers. LoRA's trainable tree (``{"lora": adapters mirroring the parameter paths, **heads}``,
`jaxformer.models.lora`) is read through the ``lora/`` prefix. ALBERT's shared block
(``model.share_layers``) has no single depth and is refused.

Two optax transforms use the depths; both act on the final updates (after AdamW), so they scale or
zero the weight decay with the learning rate, exactly as a per-group learning rate would:

* `scale_by_layer_decay` (``optimizer.layer_lr_decay`` = ξ): the update of a parameter at depth
  ``d`` is multiplied by ``ξ^(D − d)`` — layer-wise learning-rate decay (Clark et al. 2020, ELECTRA,
  fine-tuning details; Bao et al. 2022, BEiT, fine-tuning; ULMFiT §3.2's "discriminative
  fine-tuning" with ξ = 1/2.6). Heads and the final norm keep the full rate.
* `freeze_embeddings` (``optimizer.freeze_embeddings_steps`` = N): the depth-0 parameters get a
  zero update for the first N optimizer updates (optax counts 0 … N − 1), then train normally — the
  embedding part of gradual unfreezing (Howard & Ruder 2018, ULMFiT §3.3). Adam's moments keep
  accumulating their gradients meanwhile, so the first unfrozen update is an ordinary one.

Pure functions of parameter pytrees; depths are computed from paths and shapes at trace time, so the
multipliers are compile-time constants.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxformer.models import lora
from jaxformer.models.head_parts import HEAD_MODULE_NAMES

# Top-level modules before the first layer (`jaxformer.models.spec.model_spec`): depth 0.
EMBEDDING_MODULES: tuple[str, ...] = (
    "token_embed", "embed", "encoder_embed", "decoder_embed", "encoder_relative_bias",
    "decoder_relative_bias", "jump_embed")
# The layer stacks, in depth order (the encoder feeds the decoder).
STACKS: tuple[str, ...] = ("encoder", "decoder")
_LAYER = re.compile(r"layer_(\d+)")


def _key_name(k) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def map_params_by_path(fn: Callable[[str, Any], Any], tree: Any) -> Any:
    """Apply ``fn("a/b/kernel", array)`` to every parameter; a tree of the same structure.

    Entries without a shape (optax's ``MaskedNode``, seen under `optax.multi_transform`) are passed
    through unchanged.
    """
    def leaf(path, x):
        if not hasattr(x, "shape"):
            return x
        return fn("/".join(_key_name(k) for k in path), x)

    return jax.tree_util.tree_map_with_path(leaf, tree)


def _parts(path: str) -> list[str]:
    """The path's module names, LoRA's ``lora/`` prefix dropped (adapters mirror the params)."""
    parts = path.split("/")
    return parts[1:] if parts[0] == lora.LORA else parts


def is_embedding(path: str) -> bool:
    """Whether the parameter ``path`` ("token_embed/embedding") is an embedding (depth 0)."""
    return _parts(path)[0] in EMBEDDING_MODULES


def _layer_index(parts: list[str]) -> int | None:
    """Index ``i`` of an unrolled ``stack/layer_i/...`` parameter; None for a scanned one."""
    if len(parts) < 2 or parts[1] == "layers":
        return None
    if parts[1] == "shared":
        raise ValueError("optimizer.layer_lr_decay needs one block per layer, but this model "
                         "shares one block across its layers (model.share_layers=True); set "
                         "optimizer.layer_lr_decay=1.0")
    match = _LAYER.fullmatch(parts[1])
    if match is None:
        raise ValueError(f"optimizer.layer_lr_decay: parameter {'/'.join(parts)!r} is in no "
                         "layer of its stack (expected layer_<i> or layers)")
    return int(match.group(1))


def stack_sizes(params: Any) -> dict[str, int]:
    """Number of layers of each stack in ``params`` (``{"encoder": 2, "decoder": 2}``): the
    leading axis of a scanned stack, the count of ``layer_i`` of an unrolled one."""
    sizes: dict[str, int] = {}

    def visit(path, x):
        parts = _parts(path)
        if parts[0] in STACKS:
            i = _layer_index(parts)
            n = x.shape[0] if i is None else i + 1
            sizes[parts[0]] = max(sizes.get(parts[0], 0), n)
        return x

    map_params_by_path(visit, params)
    return {s: sizes[s] for s in STACKS if s in sizes}


def _depth(parts: list[str], sizes: dict[str, int]) -> int | np.ndarray:
    """Depth of one parameter: an int, or ``[layers]`` for a scanned stack's parameter."""
    top, total = parts[0], sum(sizes.values()) + 1
    offsets = dict(zip(sizes, np.cumsum([0, *sizes.values()])[:-1].tolist()))
    if top in EMBEDDING_MODULES:
        return 0
    if top in HEAD_MODULE_NAMES:
        return total
    if top in sizes:
        i = _layer_index(parts)
        first = offsets[top] + 1
        return first + (np.arange(sizes[top]) if i is None else i)
    stack = top.removesuffix("_norm")
    if top.endswith("_norm") and stack in sizes:  # a stack's final norm: after its last layer
        last = stack == list(sizes)[-1]
        return total if last else offsets[stack] + sizes[stack]
    raise ValueError(f"optimizer.layer_lr_decay: top-level module "
                     f"{top!r} has no depth; known: embeddings {list(EMBEDDING_MODULES)}, stacks "
                     f"{list(STACKS)} and their _norm, heads {list(HEAD_MODULE_NAMES)}")


def layer_depths(params: Any) -> tuple[Any, int]:
    """``(depths, D)``: each parameter's depth (an int NumPy array: shape ``()``, or ``[layers]``
    for a scanned stack) in a tree like ``params``, and the top depth D = number of layers + 1."""
    sizes = stack_sizes(params)
    depths = map_params_by_path(lambda p, x: np.asarray(_depth(_parts(p), sizes)), params)
    return depths, sum(sizes.values()) + 1


def _multiplier_fn(params: Any, decay: float) -> Callable[[str, Any], np.ndarray]:
    """``fn(path, array)`` → ``decay^(D − depth)`` as float32 that broadcasts against the array:
    shape ``()``, or ``[layers, 1, …, 1]`` for a scanned stack's parameter."""
    sizes = stack_sizes(params)
    total = sum(sizes.values()) + 1

    def multiplier(path, x):
        depth = np.asarray(_depth(_parts(path), sizes), np.float64)
        mult = np.power(np.float64(decay), total - depth).astype(np.float32)
        return mult.reshape(mult.shape + (1,) * (x.ndim - mult.ndim))

    return multiplier


def depth_multipliers(params: Any, decay: float) -> Any:
    """``decay^(D − depth)`` of every parameter (float32 NumPy arrays shaped as `_multiplier_fn`
    says), in a tree like ``params``."""
    return map_params_by_path(_multiplier_fn(params, decay), params)


def scale_by_layer_decay(decay: float) -> optax.GradientTransformation:
    """Multiply every update by ``decay^(D − depth)`` (`depth_multipliers`); stateless. Chained
    after AdamW it makes per-depth learning rates ``lr · decay^(D − depth)`` (weight decay
    included)."""
    def init(params):
        depth_multipliers(params, decay)  # refuses a tree without depths now, before compiling
        return optax.EmptyState()

    def update(updates, state, params=None):
        del params
        multiplier = _multiplier_fn(updates, decay)
        return map_params_by_path(
            lambda p, u: u * jnp.asarray(multiplier(p, u), u.dtype), updates), state

    return optax.GradientTransformation(init, update)


class FreezeEmbeddingsState(NamedTuple):
    """``count``: int32 scalar, optimizer updates seen (frozen while ``count < steps``)."""

    count: jax.Array


def freeze_embeddings(steps: int) -> optax.GradientTransformation:
    """Zero the embeddings' updates (`is_embedding`) for the first ``steps`` updates; every other
    update, and every update from then on, passes through unchanged (bit for bit)."""
    def init(params):
        if not any(is_embedding(p) for p in _paths(params)):
            raise ValueError(f"optimizer.freeze_embeddings_steps={steps}: the trained parameters "
                             f"hold no embedding module ({list(EMBEDDING_MODULES)}); LoRA and "
                             "freeze_backbone already keep them frozen: set it to 0")
        return FreezeEmbeddingsState(count=jnp.zeros([], jnp.int32))

    def update(updates, state, params=None):
        del params
        frozen = state.count < steps
        out = map_params_by_path(
            lambda p, u: jnp.where(frozen, jnp.zeros_like(u), u) if is_embedding(p) else u,
            updates)
        return out, FreezeEmbeddingsState(count=optax.safe_increment(state.count))

    return optax.GradientTransformation(init, update)


def _paths(tree: Any) -> list[str]:
    paths: list[str] = []
    map_params_by_path(lambda p, x: paths.append(p) or x, tree)
    return paths
