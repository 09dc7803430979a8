"""Loading a training config: a ``configs/<name>.py`` file, overrides, and the absl ``--config`` flag.

`load_config` reads ``get_config()`` of a config file, completes it from the schema
(`jaxformer.train.config.schema.base_config`: a config that replaced a whole section gets every key
back), applies ``{"a.b": value}`` overrides and locks it; `define_config_flag` does the same for
``train.py --config <file> --config.a.b=value``. A key that does not exist is refused naming it,
with the key meant (`HF_NAMES`, a close spelling). Values are checked by
`jaxformer.train.config.validation.validate_config`.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import sys
import traceback
from collections.abc import Mapping
from typing import Any

import ml_collections
from absl import flags
from ml_collections import config_flags

from jaxformer.settings import as_declared, flat, is_tuple
from jaxformer.train.config.schema import HF_NAMES, base_config, schema


def config_node(config: ml_collections.ConfigDict, dotted: str) -> tuple[Any, str]:
    """(parent, leaf name) of the existing key ``dotted = "a.b.c"``; KeyError naming the first
    missing part (overrides change keys, never add them) and the key meant: the key of the same
    meaning (`HF_NAMES`, e.g. ``learning_rate``), else a close spelling (`difflib`)."""
    parts = dotted.split(".")
    node: Any = config
    for i, part in enumerate(parts):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            where = ".".join(parts[:i]) or "the config"
            close = difflib.get_close_matches(part, list(node.keys()) if isinstance(
                node, ml_collections.ConfigDict) else [], n=1)
            hint = f"; did you mean {'.'.join([*parts[:i], close[0]])!r}?" if close else ""
            if part in HF_NAMES and HF_NAMES[part] != dotted:
                hint = (f"; did you mean {HF_NAMES[part]!r}? (what Hugging Face calls "
                        f"{part!r})")
            raise KeyError(f"{dotted!r}: {where} has no key {part!r}{hint}")
        if i < len(parts) - 1:
            node = node[part]
    return node, parts[-1]


def set_key(config: ml_collections.ConfigDict, dotted: str, value: Any) -> None:
    """``config[a][b][c] = value`` for the existing key ``dotted = "a.b.c"`` (KeyError if absent)."""
    parent, leaf = config_node(config, dotted)
    parent[leaf] = value


def complete_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Add to ``config`` (in place, and return it) every key `base_config()` declares that it lacks.

    A config written as ``c.model = preset(...)`` replaces the declared ``model`` node with one holding
    only the preset's fields, so ``--config.model.pooling=max`` would fail with a bare
    ``AttributeError``; completed, it has every field again, typed placeholders included. Values the
    config sets, its own field references and keys it added (refused later by `validate_config` if
    unknown) are kept.
    """
    def fill(node: ml_collections.ConfigDict, declared: ml_collections.ConfigDict) -> None:
        for key in declared.keys():
            if key not in node:
                node[key] = declared[key] if declared[key] is not None else declared.get_ref(key)
            elif isinstance(node[key], ml_collections.ConfigDict) and isinstance(
                    declared[key], ml_collections.ConfigDict):
                fill(node[key], declared[key])

    with config.unlocked():
        fill(config, base_config())
    return config


def load_config(path: str | os.PathLike, overrides: Mapping[str, Any] | None = None
                ) -> ml_collections.ConfigDict:
    """The training config of a config file: ``get_config()`` of ``path`` (``"file.py:arg"``
    passes ``arg`` to it), completed (`complete_config`), with ``overrides`` applied
    (``{"model.num_layers": 2}``, `set_key`: KeyError naming a key the config lacks), and locked
    (setting a key it lacks is an error, not a new key)."""
    path = os.fspath(path)
    file, _, arg = path.partition(":")
    if os.path.isdir(file):
        raise ValueError(f"config file {file!r} is a directory; give one of its config files "
                         f"(e.g. {os.path.join(file, 'gpt_pretrain_tiny.py')!r})")
    if not os.path.isfile(file):
        raise ValueError(f"config file {file!r} does not exist")
    config = _call_get_config(file, arg)
    complete_config(config)
    for key, value in (overrides or {}).items():
        set_key(config, key, value)
    config.lock()
    return split_list_options(config)


