"""Name-and-layout rules between Hugging Face tensors and jaxformer parameters, in both directions.

A `Rule` ties one or more jaxformer parameters (paths such as ``decoder/layer_0/ffn/wi/kernel``,
in the unrolled layout) to one or more Hugging Face tensors, with the shapes on both sides and a
pair of inverse functions. The same rule list imports (`apply_import`) and exports
(`apply_export`), so the two directions cannot drift apart. Layout conventions:

* PyTorch ``nn.Linear.weight`` is `[out, in]`; GPT-2's ``Conv1D.weight`` is `[in, out]`; jaxformer
  kernels are `[*in_axes, *out_axes]`, e.g. query `[D, H, Dh]`, attention output `[H, Dh, D]`.
* Scanned stacks (``scan_layers=True``) hold ``layers`` with a leading layer axis instead of
  ``layer_0 … layer_{N-1}``; `stack_layers` / `unstack_layers` convert.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence

import numpy as np

Shape = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Rule:
    params: tuple[str, ...]
    tensors: tuple[str, ...]
    param_shapes: tuple[Shape, ...]
    tensor_shapes: tuple[Shape, ...]
    to_params: Callable[..., tuple[np.ndarray, ...]]
    to_tensors: Callable[..., tuple[np.ndarray, ...]]


def copy(param: str, tensor: str, shape: Sequence[int]) -> Rule:
    """Same array on both sides (norm scales, embedding tables, biases of one axis)."""
    s = tuple(shape)
    return Rule((param,), (tensor,), (s,), (s,), lambda x: (x,), lambda x: (x,))


def reshape(param: str, tensor: str, param_shape: Sequence[int],
            tensor_shape: Sequence[int] | None = None) -> Rule:
    """A tensor of ``tensor_shape`` (default flat, `[prod(param_shape)]`) ↔ a parameter of
    ``param_shape`` (e.g. biases `[H, Dh]`; BART's ``final_logits_bias`` `[1, V]`)."""
    p = tuple(param_shape)
    t = (math.prod(p),) if tensor_shape is None else tuple(tensor_shape)
    return Rule((param,), (tensor,), (p,), (t,), lambda x: (x.reshape(p),),
                lambda x: (x.reshape(t),))


def linear(param: str, tensor: str, in_shape: Sequence[int], out_shape: Sequence[int], *,
           transposed: bool = True) -> Rule:
    """A kernel `[*in_shape, *out_shape]` ↔ ``nn.Linear.weight`` `[prod(out), prod(in)]`
    (``transposed``) or GPT-2 ``Conv1D.weight`` `[prod(in), prod(out)]`."""
    i, o = tuple(in_shape), tuple(out_shape)
    p = i + o
    flat = (math.prod(i), math.prod(o))
    if transposed:
        return Rule((param,), (tensor,), (p,), (flat[::-1],), lambda w: (w.T.reshape(p),),
                    lambda k: (k.reshape(flat).T,))
    return Rule((param,), (tensor,), (p,), (flat,), lambda w: (w.reshape(p),),
                lambda k: (k.reshape(flat),))


def dense(param: str, tensor: str, in_shape: Sequence[int], out_shape: Sequence[int],
          bias: bool = True) -> list[Rule]:
    """``{param}/kernel`` (+ ``bias``) ↔ ``{tensor}.weight`` (+ ``.bias``) of an ``nn.Linear``."""
    out = [linear(f"{param}/kernel", f"{tensor}.weight", in_shape, out_shape)]
    if bias:
        out.append(reshape(f"{param}/bias", f"{tensor}.bias", out_shape))
    return out


def experts_linear(param: str, tensors: Sequence[str], in_shape: Sequence[int],
                   out_shape: Sequence[int]) -> Rule:
    """An experts' kernel `[E, *in_shape, *out_shape]` ↔ ``E = len(tensors)`` ``nn.Linear.weight``
    `[prod(out), prod(in)]`, one per expert (Mixtral's ``experts.{e}.w1``, Switch's
    ``experts.expert_{e}.wi``)."""
    i, o = tuple(in_shape), tuple(out_shape)
    flat = (math.prod(o), math.prod(i))

    def stack(*ws):
        return (np.stack([w.T.reshape(i + o) for w in ws]),)

    def split(k):
        return tuple(x.reshape(flat[::-1]).T for x in k)

    return Rule((param,), tuple(tensors), ((len(tensors),) + i + o,), (flat,) * len(tensors),
                stack, split)


def fused(params: Sequence[str], tensor: str, prefix_shape: Sequence[int],
          part_shape: Sequence[int]) -> Rule:
    """``len(params)`` parameters `[*prefix, *part]` ↔ one tensor `[*prefix, n · prod(part)]`
    concatenated on its last axis (GPT-2's ``c_attn``: q, k, v side by side)."""
    pre, part = tuple(prefix_shape), tuple(part_shape)
    n, width = len(params), math.prod(part)
    t = pre + (n * width,)

    def split(x):
        return tuple(c.reshape(pre + part) for c in np.split(x, n, axis=-1))

    def join(*xs):
        return (np.concatenate([x.reshape(pre + (width,)) for x in xs], axis=-1),)

    return Rule(tuple(params), (tensor,), (pre + part,) * n, (t,), split, join)


def fused_linear(params: Sequence[str], tensor: str, in_shape: Sequence[int],
                 part_shape: Sequence[int]) -> Rule:
    """``len(params)`` kernels `[*in_shape, *part_shape]` ↔ one ``nn.Linear.weight``
    `[n · prod(part), prod(in)]` whose output rows hold them one after another (ModernBERT's
    ``Wqkv``: q, k, v; its ``Wi``: the GLU's input and gate halves)."""
    i, part, n = tuple(in_shape), tuple(part_shape), len(params)
    fan_in, width = math.prod(i), math.prod(part)

    def split(w):
        return tuple(c.T.reshape(i + part) for c in np.split(w, n, axis=0))

    def join(*ks):
        return (np.concatenate([k.reshape(fan_in, width).T for k in ks], axis=0),)

    return Rule(tuple(params), (tensor,), (i + part,) * n, ((n * width, fan_in),), split, join)


def constant(param: str, shape: Sequence[int], value: float) -> Rule:
    """A parameter with no tensor: set to ``value`` on import, left out on export (ModernBERT's
    layer 0 has no attention norm; ours is there, unused: `jaxformer.ops.blocks.layer_kind`)."""
    s = tuple(shape)
    return Rule((param,), (), (s,), (), lambda: (np.full(s, value, np.float32),), lambda x: ())


# --------------------------------------------------------------------------------------------------
def _check_shape(kind: str, name: str, got: Shape, want: Shape, other: str) -> None:
    if tuple(got) != tuple(want):
        raise ValueError(f"{kind} {name!r} has shape {tuple(got)} but {tuple(want)} is expected "
                         f"(for {other}); the weights do not match the configuration")


def apply_import(rules: Sequence[Rule], tensors: Mapping[str, np.ndarray],
                 dtype=np.float32) -> tuple[dict[str, np.ndarray], set[str]]:
    """HF tensors → flat ``{param path: array}`` (cast to ``dtype``); also the tensor names used."""
    out, used = {}, set()
    for r in rules:
        arrays = []
        for name, shape in zip(r.tensors, r.tensor_shapes):
            if name not in tensors:
                raise ValueError(f"checkpoint tensor {name!r} (for jaxformer parameter "
                                 f"{', '.join(r.params)}) is missing")
            x = np.asarray(tensors[name])
            _check_shape("checkpoint tensor", name, x.shape, shape,
                         f"jaxformer parameter {', '.join(r.params)}")
            arrays.append(x.astype(dtype))
            used.add(name)
        for p, x in zip(r.params, r.to_params(*arrays)):
            out[p] = np.ascontiguousarray(x)
    return out, used


def apply_export(rules: Sequence[Rule], params: Mapping[str, np.ndarray]
                 ) -> tuple[dict[str, np.ndarray], set[str]]:
    """Flat jaxformer params → ``{HF name: array}``; also the parameter paths used."""
    out, used = {}, set()
    for r in rules:
        arrays = []
        for p, shape in zip(r.params, r.param_shapes):
            if p not in params:
                raise ValueError(f"jaxformer parameter {p!r} (for Hugging Face tensor "
                                 f"{', '.join(r.tensors)}) is missing from the parameters")
            _check_shape("jaxformer parameter", p, params[p].shape, shape,
                         f"Hugging Face tensor {', '.join(r.tensors)}")
            arrays.append(np.asarray(params[p]))
            used.add(p)
        for name, x in zip(r.tensors, r.to_tensors(*arrays)):
            out[name] = np.ascontiguousarray(x)
    return out, used


class Renamed(Mapping):
    """Read-only view of ``base`` under the names ``rename(name)`` (values loaded on access)."""

    def __init__(self, base: Mapping[str, np.ndarray], rename: Callable[[str], str]):
        self._base, self._names = base, {rename(k): k for k in base}

    def __getitem__(self, key: str) -> np.ndarray:
        return self._base[self._names[key]]

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


# --------------------------------------------------------------------------------------------------
def flatten(tree: Mapping, prefix: str = "") -> dict[str, object]:
    """Nested dict → ``{"a/b/c": leaf}``."""
    out = {}
    for k, v in tree.items():
        path = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, path + "/"))
        else:
            out[path] = v
    return out


