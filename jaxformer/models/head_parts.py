"""The head registry: which top-level parameter modules belong to an output head.

A model's parameters are a backbone (embeddings, stacks, final norms) plus the modules of its head,
named here once. Every list of head modules is derived from `HEAD_MODULES`:

* fine-tuning (`jaxformer.train.setup.merge_backbone`) and Hugging Face import
  (`jaxformer.convert.load_hf`) initialise a head module the checkpoint lacks, never a backbone one;
* the optimizer's head group (``optimizer.head_lr_multiplier`` / ``freeze_backbone``) is these
  modules by default;
* `jaxformer.plan` counts a per-row module's FLOPs once per row, not once per token.

The modules are built by `jaxformer.models.spec.model_spec` from the ModelConfig fields named in
``built_by``.
"""

from __future__ import annotations

import dataclasses

from jaxformer.config import HEADS


@dataclasses.dataclass(frozen=True)
class HeadModule:
    """One top-level parameter module of a head.

    Attributes:
      name: the module's key in the parameter tree.
      heads: the ``ModelConfig.head`` values whose models may hold it.
      built_by: the ModelConfig setting that adds it.
      per_row: applied to one pooled vector per row (`[B, D]`), not to every token (`[B, T, D]`).
    """

    name: str
    heads: tuple[str, ...]
    built_by: str
    per_row: bool


# In the order `optimizer.head_param_prefixes` has always listed them (saved in config.json).
HEAD_MODULES: dict[str, HeadModule] = {m.name: m for m in (
    HeadModule("lm_head", ("lm",), "head='lm' (with tied embeddings only a bias, if lm_head_bias)",
               per_row=False),
    HeadModule("mlm_head", ("mlm",), "head='mlm' (mlm_transform adds BERT's dense + norm)",
               per_row=False),
    HeadModule("classifier", ("classify",), "head='classify'", per_row=True),
    HeadModule("token_classifier", ("token_classify",), "head='token_classify'", per_row=False),
    HeadModule("qa_outputs", ("span",), "head='span' (extractive QA start/end logits)",
               per_row=False),
    HeadModule("pooler", ("mlm", "classify", "none"), "pooler=True (BERT's dense + tanh)",
               per_row=True),
    HeadModule("nsp_head", ("mlm",), "nsp_head=True (next-sentence prediction)", per_row=True),
    # ModernBERT: per row under head='classify', per token under 'token_classify' (counted so)
    HeadModule("prediction_head", ("classify", "token_classify"),
               "prediction_head=True (ModernBERT's dense + activation + norm)", per_row=False),
)}

HEAD_MODULE_NAMES: tuple[str, ...] = tuple(HEAD_MODULES)
PER_ROW_MODULES: tuple[str, ...] = tuple(n for n, m in HEAD_MODULES.items() if m.per_row)

assert {h for m in HEAD_MODULES.values() for h in m.heads} <= set(HEADS), "unknown head value"


def is_head_module(path: str) -> bool:
    """Whether the parameter ``path`` ("classifier/kernel" or "classifier") lies in a head."""
    return path.split("/", 1)[0] in HEAD_MODULES

