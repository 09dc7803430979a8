"""Activation functions by name, so configs can choose them with a string."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

ACTIVATIONS: dict[str, Callable[[jnp.ndarray], jnp.ndarray]] = {
    "relu": jax.nn.relu,  # Vaswani et al. 2017, eq. 2
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),  # exact erf form (BERT)
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),  # GPT-2 "gelu_new", T5 v1.1 gated-gelu
    "silu": jax.nn.silu,  # SwiGLU's gate (Shazeer 2020)
    "tanh": jnp.tanh,
    "identity": lambda x: x,
}


def get_activation(name: str) -> Callable[[jnp.ndarray], jnp.ndarray]:
    """Look up an activation; unknown names raise a ValueError listing the choices."""
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; choose one of {sorted(ACTIVATIONS)}") from None
