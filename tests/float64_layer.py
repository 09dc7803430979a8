"""A float64 NumPy reference of one pre-norm transformer layer, for tests of what enters attention.

Shared by tests/test_alibi.py (an additive ALiBi bias) and tests/test_prefix_lm.py (a prefix-visible
mask): both build a one-layer RMS-norm model without biases (ReLU FFN, tied embeddings) and compare
its forward with this one, written from the equations rather than from `jaxformer.ops`.
"""

from __future__ import annotations

import math

import jax
import numpy as np

from jaxformer.config import ModelConfig
from jaxformer.models import build_model


def random_params(cfg: ModelConfig, seed: int = 0) -> dict:
    """The model's parameter tree with N(0, 0.3²) entries (norm scales around 1), float32."""
    r = np.random.default_rng(seed)
    return jax.tree_util.tree_map_with_path(
        lambda p, s: (1.0 if "scale" in jax.tree_util.keystr(p) else 0.0)
        + r.normal(0.0, 0.3, s.shape).astype(np.float32), build_model(cfg).abstract())


def np_rms(x, scale, eps):
    """RMSNorm (Zhang & Sennrich 2019): x / sqrt(mean(x²) + eps) · scale over the last axis."""
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * scale


def np_layer(cfg: ModelConfig, layer: dict, x: np.ndarray, seen: np.ndarray, bias=0.0) -> np.ndarray:
    """x + Attn(RMS(x)) → x + FFN(RMS(x)) in float64 for ``x`` `[B, L, D]`: softmax(q·k/√d + bias)
    over the keys ``seen`` `[B, L, L]` allows; ``bias`` broadcasts to `[B, H, L, L]`."""
    h = np_rms(x, layer["self_attn_norm"]["scale"], cfg.norm_eps)
    q, k, v = (np.einsum("bld,dhk->blhk", h, layer["self_attn"][n]["kernel"])
               for n in ("query", "key", "value"))
    logits = np.einsum("bihk,bjhk->bhij", q, k) / math.sqrt(cfg.head_dim) + bias
    logits = np.where(seen[:, None], logits, -np.inf)
    with np.errstate(invalid="ignore"):  # padding queries see no key: NaN rows, not compared
        w = np.exp(logits - logits.max(-1, keepdims=True))
        w = w / w.sum(-1, keepdims=True)
    x = x + np.einsum("bhij,bjhk,hkd->bid", w, v, layer["self_attn"]["out"]["kernel"])
    h = np_rms(x, layer["ffn_norm"]["scale"], cfg.norm_eps)
    return x + np.maximum(h @ layer["ffn"]["wi"]["kernel"], 0.0) @ layer["ffn"]["wo"]["kernel"]
