"""Typed config sections: each setting declares its type, default, doc, check and kind in one place.

A section is a frozen dataclass whose fields are made with `setting`; the dataclass annotation is the
type. Each module declares the section it reads (``data`` in `jaxformer.data.pipeline`, an objective's
options beside the objective, ``optimizer`` in `jaxformer.train.optim` …) and the training config
(`jaxformer.train.config.schema`) assembles them into one tree. From that tree this module derives

- `config_dict`: the ``ml_collections.ConfigDict`` of the defaults (an unset setting, default None,
  becomes a typed placeholder, so ``--config.a.b=…`` can set it);
- `check_tree`: a user's config checked against the tree, before anything is compiled: an unknown
  key (with a close spelling offered), a value of the wrong type, or one its `setting` check refuses
  is a ``ValueError`` naming the dotted key;
- `docs`: the one-line description of every key (``train.py --print_config``);
- `settings_of_kind`: the keys of a kind (what a resumed run may change is derived from it).

`jaxformer.config.ModelConfig` declares its fields the same way (``kind`` and ``doc`` metadata), so
`section` reads it too.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import operator
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import ml_collections

# Kinds of a training setting: what a resumed run (same workdir) may do with it.
RUN = "run"                # may change on resume (the change is noted in the log)
VOCABULARY = "vocabulary"  # fixes the token ids of the checkpoints: refused on resume

# A setting's own check: value -> None when valid, else what is wanted ("must be positive",
# "choose one of (…)"); the error reads "<key>=<value> is invalid: <what is wanted>".
Check = Callable[[Any], "str | None"]


@dataclasses.dataclass(frozen=True)
class Setting:
    """One declared key: its type (the annotation), default, one-line doc, check and kind.

    ``unset`` is what a None value means where that is a fixed value (``distill.temperature``:
    2.0); the doc says so too."""

    name: str
    type: Any
    default: Any
    doc: str
    check: Check | None = None
    kind: str = RUN
    unset: Any = None


Tree = Mapping[str, "Setting | Tree"]  # a section: key -> setting, or key -> nested section


def setting(default: Any, doc: str, *, check: Check | None = None, kind: str = RUN,
            unset: Any = None) -> Any:
    """A dataclass field declaring one setting (see `Setting`); ``doc`` is one line."""
    assert "\n" not in doc and doc, doc
    return dataclasses.field(default=default, metadata={
        "doc": doc, "check": check, "kind": kind, "unset": unset})


def subsection(cls: type, doc: str) -> Any:
    """A dataclass field holding the nested section ``cls`` (e.g. ``data.tokenizer``)."""
    return dataclasses.field(default_factory=cls, metadata={"doc": doc, "section": True})


@functools.cache
def section(cls: type) -> dict[str, Setting | dict]:
    """The tree of the section dataclass ``cls``, in declaration order."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Setting | dict] = {}
    for f in dataclasses.fields(cls):
        if "doc" not in f.metadata:
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with "
                            "jaxformer.settings.setting(default, doc, ...): every key has a doc")
        if f.metadata.get("section"):
            out[f.name] = section(hints[f.name])
        else:
            out[f.name] = Setting(f.name, hints[f.name], f.default, f.metadata["doc"],
                                  f.metadata.get("check"), f.metadata.get("kind", RUN),
                                  f.metadata.get("unset"))
    return out


def defaults(cls: type) -> dict[str, Any]:
    """``{key: default}`` of a flat section dataclass."""
    return {f.name: f.default for f in dataclasses.fields(cls)}


def merge(*trees: Tree, where: str = "") -> dict[str, Setting | dict]:
    """One section of several (an objective section is the union of the objectives' options);
    ValueError when two declare the same key with other defaults."""
    out: dict[str, Setting | dict] = {}
    for tree in trees:
        for key, value in tree.items():
            old = out.get(key)
            if isinstance(old, Setting) and isinstance(value, Setting) and old.default != value.default:
                raise ValueError(f"{where}{key} is declared twice, with defaults {old.default!r} "
                                 f"and {value.default!r}")
            out[key] = value
    return out


# --------------------------------------------------------------------------------------------------
# Types


def _base(tp: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed) of an annotation such as ``int | None``."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        rest = tuple(a for a in args if a is not type(None))
        return functools.reduce(operator.or_, rest), len(rest) < len(args)
    return tp, False


def _plain(tp: Any) -> type:
    """The Python class of an annotation (``tuple[str, ...]`` -> tuple)."""
    return typing.get_origin(tp) or tp


def _fits(value: Any, tp: Any) -> bool:
    tp, optional = _base(tp)
    if value is None:
        return optional
    cls = _plain(tp)
    if cls is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if cls is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if cls is tuple:
        items = [a for a in typing.get_args(tp) if a is not Ellipsis]  # tuple[str, ...]: [str]
        return isinstance(value, tuple | list) and all(_fits(v, items[0]) for v in value
                                                        if items)
    return isinstance(value, cls)


def type_name(tp: Any) -> str:
    """How errors name a setting's type: ``int``, ``float or None``, ``tuple of str``."""
    tp, optional = _base(tp)
    args = [a for a in typing.get_args(tp) if a is not Ellipsis]
    name = f"tuple of {type_name(args[0])}" if _plain(tp) is tuple and args else _plain(tp).__name__
    return f"{name} or None" if optional else name


