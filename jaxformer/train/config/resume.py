"""Resuming a run: which keys of its saved config may differ from the current config.

A run's ``<workdir>/config.json`` is compared with the config it resumes under (`check_resume`).
What may change is derived from each key's declared kind: a ``model`` field of
`jaxformer.config.resumable_fields` (training noise, initialisation, how the same function is
computed) or any training key of kind ``RUN`` changes with a note in the log; the other model fields
(the parameter tree, the function) and the keys of kind ``VOCABULARY`` (``data.tokenizer.*`` but
``path``: the token ids) are refused, naming them.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import ml_collections

from jaxformer.config import ModelConfig, changed_fields, resumable_fields
from jaxformer.objectives import get_objective
from jaxformer.settings import VOCABULARY, read, settings_of_kind
from jaxformer.train.config.schema import LEGACY_KEYS, ObjectiveSettings, note_legacy_keys, schema


def _effective_data(config: dict[str, Any]) -> dict[str, Any]:
    """The flat keys of ``config`` (a config.json's dict) without `LEGACY_KEYS`, and an unset
    ``data.framing`` as the objective derives it, so a config.json written when configs still
    stated them (the legacy keys) compares equal to today's config."""
    out = {k: v for k, v in _flat(config).items() if k not in LEGACY_KEYS}
    objective = get_objective(read(ObjectiveSettings, config.get("objective")).name)
    if not out.get("data.framing") and objective.framing:
        out["data.framing"] = objective.framing
    return out


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix[:-1]: tree}
    return {k: v for key, sub in tree.items() for k, v in _flat(sub, f"{prefix}{key}.").items()}


def check_resume(run_config: dict, config: ml_collections.ConfigDict) -> list[str]:
    """Compare the ``config.json`` a workdir's checkpoints were written with to the current config.

    Raises ValueError naming the fields when the model (other than `resumable_fields`) or the
    keys of kind ``VOCABULARY`` differ (the checkpoint could not be restored, or would be read with
    other token ids); returns a note for every other changed key (e.g. ``num_train_steps``: the schedule
    is stretched; ``data.tokenizer.path``: a resumed run reads its own, checksummed tokenizer). A
    `LEGACY_KEYS` key of ``run_config`` logs its note (`note_legacy_keys`) and is not compared.
    """
    note_legacy_keys(run_config)
    current = json.loads(json.dumps(config.to_dict(), default=str))  # as config.json stores it
    now, before = _effective_data(current), _effective_data(run_config)
    if now.get("data.tokenizer.path") or before.get("data.tokenizer.path"):
        # a loaded tokenizer has its own size, which config.json records (runs written before it
        # did recorded the key's); the key sizes only a tokenizer to be trained
        now.pop("data.tokenizer.vocab_size", None)
        before.pop("data.tokenizer.vocab_size", None)
    old_model, new_model = (ModelConfig.from_dict(c["model"]) for c in (run_config, current))
    changed = [k for k in sorted(set(now) | set(before))
               if not k.startswith("model.") and before.get(k) != now.get(k)]
    fixed = changed_fields(old_model, new_model, (f.name for f in dataclasses.fields(ModelConfig)
                                                  if f.name not in resumable_fields()))
    vocabulary = set(settings_of_kind({k: v for k, v in schema().items() if k != "model"},
                                      VOCABULARY))
    fixed += [f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in changed if k in vocabulary]
    if fixed:
        raise ValueError("this workdir holds checkpoints of a different model or tokenizer; "
                         f"changed: {'; '.join(fixed)}. Use a new --workdir (or "
                         "--config.init_from=<this workdir> to fine-tune from it)")
    notes = changed_fields(old_model, new_model, resumable_fields())
    for k in changed:
        note = f"{k}: {before.get(k)!r} -> {now.get(k)!r}"
        if k == "num_train_steps":
            note += (" (the learning-rate schedule is recomputed for the new length, so it differs "
                     "from the one trained so far)")
        notes.append(note)
    return notes
