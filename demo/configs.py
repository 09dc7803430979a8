"""The demo's training configs: ``configs/<name>.py`` with the demo's settings and the caller's
``--set [CONFIG:]KEY=VALUE`` overrides applied, and their budgets scaled.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import ml_collections

from demo.settings import PRETRAIN_STEPS, DemoSettings
from jaxformer.train.config import config_node
from jaxformer.train.config import load_config as load_training_config

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"  # demo/ sits beside configs/


Overrides = Mapping[str, Mapping[str, Any]]


def load_config(name: str, overrides: Overrides | None = None, **settings: Any
                ) -> ml_collections.ConfigDict:
    """``configs/<name>.py:get_config()`` + ``settings`` (dotted keys) + the caller's overrides
    (``overrides["*"]`` for every config, then ``overrides[name]``)."""
    path = CONFIG_DIR / f"{name}.py"
    if not path.exists():
        raise FileNotFoundError(f"demo config {path} not found: the demo reads the configs/ folder "
                                f"beside its own folder ({Path(__file__).parent})")
    merged = {"progress_bar": True, **settings, **(overrides or {}).get("*", {}),
              **(overrides or {}).get(name, {})}
    config = load_training_config(path, merged)
    return config


# The configs the demo reads (the GPT's KJV language modelling is gpt_pretrain_tiny with the
# demo's data, steps and learning rate).
def regime_config(name: str, overrides: Overrides | None, **keys: Any
                  ) -> ml_collections.ConfigDict:
    """A fine-tuning run's config: `load_config` with the regime's ``keys`` (dotted: data,
    steps, learning rate, seed, init) applied *after* the caller's overrides, so that an override
    aimed at a config's pretraining (``--set gpt_pretrain_tiny:data.source=...``) never replaces
    the regime's data."""
    overrides = dict(overrides or {})
    overrides[name] = {**overrides.get(name, {}), **keys}
    config = load_config(name, overrides)
    config.progress_bar = False
    return config


# The BERT fine-tuning config of each ``DemoSettings.bert_head``.
BERT_HEAD_CONFIGS = {"classify": "bert_finetune_tiny", "cloze": "bert_cloze_tiny"}


DEMO_CONFIGS = ("gpt_pretrain_tiny", "bert_pretrain_tiny", *BERT_HEAD_CONFIGS.values(),
                "t5_denoise_tiny", "t5_finetune_tiny")


def _literal(text: str, current: Any) -> Any:
    """A command-line value for a key whose config value is ``current``: the raw text for string
    keys, else a Python literal (``256``, ``5e-4``, ``True``/``true``, ``(1, 2)``) or the text."""
    if isinstance(current, str):
        return text
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_overrides(items: Collection[str], default: str = "*",
                    allowed: Collection[str] = DEMO_CONFIGS) -> dict[str, dict[str, Any]]:
    """``--set [CONFIG:]KEY=VALUE`` items → `Overrides`, e.g. ``bert_pretrain_tiny:model.d_model=256``
    (one config) or ``model.d_model=256`` (the ``default`` target; ``"*"``: every config).

    Raises:
      ValueError: naming the item, for a missing ``=``, a config outside ``allowed``, or a key that
        a targeted config does not have (overrides change keys, never add them).
    """
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r}: expected [CONFIG:]KEY=VALUE")
        target, _, key = key.rpartition(":")
        target = target or default
        names = tuple(allowed) if target == "*" else (target,)
        if target != "*" and target not in allowed:
            raise ValueError(f"--set {item!r}: unknown config {target!r}; choose among "
                             f"{sorted(allowed)} (or none for all)")
        for name in names:  # every targeted config must have the key
            try:
                parent, leaf = config_node(load_config(name), key)
            except KeyError:
                raise ValueError(f"--set {item!r}: config {name!r} has no key {key!r}") from None
        out.setdefault(target, {})[key] = _literal(value, parent[leaf])
    return out


def pretrain_config(family: str, name: str, settings: DemoSettings,
                    overrides: Overrides | None) -> ml_collections.ConfigDict:
    """``configs/<name>.py`` for the demo's pretraining: `PRETRAIN_STEPS` × the scales (the
    caller's overrides of ``num_train_steps`` win), 5 evaluations."""
    config = load_config(name, {**(overrides or {}), name: {
        "num_train_steps": PRETRAIN_STEPS[family],
        **(overrides or {}).get("*", {}), **(overrides or {}).get(name, {})}})
    scale_budget(config, settings.budget_scale * settings.pretrain_scale, evals=5)
    return config


def scale_budget(config: ml_collections.ConfigDict, scale: float, *, evals: int = 0) -> None:
    """Multiply steps, warmup and cadences by ``scale``; ``evals > 0`` evaluates (and checkpoints)
    that many times, evenly spaced."""
    steps = max(int(round(config.num_train_steps * scale)), 2)
    config.num_train_steps = steps
    warm = config.optimizer.get("warmup_steps", 0)
    if warm:
        config.optimizer.warmup_steps = int(min(max(round(warm * scale), 1), steps - 1))
    if evals:
        every = max(steps // evals, 1)
        config.eval.every_steps = every
        config.checkpoint.every_steps = every
    config.log_every_steps = max(min(config.log_every_steps, steps // 20), 1)
