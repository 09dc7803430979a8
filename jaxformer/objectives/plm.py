"""Permutation language modelling (XLNet; Yang et al. 2019) on the decoder family.

Each packed segment gets its own uniformly random factorisation order (§2.2, eq. 3); the model runs
two-stream attention (§2.3) through the GPT's own blocks (`jaxformer.models.forward.permutation_lm`,
``model.permutation_lm=True``) and returns the query stream's logits, row ``i`` predicting
``inputs[i]`` from its predecessors in the order. Partial prediction (§2.4): only the last
``ceil(n / K)`` elements of each order of length ``n`` are targets (never the first, which has no
predecessor), ``K = objective.plm_k``. The loss is the usual weighted cross-entropy at those rows.

With ``plm_identity_order=True`` and ``plm_k=1`` the loss is exactly the causal LM's (`prepare_clm`)
of the same weights; the content stream is the GPT, so a plm-trained model generates as a causal LM.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import jax.numpy as jnp

from jaxformer.config import ModelConfig
from jaxformer.objectives._common import require, segments_and_positions
from jaxformer.ops.permutation import identity_order, partial_prediction_targets, sample_order
from jaxformer.settings import setting
from jaxformer.vocab import SpecialTokens

Array = jnp.ndarray


@dataclasses.dataclass(frozen=True)
class PLMOptions:
    """The ``objective.*`` options of objective ``plm`` (XLNet, Yang et al. 2019); checked with
    the model by `check_plm_options`."""

    plm_k: float = setting(
        6.0, "plm partial prediction: the last ceil(n/K) of each segment's order are targets (XLNet "
        "§2.4, K=6; 1 = all but the first)")
    plm_identity_order: bool = setting(
        False, "plm: left-to-right factorisation orders instead of XLNet's random ones (with "
        "plm_k=1: exactly the causal LM's loss)")


def check_plm_options(options: PLMOptions) -> tuple[float, bool]:
    """(K, identity order?) of ``options``, checked (ValueError naming the option)."""
    k, identity = options.plm_k, options.plm_identity_order
    if isinstance(k, bool) or not isinstance(k, int | float) or not k >= 1:
        raise ValueError(f"objective.plm_k={k!r} must be a number >= 1 (the last 1/K of each "
                         "factorisation order is trained; XLNet uses 6)")
    if not isinstance(identity, bool):
        raise ValueError(f"objective.plm_identity_order={identity!r} must be True or False")
    return float(k), identity


def check_plm_model(options: PLMOptions, model_cfg: ModelConfig) -> None:
    """Objective 'plm' with ``options`` needs ``model.permutation_lm=True`` (ValueError naming it,
    before compiling)."""
    check_plm_options(options)
    if not model_cfg.permutation_lm:
        raise ValueError("objective.name='plm' needs model.permutation_lm=True (the query stream's "
                         "jump_embed table; family='decoder', head='lm')")
    if model_cfg.head != "lm":
        raise ValueError(f"objective.name='plm' predicts tokens: model.head={model_cfg.head!r} "
                         "must be 'lm'")


def prepare_plm(batch: Mapping[str, Array], rng: jax.Array, special: SpecialTokens,
                options: PLMOptions | None = None) -> dict:
    """Permutation LM targets.

    Batch: ``inputs`` `[B, L]` int32, optional ``inputs_segment_ids`` / ``inputs_positions`` (as
    `prepare_clm`). ``rng`` draws the orders; ``options`` (None: the defaults) give K and the
    identity order.

    Returns ``model_inputs`` {tokens, positions, segment_ids, factorization_rank `[B, L]`} (kwargs
    of `DecoderOnly`), ``targets`` `[B, L]` = ``inputs`` (each row predicts its own token) and
    ``weights`` `[B, L]` float32, 1 on the partial-prediction targets.
    """
    require(batch, "plm", "inputs")
    k, identity = check_plm_options(options or PLMOptions())
    tokens, seg, pos = segments_and_positions(batch, "inputs", special.pad_id)
    rank = identity_order(seg) if identity else sample_order(rng, seg)
    weights = partial_prediction_targets(rank, seg, k).astype(jnp.float32)
    return {
        "model_inputs": {"tokens": tokens, "positions": pos, "segment_ids": seg,
                         "factorization_rank": rank},
        "targets": jnp.where(weights > 0, tokens, special.pad_id),
        "weights": weights,
    }
