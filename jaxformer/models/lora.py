"""LoRA: low-rank adapters on frozen kernels (Hu et al. 2021, "LoRA: Low-Rank Adaptation").

A target kernel ``W`` (attention ``query``/``key``/``value``/``out``, FFN ``wi``/``wi_gate``/``wo``)
is adapted as ``W' = W + (alpha / rank) · A B`` (Hu et al. eq. 3): ``A`` ~ N(0, in^-1/2), ``B`` = 0,
so the adapted model equals the base at initialisation. A kernel with several input or output dims
(``query`` is ``[D, H, Dh]``, ``out`` ``[H, Dh, D]``) is the matrix ``[prod(in), prod(out)]``; the
adapters keep the kernel's dims, so they carry its logical axis names and shard like it:

    A: [*layers, *in_dims, r]   axes (*layers, *in_axes, None)
    B: [*layers, r, *out_dims]  axes (*layers, None, *out_axes)

(``layers`` is the leading axis of a scanned stack; the rank axis is replicated.)

The trainable parameters of a LoRA run (`trainable`) are ``{"lora": adapters, **task heads}``: the
adapters mirror the parameter tree down to each target (``encoder/layer_0/self_attn/query/lora_a``)
and the task heads (`TASK_HEADS`: heads no pretraining objective has, e.g. ``classifier``, always
fresh when fine-tuning) are trained whole. Every other parameter is frozen (`model_params` merges).
Pure functions of parameter pytrees; `trainable_axes` gives the trained tree's logical axes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxformer.models.head_parts import HEAD_MODULES
from jaxformer.settings import at_least, read, setting

# ``optimizer.lora.targets`` → (parent module names, kernel module names) in the parameter tree
# (`jaxformer.models.spec.attention_spec` / `ffn_spec`).
_ATTENTION = ("self_attn", "cross_attn")
TARGET_MODULES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "query": (_ATTENTION, ("query",)),
    "key": (_ATTENTION, ("key",)),
    "value": (_ATTENTION, ("value",)),
    "out": (_ATTENTION, ("out",)),
    "ffn": (("ffn",), ("wi", "wi_gate", "wo")),
}
# Kernels whose first two dims are inputs (``out``: [H, Dh, D]); every other target has one.
_TWO_INPUT_DIMS = ("out",)
# Heads that no pretraining objective (lm / mlm / none) has: new in a fine-tuning run, trained whole.
TASK_HEADS: tuple[str, ...] = tuple(n for n, m in HEAD_MODULES.items()
                                    if not set(m.heads) & {"lm", "mlm", "none"})
LORA = "lora"


@dataclasses.dataclass(frozen=True)
class LoraSettings:
    """``config.optimizer.lora`` (Hu et al. 2021); checked together by `check_lora_config`."""

    rank: int = setting(
        0, "LoRA rank r (Hu et al. 2021): train rank-r adapters on frozen init_from weights (0 = off: "
        "every parameter trains)", check=at_least(0))
    alpha: float = setting(16.0, "LoRA alpha: the adapters' update is scaled by alpha / rank")
    targets: tuple[str, ...] = setting(
        ("query", "value"), "kernels that get adapters: a tuple from 'query', 'key', 'value', 'out' "
        "(attention) and 'ffn' (wi, wi_gate, wo)")


def lora_a_std(fan_in: int) -> float:
    """Std of LoRA's fresh ``A``, in every init scheme: fan_in^-1/2, so ``x A`` has unit-scale
    entries. Hu et al. 2021 §4.1 say only "random Gaussian"; loralib and PEFT draw
    kaiming_uniform(a=√5), std (3·fan_in)^-1/2. The adapters' product starts at 0 either way (B = 0)."""
    return fan_in ** -0.5


