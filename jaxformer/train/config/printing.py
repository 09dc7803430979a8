"""Every key of a training config, with its value, its base default and its one-line description.

``python train.py --config configs/<name>.py --print_config`` prints `format_config`: one line per
key of the completed config (`jaxformer.train.config.loading.load_config`), e.g.::

    data.seq_len     = 64  (base: 128)  # row length of inputs (tokens, framing included); …
    model.d_model    = 128  (base: unset = 512)  # width of the hidden states
    model.norm_eps   = None  (unset = 1e-06)  # epsilon of the norms

Every description is the ``doc`` of the key's declaration (`jaxformer.train.config.schema`,
`key_docs`): a key cannot be declared without one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

from jaxformer.config import ModelConfig
from jaxformer.train.config.schema import base_config, key_docs


def flat_keys(config: ml_collections.ConfigDict, prefix: str = "") -> dict[str, Any]:
    """``{dotted key: value}`` of every leaf of ``config`` (an unset placeholder's value is None)."""
    out: dict[str, Any] = {}
    for key in config.keys():
        value = config[key]
        if isinstance(value, ml_collections.ConfigDict):
            out.update(flat_keys(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def format_config(config: ml_collections.ConfigDict) -> str:
    """One line per key of ``config``: ``key = value``, then in parentheses `base_config`'s value
    where it differs (for an unset ``model`` field: `ModelConfig`'s default), then
    ``# description``."""
    docs, base = key_docs(), flat_keys(base_config())
    model_defaults = {f"model.{f.name}": f.default for f in dataclasses.fields(ModelConfig)}
    rows = flat_keys(config)
    width = max(map(len, rows), default=0)
    lines = []
    for key, value in rows.items():
        shown = base.get(key)
        if key in model_defaults:
            shown = f"unset = {model_defaults[key]!r}" if model_defaults[key] is not None else (
                "unset = derived")
        note = ("  (not a base key)" if key not in base else
                f"  ({shown})" if key in model_defaults and value is None else
                "" if base[key] == value else
                f"  (base: {shown})" if key in model_defaults else f"  (base: {shown!r})")
        lines.append(f"{key:<{width}} = {value!r}{note}  # {docs.get(key, '(no description)')}")
    return "\n".join(lines)
