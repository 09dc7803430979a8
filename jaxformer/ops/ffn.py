"""Position-wise feed-forward networks.

    FFN(x)      = act(x W_i + b_i) W_o + b_o                    (Vaswani et al. 2017, eq. 2, act=ReLU)
    GatedFFN(x) = (act(x W_i) ⊙ (x W_g)) W_o                    (Shazeer 2020, "GLU Variants": SwiGLU
                                                                 with act=silu, GEGLU with act=gelu)
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxformer.ops.activations import get_activation
from jaxformer.ops.dense import dense
from jaxformer.ops.dropout import dropout

Array = jnp.ndarray


def ffn(params: dict, x: Array, *, activation: str = "relu", dropout_rate: float = 0.0,
        dropout_rng: jax.Array | None = None,
        constrain: Callable[[Array], Array] | None = None) -> Array:
    """Feed-forward sublayer; gated when ``params`` has ``wi_gate``.

    Args:
      params: ``{"wi": {"kernel": [d, f], "bias"?: [f]}, "wi_gate"?: {...}, "wo": {"kernel": [f, d],
        "bias"?: [d]}}``.
      x: `[..., d]`.
      dropout_rate: dropout on the hidden activation (T5 / flax convention).
      constrain: optional hook applied to the hidden activation `[..., f]` (sharding constraint).

    Returns:
      `[..., d]` in ``x.dtype``.
    """
    h = get_activation(activation)(dense(params["wi"], x))
    if "wi_gate" in params:
        h = h * dense(params["wi_gate"], x)
    if constrain is not None:
        h = constrain(h)
    h = dropout(h, dropout_rate, dropout_rng)
    return dense(params["wo"], h)