def unflatten(flat: Mapping[str, object]) -> dict:
    """``{"a/b/c": leaf}`` → nested dict."""
    out: dict = {}
    for path, v in flat.items():
        *parents, leaf = path.split("/")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    return out


_LAYER = re.compile(r"^layer_(\d+)$")


def stack_layers(tree: dict) -> dict:
    """Unrolled → scanned layout: every dict holding ``layer_0 … layer_{N-1}`` gets ``layers`` with
    each leaf stacked on a new leading axis `[N, ...]`."""
    if not isinstance(tree, dict):
        return tree
    idx = sorted(int(m.group(1)) for k in tree if (m := _LAYER.match(k)))
    out = {k: stack_layers(v) for k, v in tree.items() if not _LAYER.match(k)}
    if idx:
        if idx != list(range(len(idx))):
            raise ValueError(f"layers {idx} are not numbered 0..{len(idx) - 1}")
        per_layer = [flatten(tree[f"layer_{i}"]) for i in idx]
        out["layers"] = unflatten({p: np.stack([f[p] for f in per_layer]) for p in per_layer[0]})
    return out


def unstack_layers(tree: dict) -> dict:
    """Scanned → unrolled layout (inverse of `stack_layers`)."""
    if not isinstance(tree, dict):
        return tree
    out = {k: unstack_layers(v) for k, v in tree.items() if k != "layers"}
    if "layers" in tree:
        flat = flatten(tree["layers"])
        n = next(iter(flat.values())).shape[0]
        for i in range(n):
            out[f"layer_{i}"] = unflatten({p: x[i] for p, x in flat.items()})
    return out


