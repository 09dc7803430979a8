"""Reading one option of a config section, whatever holds it.

Config sections reach library code as ``ml_collections.ConfigDict`` (train.py), plain dicts (a
config read back from ``config.json``, tests, notebooks), dataclasses or nothing at all; the data
sources and the objectives read their options through `option` alone.
"""

from __future__ import annotations

from typing import Any


def option(section: Any, key: str, default: Any = None) -> Any:
    """``section[key]`` of a ConfigDict or dict (``section.key`` of another object), or ``default``
    when ``section`` is None, lacks ``key`` or holds None there (an unset placeholder)."""
    if section is None:
        return default
    getter = getattr(section, "get", None)
    value = getter(key, default) if callable(getter) else getattr(section, key, default)
    return default if value is None else value