def check_lora_config(lora: LoraSettings) -> None:
    """ValueError naming the ``optimizer.lora`` key when alpha or targets do not fit a rank > 0
    (alpha > 0, targets from `TARGET_MODULES`); each key alone was checked by its setting."""
    rank, alpha, targets = lora.rank, lora.alpha, lora.targets
    if rank and alpha <= 0:
        raise ValueError(f"optimizer.lora.alpha={alpha} must be > 0")
    unknown = sorted(set(targets) - set(TARGET_MODULES))
    if rank and (unknown or not targets):
        raise ValueError(f"optimizer.lora.targets={targets!r}: choose a non-empty tuple from "
                         f"{list(TARGET_MODULES)}")


def is_lora(run_config: Any) -> bool:
    """Whether a (run) config, a ConfigDict or its ``config.json`` dict, trains LoRA adapters."""
    return bool(dict(run_config.get("optimizer") or {}).get("lora", {}).get("rank"))


def lora_scale(lora_cfg: LoraSettings) -> float:
    """``alpha / rank`` (Hu et al. §4.1), the factor of ``A B`` (``optimizer.lora``)."""
    return float(lora_cfg.alpha) / int(lora_cfg.rank)


def _is_target(path: tuple[str, ...], targets: tuple[str, ...]) -> bool:
    if len(path) < 3 or path[-1] != "kernel":
        return False
    parent, module = path[-3], path[-2]
    return any(parent in TARGET_MODULES[t][0] and module in TARGET_MODULES[t][1] for t in targets)


def _flat(tree) -> dict[tuple[str, ...], Any]:
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {tuple(str(k.key) for k in path): v for path, v in leaves}


def _nest(flat: dict[tuple[str, ...], Any]) -> dict:
    out: dict = {}
    for path, value in flat.items():
        node = out
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = value
    return out


def _split_dims(path: tuple[str, ...], ndim: int) -> tuple[int, int, int]:
    """(batch, input, output) dim counts of a target kernel: a scanned stack's ``layers`` axis is
    a batch dim; ``out`` has two input dims (heads, head_dim)."""
    n_batch = 1 if "layers" in path else 0
    n_in = 2 if path[-2] in _TWO_INPUT_DIMS else 1
    return n_batch, n_in, ndim - n_batch - n_in