# --------------------------------------------------------------------------------------------------
# Shared pieces of the per-architecture converters.

HF_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_python": "gelu", "gelu_new": "gelu_tanh",
                  "gelu_pytorch_tanh": "gelu_tanh", "silu": "silu", "swish": "silu", "tanh": "tanh"}
TO_HF_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new", "silu": "silu",
                     "tanh": "tanh"}


def from_hf_activation(name: str, field: str) -> str:
    """HF activation name (``ACT2FN`` key) → jaxformer `ACTIVATIONS` name."""
    if name not in HF_ACTIVATIONS:
        raise ValueError(f"config.json {field}={name!r} is not supported; supported: "
                         f"{sorted(HF_ACTIVATIONS)}")
    return HF_ACTIVATIONS[name]


def layer_norm(param: str, tensor: str, d: int, *, bias: bool = True) -> list[Rule]:
    """``{param}/scale`` (+ ``bias``) ↔ ``{tensor}.weight`` (+ ``.bias``)."""
    out = [copy(f"{param}/scale", f"{tensor}.weight", (d,))]
    if bias:
        out.append(copy(f"{param}/bias", f"{tensor}.bias", (d,)))
    return out


def leftover_rule(buffers: re.Pattern, head_tensors: re.Pattern | None = None,
                  tied_copies: Sequence[str] = ("lm_head.weight",), tied_head: str | None = None
                  ) -> Callable[[str, object], str]:
    """A converter's ``leftover(name, cfg)``: what a checkpoint tensor no rule used is.

    "ignore": a buffer (``buffers`` found in the name), or one of ``tied_copies`` when
    ``cfg.tie_embeddings`` (and ``cfg.head == tied_head``, if given): a copy of the tied table;
    "drop": a head ``cfg`` does not have (``head_tensors`` found in the name); else "unknown"."""
    def leftover(name: str, cfg) -> str:
        tied = cfg.tie_embeddings and (tied_head is None or cfg.head == tied_head)
        if buffers.search(name) or (tied and name in tied_copies):
            return "ignore"
        return "drop" if head_tensors is not None and head_tensors.search(name) else "unknown"
    return leftover


