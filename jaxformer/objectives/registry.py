"""The objective registry: one `Objective` per ``objective.name``, declaring everything the data
pipeline and the train step need to know about it.

An objective is a device-side ``prepare`` (pure jnp, inside the jitted step), the data task the
pipeline builds its examples for (``data.task`` is derived from it: configs leave it out), the
framing those examples get unless ``data.framing`` says otherwise, an optional host-side
per-example corruption (NumPy, before packing) and the section of ``objective.*`` options it reads
(a dataclass of `jaxformer.settings.setting` fields: type, default, doc and check of each). Adding
an objective is one `register_objective` call::

    @dataclasses.dataclass(frozen=True)
    class MyOptions:
        my_rate: float = setting(0.1, "my_lm: fraction of tokens …", check=fraction)

    register_objective(Objective("my_lm", prepare_my_lm, data_task="lm", framing="eos",
                                 options=MyOptions))

The training config's ``objective`` section declares every registered objective's options
(`option_settings`), so ``--config.objective.my_rate=0.2`` sets it and ``--print_config`` shows its doc.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from jaxformer.objectives.causal import prepare_clm, prepare_sft
from jaxformer.objectives.classify import prepare_classify
from jaxformer.objectives.cloze import ClozeOptions, prepare_cloze, resolve_cloze
from jaxformer.objectives.denoise import DenoiseOptions, denoise
from jaxformer.objectives.mlm import (
    MLMOptions,
    mlm_data_task,
    prepare_mlm_gathered,
    uses_word_initial,
)
from jaxformer.objectives.plm import PLMOptions, prepare_plm
from jaxformer.objectives.qa import QAOptions, prepare_qa
from jaxformer.objectives.scheduled_sampling import ScheduledSamplingOptions
from jaxformer.objectives.seq2seq import prepare_seq2seq
from jaxformer.objectives.span_corruption import SpanCorruptionOptions, span_corruption
from jaxformer.options import option
from jaxformer.settings import defaults, merge, section
from jaxformer.vocab import SpecialTokens

PrepareFn = Callable[..., dict]
# (tokens [n], rng, special, **options) -> (inputs, targets): one example, without EOS, in NumPy.
CorruptFn = Callable[..., tuple[np.ndarray, np.ndarray]]
HostFn = Callable[[np.ndarray, np.random.Generator], tuple[np.ndarray, np.ndarray]]
ExampleTransform = Callable[[dict, np.random.Generator], dict]

# `jaxformer.data.pipeline`
DATA_TASKS = ("lm", "seq2seq", "classify", "sft", "span_corruption", "qa", "sentence_pairs")
FRAMINGS = ("eos", "bos_eos", "cls_sep", "none")


@dataclasses.dataclass(frozen=True)
class Objective:
    """One training objective.

    Attributes:
      name: its ``objective.name``.
      prepare: device side, ``prepare(batch, rng, special, cfg) -> {"model_inputs", "targets",
        "weights"}`` (see `jaxformer.objectives`).
      data_task: the example format the pipeline builds (one of `DATA_TASKS`): "lm" text rows,
        "classify" text + label, "seq2seq" source/target pairs, "sft" prompt/response,
        "span_corruption" text pieces turned into inputs/targets by ``corrupt``, or "qa"
        context/question/answer windows (`jaxformer.data.qa_windows`), or "sentence_pairs" ``[CLS] A
        [SEP] B [SEP]`` rows with a pair label (`jaxformer.data.sentence_pairs`).
      framing: how the pipeline wraps each example when ``data.framing`` is unset (one of
        `FRAMINGS`: "eos" ``text </s>``, "cls_sep" ``[CLS] text [SEP]`` …); None when no framing
        is usual (classification: BERT's [CLS]/[SEP] or GPT's EOS), so the config must choose.
      corrupt: host side, ``corrupt(tokens [n], rng, special, **options) -> (inputs, targets)``
        applied to every example before packing (T5 span corruption, BART denoising), or None.
      options: the section dataclass of the ``objective.<key>`` options it reads (each field a
        `jaxformer.settings.setting`: type, default, one-line doc, check), or None; every other
        objective refuses a non-default value of them (`check_objective`).
      data_task_for: ``f(cfg) -> data task`` when an option chooses it (MLM's ``sentence_pairs``);
        None = always ``data_task``. `check_data_task` resolves it (`resolve`).
      with_tokenizer: ``f(cfg, tokenizer) -> {keyword: value}``, extra ``prepare`` arguments
        resolved on the host with the run's tokenizer (the cloze pattern's and label words' ids),
        or None.
    """

    name: str
    prepare: PrepareFn
    data_task: str
    framing: str | None = "eos"
    corrupt: CorruptFn | None = None
    options: type | None = None
    data_task_for: Callable[[Any], str] | None = None
    with_tokenizer: Callable[[Any, Any], Mapping[str, Any]] | None = None

    def __post_init__(self) -> None:
        if self.data_task not in DATA_TASKS:
            raise ValueError(f"objective {self.name!r}: data_task={self.data_task!r} is not one of "
                             f"{DATA_TASKS}")
        if self.framing is not None and self.framing not in FRAMINGS:
            raise ValueError(f"objective {self.name!r}: framing={self.framing!r} is not one of "
                             f"{FRAMINGS} or None")
        if (self.data_task == "span_corruption") != (self.corrupt is not None):
            raise ValueError(f"objective {self.name!r}: data_task 'span_corruption' and a host-side "
                             "corrupt function go together (the pipeline hands it text pieces)")
        if self.options is not None and not dataclasses.is_dataclass(self.options):
            raise ValueError(f"objective {self.name!r}: options must be a dataclass of "
                             "jaxformer.settings.setting fields (type, default, doc, check), not "
                             f"{type(self.options).__name__}")

    @property
    def option_defaults(self) -> Mapping[str, Any]:
        """``{option: default}`` of `options` (empty without options)."""
        return types.MappingProxyType(defaults(self.options) if self.options else {})

    def resolve(self, cfg: Any) -> Objective:
        """This objective with the data task its options ``cfg`` choose (`data_task_for`)."""
        if self.data_task_for is None or cfg is None:
            return self
        return dataclasses.replace(self, data_task=self.data_task_for(cfg))

    def bind(self, cfg: Any, special: SpecialTokens, word_initial: Any = None,
             tokenizer: Any = None) -> Callable[[dict, Any], dict]:
        """``prepare(batch, rng)`` bound to ``special`` and the options ``cfg`` (the ``objective``
        config section); MLM's ``whole_word_mask`` and span masking also take the tokenizer's
        ``word_initial`` table (`Tokenizer.word_initial`); an objective `with_tokenizer` takes
        what it resolves with ``tokenizer`` (ValueError without one)."""
        if uses_word_initial(cfg):
            return functools.partial(self.prepare, special=special, cfg=cfg,
                                     word_initial=word_initial)
        if self.with_tokenizer is not None:
            if tokenizer is None:
                raise ValueError(f"objective {self.name!r} needs the run's tokenizer: "
                                 "bind_objective(..., tokenizer=tokenizer)")
            return functools.partial(self.prepare, special=special, cfg=cfg,
                                     **self.with_tokenizer(cfg, tokenizer))
        return functools.partial(self.prepare, special=special, cfg=cfg)

    def host_transform(self, special: SpecialTokens, cfg: Any = None) -> HostFn | None:
        """``f(tokens [n], rng) -> (inputs, targets)``: ``corrupt`` with this objective's options
        from ``cfg`` (defaults where unset); None for device-only objectives."""
        if self.corrupt is None:
            return None
        kwargs = {key: option(cfg, key, default) for key, default in self.option_defaults.items()}
        return functools.partial(self.corrupt, special=special, **kwargs)

    def example_transform(self, special: SpecialTokens, cfg: Any = None
                          ) -> ExampleTransform | None:
        """The pipeline's ``(example, rng) -> example`` step: `host_transform` on
        ``example["inputs"]``, returning the example with ``inputs`` and ``targets``."""
        fn = self.host_transform(special, cfg)
        if fn is None:
            return None

        def transform(example: dict, rng: np.random.Generator) -> dict:
            inputs, targets = fn(np.asarray(example["inputs"]), rng)
            return {**example, "inputs": inputs, "targets": targets}

        return transform


OBJECTIVES: dict[str, Objective] = {}
# Every objective option with its default (the union of the registered objectives' options);
# `base_config` declares them all (`option_settings`) so that ``--config.objective.<key>=…`` can set any.
OPTION_DEFAULTS: dict[str, Any] = {}


def register_objective(objective: Objective) -> Objective:
    """Add ``objective`` to `OBJECTIVES` (ValueError if its name is taken, or if one of its options
    is already declared by another objective with another default)."""
    if objective.name in OBJECTIVES:
        raise ValueError(f"objective {objective.name!r} is already registered")
    for key, default in objective.option_defaults.items():
        if key in OPTION_DEFAULTS and OPTION_DEFAULTS[key] != default:
            raise ValueError(f"objective {objective.name!r}: option {key!r} defaults to "
                             f"{default!r}, but another objective declares it with "
                             f"{OPTION_DEFAULTS[key]!r}")
    OBJECTIVES[objective.name] = objective
    OPTION_DEFAULTS.update(objective.option_defaults)
    return objective


def option_settings() -> dict:
    """The declared options of every registered objective (`jaxformer.settings` tree): the
    ``objective`` section of the training config holds them all."""
    return merge(*(section(o.options) for o in OBJECTIVES.values() if o.options),
                 where="objective.")


def get_objective(name: str) -> Objective:
    """The registered objective ``name``."""
    if name not in OBJECTIVES:
        raise ValueError(f"unknown objective {name!r}; choose one of {sorted(OBJECTIVES)}")
    return OBJECTIVES[name]


def check_objective(cfg: Any) -> str:
    """The objective's name, after checking that its options fit it (ValueError naming them)."""
    name = option(cfg, "name", "")
    objective = get_objective(name)
    for key, default in OPTION_DEFAULTS.items():
        value = option(cfg, key, default)
        if value != default and key not in objective.option_defaults:
            users = [n for n, o in OBJECTIVES.items() if key in o.option_defaults]
            raise ValueError(f"objective.{key}={value!r} applies to objective {users[0]!r}, not "
                             f"{name!r}; leave it at its default {default!r}")
    return name


def bind_objective(cfg: Any, special: SpecialTokens, word_initial: Any = None,
                   tokenizer: Any = None) -> Callable[[dict, Any], dict]:
    """``prepare(batch, rng)`` of the objective section ``cfg`` (checked: `check_objective`)."""
    return get_objective(check_objective(cfg)).bind(cfg, special, word_initial, tokenizer)


def host_transform(name: str, special: SpecialTokens, cfg: Any = None) -> HostFn | None:
    """`Objective.host_transform` of objective ``name``: per example ``f(tokens [n], rng) ->
    (inputs, targets)``, or None."""
    return get_objective(name).host_transform(special, cfg)


def check_data_task(objective_cfg: Any, data_cfg: Any) -> Objective:
    """The objective of section ``objective_cfg`` (or a name), after checking the ``data.task`` an
    older config (or an old run's config.json) may still set: it must be the objective's."""
    name = objective_cfg if isinstance(objective_cfg, str) else option(objective_cfg, "name", "")
    objective = get_objective(name).resolve(None if isinstance(objective_cfg, str) else objective_cfg)
    legacy = option(data_cfg, "task")
    if legacy is not None and legacy != objective.data_task:
        raise ValueError(f"data.task={legacy!r} does not fit objective.name={name!r}, whose data "
                         f"task is {objective.data_task!r}; remove data.task (it is derived from "
                         "objective.name)")
    return objective


# The built-in objectives (papers cited in their modules).
register_objective(Objective("clm", prepare_clm, data_task="lm", framing="eos",
                             options=ScheduledSamplingOptions))
register_objective(Objective("mlm", prepare_mlm_gathered, data_task="lm", framing="cls_sep",
                             options=MLMOptions, data_task_for=mlm_data_task))
register_objective(Objective("seq2seq", prepare_seq2seq, data_task="seq2seq",
                             options=ScheduledSamplingOptions))
register_objective(Objective("span_corruption", prepare_seq2seq, data_task="span_corruption",
                             corrupt=span_corruption, options=SpanCorruptionOptions))
register_objective(Objective("denoise", prepare_seq2seq, data_task="span_corruption",
                             corrupt=denoise, options=DenoiseOptions))
register_objective(Objective("classify", prepare_classify, data_task="classify", framing=None))
register_objective(Objective("cloze", prepare_cloze, data_task="classify", framing="cls_sep",
                             options=ClozeOptions, with_tokenizer=resolve_cloze))
register_objective(Objective("sft", prepare_sft, data_task="sft"))
register_objective(Objective("qa", prepare_qa, data_task="qa", framing="cls_sep", options=QAOptions))
register_objective(Objective("plm", prepare_plm, data_task="lm", framing="eos", options=PLMOptions))