def split_list_options(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """``config`` (changed in place) with each tuple setting (``data.label_names``, ``data.columns``,
    ``optimizer.head_param_prefixes`` …) as the tuple the run reads (`jaxformer.settings.as_declared`):
    ``--config.data.label_names=neg,pos`` arrives as ``('neg,pos',)``, which messages,
    ``--print_config`` and config.json would show."""
    for dotted, s in flat({k: v for k, v in schema().items() if k != "model"}).items():
        if is_tuple(s.type):
            parent, leaf = config_node(config, dotted)
            if parent[leaf] is not None:
                parent[leaf] = as_declared(parent[leaf], s.type)
    return config


class ConfigError(ValueError):
    """A config that cannot be built, in one line: a config file's syntax, an import,
    ``get_config()`` raising, missing or returning something else (naming the file and line, with
    the file's own exception text: `_call_get_config`), or an override of a key the config lacks."""


def _where(file: str, error: BaseException) -> str:
    """``file:line`` of ``error``: the line of a `SyntaxError`, else the deepest frame of its
    traceback inside ``file`` (the line that raised, or called what raised); ``file`` alone if none."""
    def same(path: str | None) -> bool:
        return bool(path) and os.path.exists(path) and os.path.samefile(path, file)

    if isinstance(error, SyntaxError) and error.lineno and same(error.filename):
        return f"{file}:{error.lineno}"
    lines = [f.lineno for f in traceback.extract_tb(error.__traceback__) if same(f.filename)]
    return f"{file}:{lines[-1]}" if lines else file


def _call_get_config(file: str, arg: str) -> ml_collections.ConfigDict:
    """``get_config()`` (``get_config(arg)`` when ``arg``) of the config file ``file``;
    `ConfigError` in one line when the file cannot give one."""
    name = "jaxformer_config_" + os.path.splitext(os.path.basename(file))[0]
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # the user's file: a syntax error, a missing import, its own raise
        raise ConfigError(f"config file {_where(file, e)}: {_one_line(e)}") from e
    if not callable(getattr(module, "get_config", None)):
        raise ConfigError(f"config file {file} defines no get_config(): a config file returns its "
                          "ml_collections.ConfigDict from get_config() (configs/gpt_pretrain_tiny.py "
                          "is an example)")
    try:
        config = module.get_config(arg) if arg else module.get_config()
    except Exception as e:
        raise ConfigError(f"config file {_where(file, e)}: get_config() raised "
                          f"{_one_line(e)}") from e
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(f"config file {file}: get_config() returned a {type(config).__name__}, "
                          "not an ml_collections.ConfigDict (start from "
                          "jaxformer.train.config.base_config())")
    return config


def _one_line(error: BaseException) -> str:
    """``Type: message`` of ``error`` on one line (a `SyntaxError` without its file and line, which
    the caller names)."""
    text = error.msg if isinstance(error, SyntaxError) else str(error)
    return f"{type(error).__name__}: {' '.join(text.split())}" if text else type(error).__name__


def define_config_flag(name: str = "config", flag_values: Any = None,
                       sys_argv: list[str] | None = None) -> Any:
    """``config_flags.DEFINE_config_file`` whose file is read by `load_config` (so completed)
    before the command-line overrides (``--config.model.num_layers=2``) are applied, then locked."""

    class _LoadingParser(flags.ArgumentParser):
        def __init__(self, inner: flags.ArgumentParser):
            self.inner = inner  # ml_collections' own parser: names the flag type

        def parse(self, path):
            config = load_config(path)
            for arg in sys.argv if sys_argv is None else sys_argv:  # name a misspelt key
                if arg.startswith(f"--{name}."):                    # in one line
                    try:
                        config_node(config, arg[len(name) + 3:].split("=", 1)[0])
                    except KeyError as e:
                        raise ConfigError(f"{arg}: {e.args[0]}") from None
            return config

        def flag_type(self):
            return self.inner.flag_type()

    flag_values = flags.FLAGS if flag_values is None else flag_values
    holder = config_flags.DEFINE_config_file(
        name, None, "Path to a configs/<name>.py file.", flag_values=flag_values, sys_argv=sys_argv)
    flag_values[name].parser = _LoadingParser(flag_values[name].parser)
    return holder


