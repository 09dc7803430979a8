"""Training objectives: batch → (model inputs, targets, weights).

Device side (pure jnp, jit-able, run inside the train step), one signature::

    prepare(batch, rng, special, cfg) -> {"model_inputs": dict, "targets": int [...],
                                          "weights": float32 [...] (, "nsp_targets", "nsp_weights")}

``targets`` and ``weights`` have the shape of ``logits[..., 0]``; the loss is
``weighted_cross_entropy(logits, targets, weights)`` from `jaxformer.ops.losses`.

Host side (NumPy, per example, before packing): T5 `span_corruption` and BART `denoise` turn one
token sequence into ``(inputs, targets)``; the device then runs ``seq2seq``. `host_transform` gives
the pipeline the per-example function for an objective name (None for device-only objectives);
`bind_objective` gives the trainer ``prepare(batch, rng)`` for the ``objective`` config section.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxformer.data.vocab import SpecialTokens
from jaxformer.objectives._common import OBJECTIVE_OPTIONS, OPTION_DEFAULTS, option
from jaxformer.objectives.causal import prepare_clm, prepare_sft
from jaxformer.objectives.classify import prepare_classify
from jaxformer.objectives.denoise import denoise, poisson_span_lengths
from jaxformer.objectives.mlm import prepare_mlm
from jaxformer.objectives.seq2seq import prepare_seq2seq
from jaxformer.objectives.span_corruption import (
    random_spans_noise_mask,
    reconstruct_span_corruption,
    span_corruption,
)

PrepareFn = Callable[..., dict]
HostFn = Callable[[np.ndarray, np.random.Generator], tuple[np.ndarray, np.ndarray]]

OBJECTIVES: dict[str, PrepareFn] = {
    "clm": prepare_clm,
    "mlm": prepare_mlm,
    "seq2seq": prepare_seq2seq,
    "span_corruption": prepare_seq2seq,  # host: span_corruption; device: seq2seq
    "denoise": prepare_seq2seq,  # host: denoise; device: seq2seq
    "classify": prepare_classify,
    "sft": prepare_sft,
}


def get_objective(name: str) -> PrepareFn:
    """The device-side ``prepare`` function of objective ``name``."""
    if name not in OBJECTIVES:
        raise ValueError(f"unknown objective {name!r}; choose one of {sorted(OBJECTIVES)}")
    return OBJECTIVES[name]


def bind_objective(cfg: Any, special: SpecialTokens, word_initial: Any = None
                   ) -> Callable[[dict, Any], dict]:
    """``prepare(batch, rng)`` for the objective named ``cfg.name``, bound to ``special`` and the
    objective options ``cfg`` (the ``objective`` config section); MLM's ``whole_word_mask`` also
    takes the tokenizer's ``word_initial`` table (`Tokenizer.word_initial`)."""
    fn = get_objective(check_objective(cfg))
    if option(cfg, "whole_word_mask"):
        return functools.partial(fn, special=special, cfg=cfg, word_initial=word_initial)
    return functools.partial(fn, special=special, cfg=cfg)


def check_objective(cfg: Any) -> str:
    """The objective's name, after checking that its options fit it (ValueError naming them)."""
    name = option(cfg, "name", "")
    get_objective(name)
    for key, default in OPTION_DEFAULTS.items():
        value = option(cfg, key)
        if value != default and key not in OBJECTIVE_OPTIONS.get(name, ()):
            users = [n for n, keys in OBJECTIVE_OPTIONS.items() if key in keys]
            raise ValueError(f"objective.{key}={value!r} applies to objective {users[0]!r}, not "
                             f"{name!r}; leave it at its default {default!r}")
    return name


def host_transform(name: str, special: SpecialTokens, cfg: Any = None) -> HostFn | None:
    """Per-example ``f(tokens [n], rng) -> (inputs, targets)`` for the pipeline, or None.

    ``span_corruption`` reads ``cfg.noise_density`` (0.15) and ``cfg.mean_span_length`` (3.0);
    ``denoise`` reads ``infill_rate`` (0.3), ``poisson_lambda`` (3.0), ``delete_rate`` (0),
    ``token_mask_rate`` (0).
    """
    get_objective(name)
    if name == "span_corruption":
        return functools.partial(span_corruption, special=special,
                                 noise_density=float(option(cfg, "noise_density")),
                                 mean_span_length=float(option(cfg, "mean_span_length")))
    if name == "denoise":
        return functools.partial(denoise, special=special,
                                 infill_rate=float(option(cfg, "infill_rate")),
                                 poisson_lambda=float(option(cfg, "poisson_lambda")),
                                 delete_rate=float(option(cfg, "delete_rate")),
                                 token_mask_rate=float(option(cfg, "token_mask_rate")))
    return None


__all__ = [
    "OBJECTIVES", "OBJECTIVE_OPTIONS", "OPTION_DEFAULTS", "get_objective", "bind_objective",
    "check_objective", "host_transform",
    "prepare_clm", "prepare_mlm", "prepare_seq2seq", "prepare_classify", "prepare_sft", "span_corruption",
    "reconstruct_span_corruption", "random_spans_noise_mask", "denoise", "poisson_span_lengths",
]