# --------------------------------------------------------------------------------------------------
# Derived: the ConfigDict of the defaults, the check of a user's config, the docs, the kinds.


def config_dict(tree: Tree) -> ml_collections.ConfigDict:
    """The defaults of ``tree`` as a ConfigDict (None defaults as typed placeholders)."""
    out = ml_collections.ConfigDict()
    for key, node in tree.items():
        if isinstance(node, Setting):
            out[key] = (node.default if node.default is not None else
                        ml_collections.config_dict.placeholder(_plain(_base(node.type)[0])))
        else:
            out[key] = config_dict(node)
    return out


def close_key(key: str, known: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for a close spelling of ``key`` among ``known`` (else "")."""
    close = difflib.get_close_matches(key, list(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def check_tree(tree: Tree, values: Any, where: str = "", *,
               skip: Callable[[str], bool] = lambda dotted: False,
               meant: Mapping[str, str] | None = None) -> None:
    """ValueError naming the first key of ``values`` (a ConfigDict or dict) that ``tree`` does not
    declare, whose value has the wrong type, or whose check refuses it. ``where`` prefixes the key
    (``"data."``); ``skip(dotted)`` exempts keys checked elsewhere (a legacy key); ``meant`` maps
    an unknown key to the hint naming the key meant (else a close spelling is offered)."""
    for key in values.keys():
        dotted = f"{where}{key}"
        if skip(dotted):
            continue
        if key not in tree:
            hint = (meant or {}).get(key) or close_key(key, tree)
            raise ValueError(f"unknown config key {dotted!r}: {where.rstrip('.') or 'the config'} "
                             f"has no key {key!r}{hint}")
        node, value = tree[key], values[key]
        if not isinstance(node, Setting):
            if not isinstance(value, Mapping | ml_collections.ConfigDict):
                raise ValueError(f"{dotted}={value!r} must be a section (keys {sorted(node)})")
            check_tree(node, value, f"{dotted}.", skip=skip, meant=meant)
            continue
        if not _fits(value, node.type):
            raise ValueError(f"{dotted}={value!r} is of type {type(value).__name__}; expected "
                             f"{type_name(node.type)}")
        want = node.check(value) if node.check is not None and value is not None else None
        if want:
            raise ValueError(f"{dotted}={value!r} is invalid: {want}")


def docs(tree: Tree) -> dict[str, str]:
    """``{dotted key: one-line doc}`` of every setting of ``tree``."""
    return {key: s.doc for key, s in flat(tree).items()}


def flat(tree: Tree, where: str = "") -> dict[str, Setting]:
    """``{dotted key: Setting}`` of every setting of ``tree``."""
    out: dict[str, Setting] = {}
    for key, node in tree.items():
        out.update({f"{where}{key}": node} if isinstance(node, Setting) else
                   flat(node, f"{where}{key}."))
    return out


def settings_of_kind(tree: Tree, *kinds: str) -> tuple[str, ...]:
    """Dotted keys of ``tree`` whose settings are of one of ``kinds``, in declaration order."""
    return tuple(k for k, s in flat(tree).items() if s.kind in kinds)


def read(cls: type, values: Any) -> Any:
    """The section dataclass ``cls`` of ``values`` (a ConfigDict, dict or None): declared keys only
    (a `subsection` read the same way, recursively); a missing or None value as its ``unset`` value
    when it declares one, else its default; an int where a float is declared becomes a float; a
    tuple setting's list becomes a tuple, and for ``tuple[str, ...]`` a comma string (``"neg,pos"``,
    or ``("neg,pos",)``: what an unquoted ``--config.data.label_names=neg,pos`` parses to) is split
    at the commas."""
    hints = typing.get_type_hints(cls)
    out = {}
    for key, s in section(cls).items():
        value = None if values is None or key not in values else values[key]
        if not isinstance(s, Setting):
            out[key] = read(hints[key], value)
            continue
        value = value if value is not None else s.unset if s.unset is not None else s.default
        out[key] = as_declared(value, s.type)
    return cls(**out)


def is_tuple(tp: Any) -> bool:
    """Whether the annotation ``tp`` declares a tuple (``tuple[str, ...] | None`` does)."""
    return _plain(_base(tp)[0]) is tuple


def as_declared(value: Any, tp: Any) -> Any:
    """``value`` as the declared type ``tp`` reads it (see `read`): int → float, list → tuple,
    comma strings → tuples of ``str``; None stays None."""
    tp = _base(tp)[0]
    cls = _plain(tp)
    if cls is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if cls is not tuple or value is None:
        return value
    if typing.get_args(tp)[:1] == (str,):
        names = (value,) if isinstance(value, str) else tuple(value)
        if len(names) == 1 and "," in names[0]:
            names = tuple(names[0].split(","))
        return tuple(n.strip() for n in names)
    return tuple(value)


# --------------------------------------------------------------------------------------------------
# Checks (``setting(..., check=...)``): value -> None, or what it must be.


def one_of(*choices: Any) -> Check:
    return lambda v: None if v in choices else f"choose one of {choices}"


def at_least(low: float) -> Check:
    return lambda v: None if v >= low else f"must be >= {low}"


def positive(v: Any) -> str | None:
    return None if v > 0 else "must be positive"


def fraction(v: Any) -> str | None:
    return None if 0.0 <= v <= 1.0 else "must lie in [0, 1]"
