"""Training objectives: batch → (model inputs, targets, weights).

Device side (pure jnp, jit-able, run inside the train step), one signature::

    prepare(batch, rng, special, options) -> {"model_inputs": dict, "targets": int [...],
                                              "weights": float32 [...] (, "nsp_targets", "nsp_weights")}

``options`` is the objective's options dataclass (``MLMOptions`` …; None: its defaults).

``targets`` and ``weights`` have the shape of ``logits[..., 0]``; the loss is
``weighted_cross_entropy(logits, targets, weights)`` from `jaxformer.ops.losses`.

Host side (NumPy, per example, before packing): T5 `span_corruption` and BART `denoise` turn one
token sequence into ``(inputs, targets)``; the device then runs ``seq2seq``.

Each objective is one `Objective` in the registry (`jaxformer.objectives.registry`): its
``prepare``, the data task and framing the pipeline builds its examples with (``data.task`` is
derived from ``objective.name``), its host-side corruption and its options. `bind_objective` gives
the trainer ``prepare(batch, rng)`` for an objective's name and options; the pipeline asks
`Objective.example_transform` for the host-side step.
"""

from jaxformer.objectives.causal import prepare_clm, prepare_sft
from jaxformer.objectives.classify import prepare_classify
from jaxformer.objectives.cloze import class_logits, prepare_cloze
from jaxformer.objectives.denoise import denoise, poisson_span_lengths
from jaxformer.objectives.mlm import prepare_mlm
from jaxformer.objectives.plm import prepare_plm
from jaxformer.objectives.prefix_lm import prepare_prefix_lm
from jaxformer.objectives.qa import prepare_qa
from jaxformer.objectives.registry import (
    DATA_TASKS,
    FRAMINGS,
    OBJECTIVES,
    Objective,
    bind_objective,
    check_data_task,
    check_objective,
    get_objective,
    host_transform,
    option_classes,
    option_settings,
    register_objective,
)
from jaxformer.objectives.seq2seq import prepare_seq2seq
from jaxformer.objectives.span_corruption import (
    random_spans_noise_mask,
    reconstruct_span_corruption,
    span_corruption,
)

__all__ = [
    "Objective", "OBJECTIVES", "option_classes", "option_settings", "DATA_TASKS", "FRAMINGS",
    "register_objective", "get_objective", "bind_objective", "check_objective",
    "check_data_task", "host_transform",
    "prepare_clm", "prepare_mlm", "prepare_seq2seq", "prepare_classify", "prepare_sft", "prepare_qa",
    "prepare_plm", "prepare_prefix_lm", "prepare_cloze", "class_logits",
    "span_corruption",
    "reconstruct_span_corruption", "random_spans_noise_mask", "denoise", "poisson_span_lengths",
]