def is_tied(tensors: Mapping[str, np.ndarray], head: str, embedding: str) -> bool:
    """An output projection is tied when the checkpoint omits it or stores a copy of the table."""
    if head not in tensors:
        return True
    a, b = tensors[head], tensors[embedding]
    return a.shape == b.shape and bool(np.array_equal(a, b))


def pick_head(hf: Mapping, tensors: Mapping[str, np.ndarray], head: str | None, *, model: str,
              architecture_heads: Mapping[str, str], heads: Sequence[str],
              by_tensor: Sequence[tuple[str, str]]) -> str:
    """The jaxformer head to build: ``head`` when given, else the one ``config.json``'s
    architecture means (``architecture_heads``), else — no architecture named — that of the first
    ``(tensor name, head)`` of ``by_tensor`` whose tensor is present, else "none". ValueError for
    an architecture or head ``model`` (its name in messages) does not have."""
    arch = (hf.get("architectures") or [""])[0]
    if head is None:
        if arch in architecture_heads:
            head = architecture_heads[arch]
        elif arch:
            raise ValueError(f"architectures={[arch]} is not supported for {model}; supported: "
                             f"{sorted(architecture_heads)} (or pass head='none' for the backbone)")
        else:
            head = next((h for name, h in by_tensor if name in tensors), "none")
    if head not in heads:
        raise ValueError(f"head={head!r} is not available for {model}; choose one of {tuple(heads)}")
    return head


def num_labels(hf: Mapping, override: int | None) -> int:
    """Classes of a classifier: ``override``, else HF's ``num_labels`` / ``id2label``, else 2."""
    if override is not None:
        return override
    return int(hf.get("num_labels") or len(hf.get("id2label") or {}) or 2)


def labels_config(n: int) -> dict:
    return {"id2label": {str(i): f"LABEL_{i}" for i in range(n)},
            "label2id": {f"LABEL_{i}": i for i in range(n)}}


def require(cfg, arch: str, **want) -> None:
    """ValueError listing every field of ``cfg`` that differs from ``want`` (a tuple: one of)."""
    bad = []
    for field, w in want.items():
        got = getattr(cfg, field)
        ok = got in w if isinstance(w, tuple) else got == w
        if not ok:
            need = f"one of {w!r}" if isinstance(w, tuple) else repr(w)
            bad.append(f"{field}={got!r} (needs {need})")
    if bad:
        raise ValueError(f"this model config has no Hugging Face {arch} equivalent: "
                         + "; ".join(bad))