def target_paths(params: Any, targets: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Paths (``("decoder", "layer_0", "self_attn", "query", "kernel")``) of the adapted kernels."""
    return [p for p in _flat(params) if _is_target(p, tuple(targets))]


def init_adapters(rng: jax.Array, params: Any, rank: int, targets: tuple[str, ...]) -> dict:
    """``{module path: {"lora_a": A, "lora_b": B}}`` for every target kernel of ``params``.

    ``A`` ~ N(0, `lora_a_std`(prod(in_dims))²) ``[*b, *in, r]``, ``B`` = 0 ``[*b, r, *out]``, in the kernel's
    dtype (their logical axes: `trainable_axes`).
    """
    out, flat = {}, _flat(params)
    for i, path in enumerate(target_paths(params, targets)):
        w = flat[path]
        nb, ni, _ = _split_dims(path, w.ndim)
        batch, ins, outs = w.shape[:nb], w.shape[nb:nb + ni], w.shape[nb + ni:]
        fan_in = 1
        for d in ins:
            fan_in *= d
        a = jax.random.normal(jax.random.fold_in(rng, i), (*batch, *ins, rank), jnp.float32)
        a = (a * lora_a_std(fan_in)).astype(w.dtype)
        b = jnp.zeros((*batch, rank, *outs), w.dtype)
        out[path[:-1] + ("lora_a",)] = a
        out[path[:-1] + ("lora_b",)] = b
    return _nest(out)


def delta(a: jax.Array, b: jax.Array, kernel_ndim: int, n_batch: int) -> jax.Array:
    """``A B`` in float32, shaped like the kernel: ``[*b, *in, r] @ [*b, r, *out]``."""
    batch, ins, outs = a.shape[:n_batch], a.shape[n_batch:-1], b.shape[n_batch + 1:]
    a2 = a.reshape(*batch, -1, a.shape[-1]).astype(jnp.float32)
    b2 = b.reshape(*batch, b.shape[n_batch], -1).astype(jnp.float32)
    out = jnp.matmul(a2, b2, precision=jax.lax.Precision.HIGHEST)
    assert len(batch) + len(ins) + len(outs) == kernel_ndim
    return out.reshape(*batch, *ins, *outs)


def merge(params: Any, adapters: dict, scale: float) -> Any:
    """``params`` with each adapted kernel replaced by ``W + scale · A B`` (in W's dtype)."""
    flat_adapters = _flat(adapters)
    flat = _flat(params)
    for path in flat_adapters:
        if path[-1] != "lora_a":
            continue
        module = path[:-1]
        kpath = module + ("kernel",)
        w = flat[kpath]
        nb = _split_dims(kpath, w.ndim)[0]
        d = delta(flat_adapters[path], flat_adapters[module + ("lora_b",)], w.ndim, nb)
        flat[kpath] = (w.astype(jnp.float32) + scale * d).astype(w.dtype)
    return jax.tree_util.tree_unflatten(jax.tree.structure(params), list(flat.values()))


def trainable_axes(axes: dict, lora_cfg: Any) -> dict:
    """The logical axes of `trainable`'s tree, from the model's (a tuple of names per parameter,
    no boxes): an adapter ``A`` of a kernel named ``(*b, *in, *out)`` is ``(*b, *in, None)``, its
    ``B`` ``(*b, None, *out)`` (the module docstring); task heads keep theirs."""
    leaves = jax.tree_util.tree_flatten_with_path(axes, is_leaf=lambda x: isinstance(x, tuple))[0]
    out = {}
    for path, names in ((tuple(str(k.key) for k in p), v) for p, v in leaves):
        if _is_target(path, tuple(lora_cfg.targets)):
            nb, ni, _ = _split_dims(path, len(names))
            out[path[:-1] + ("lora_a",)] = (*names[:nb + ni], None)
            out[path[:-1] + ("lora_b",)] = (*names[:nb], None, *names[nb + ni:])
    return {LORA: _nest(out), **{k: v for k, v in axes.items() if k in TASK_HEADS}}


def trainable(params: Any, rng: jax.Array, lora_cfg: Any) -> dict:
    """The trainable parameters of a LoRA run: ``{"lora": init_adapters(...), **task heads}``
    (the task heads taken from ``params``)."""
    heads = {k: v for k, v in params.items() if k in TASK_HEADS}
    return {LORA: init_adapters(rng, params, int(lora_cfg.rank), tuple(lora_cfg.targets)), **heads}


def model_params(base: Any, trained: dict, scale: float) -> Any:
    """The full parameters the model applies: ``base`` merged with the adapters, the task heads of
    ``trained`` in place of the base's."""
    merged = merge(base, trained[LORA], scale)
    return {**merged, **{k: v for k, v in trained.items() if k != LORA}}


def inference_params(base: Any, trained: dict, lora_cfg: Any, modules: Any) -> Any:
    """`model_params` of a saved LoRA run (``lora_cfg``: its ``config.json``'s ``optimizer.lora``)
    for inference: ``base`` (its ``init_from``'s parameters)
    keeps only the model's top-level ``modules`` (a pretraining head the fine-tuned model lacks is
    dropped). ValueError naming a module in neither ``base`` nor ``trained``."""
    base = {k: v for k, v in base.items() if k in modules}
    missing = sorted(set(modules) - set(base) - set(trained))
    if missing:
        raise ValueError(f"LoRA run: parameters {missing} are in neither its checkpoint nor its "
                         "init_from")
    return model_params(base, trained, lora_scale(read(LoraSettings, lora_cfg)))


def count(tree: Any) -> int:
    """Number of scalars in a pytree (of arrays or ``ShapeDtypeStruct``s)."""
    total = 0
    for x in jax.tree.leaves(tree):
        n = 1
        for d in x.shape:
            n *= d
        total += n
    return total
