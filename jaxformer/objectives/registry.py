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
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from jaxformer.objectives.causal import prepare_clm, prepare_sft
from jaxformer.objectives.classify import prepare_classify
from jaxformer.objectives.cloze import ClozeOptions, prepare_cloze, resolve_cloze
from jaxformer.objectives.denoise import DenoiseOptions, denoise
from jaxformer.objectives.dpo import DPOOptions, prepare_dpo
from jaxformer.objectives.mlm import (
    MLMOptions,
    mlm_data_task,
    mlm_word_initial,
    prepare_mlm_gathered,
)
from jaxformer.objectives.plm import PLMOptions, prepare_plm
from jaxformer.objectives.prefix_lm import PrefixLMOptions, prepare_prefix_lm
from jaxformer.objectives.qa import QAOptions, prepare_qa
from jaxformer.objectives.scheduled_sampling import ScheduledSamplingOptions
from jaxformer.objectives.seq2seq import prepare_seq2seq
from jaxformer.objectives.span_corruption import SpanCorruptionOptions, span_corruption
from jaxformer.settings import as_declared, merge, read, section
from jaxformer.vocab import SpecialTokens

PrepareFn = Callable[..., dict]
# (tokens [n], rng, special, **options) -> (inputs, targets): one example, without EOS, in NumPy.
CorruptFn = Callable[..., tuple[np.ndarray, np.ndarray]]
HostFn = Callable[[np.ndarray, np.random.Generator], tuple[np.ndarray, np.ndarray]]
ExampleTransform = Callable[[dict, np.random.Generator], dict]

# `jaxformer.data.pipeline`
DATA_TASKS = ("lm", "seq2seq", "classify", "sft", "span_corruption", "qa", "sentence_pairs",
              "preference", "preference_seq2seq")
FRAMINGS = ("eos", "bos_eos", "cls_sep", "none")


@dataclasses.dataclass(frozen=True)
class Objective:
    """One training objective.

    Attributes:
      name: its ``objective.name``.
      prepare: device side, ``prepare(batch, rng, special, options) -> {"model_inputs", "targets",
        "weights"}`` (see `jaxformer.objectives`); ``options`` is an instance of `options` (None
        when the objective has none).
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
      data_task_for: ``f(options) -> data task`` when an option chooses it (MLM's
        ``sentence_pairs``); None = always ``data_task``. `resolve` applies it.
      with_tokenizer: ``f(options, tokenizer) -> {keyword: value}``, extra ``prepare`` arguments
        resolved on the host with the run's tokenizer (the cloze pattern's and label words' ids,
        MLM's ``word_initial`` table), or None; ``tokenizer`` is None when `bind` is given none.
      decoder_start: ``prepare`` takes ``decoder_start_id`` (encoder-decoder teacher forcing: the
        ``objective.decoder_start_id`` every objective section holds).
      resolved_options: the instance of `options` this objective was resolved with (`resolve`;
        None before, or when it has no options): a method given no options uses them (else the
        defaults), so the resolved objective stands for the (name, options) pair.
    """

    name: str
    prepare: PrepareFn
    data_task: str
    framing: str | None = "eos"
    corrupt: CorruptFn | None = None
    options: type | None = None
    data_task_for: Callable[[Any], str] | None = None
    with_tokenizer: Callable[[Any, Any], Mapping[str, Any]] | None = None
    decoder_start: bool = False
    resolved_options: Any = None

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

    def checked_options(self, options: Any = None) -> Any:
        """``options``, an instance of `options` (None: those it was resolved with, else its
        defaults); ValueError for another type (a dict or a config section: build the dataclass,
        e.g. `read_options`)."""
        options = self.resolved_options if options is None else options
        if self.options is None:
            if options is not None:
                raise ValueError(f"objective {self.name!r} takes no options, got {options!r}")
            return None
        if options is None:
            return self.options()
        if not isinstance(options, self.options):
            raise ValueError(f"objective {self.name!r} takes options {self.options.__name__}, not "
                             f"{type(options).__name__}; build them with "
                             f"{self.options.__name__}(...) or read_options(section)")
        return options

    def read_options(self, section: Any) -> Any:
        """The `options` dataclass of the ``objective`` config section ``section`` (a ConfigDict
        or dict; `jaxformer.settings.read`: unset keys as their defaults), None without options."""
        return None if self.options is None else read(self.options, section)

    def resolve(self, options: Any = None) -> Objective:
        """This objective resolved with ``options`` (None: those it was resolved with, else its
        defaults): the data task they choose (`data_task_for`), and the options themselves
        (`resolved_options`); ValueError for options of another type (`checked_options`)."""
        options = self.checked_options(options)
        task = self.data_task if self.data_task_for is None else self.data_task_for(options)
        return dataclasses.replace(self, data_task=task, resolved_options=options)

    def bind(self, options: Any, special: SpecialTokens, *, tokenizer: Any = None,
             decoder_start_id: int | None = None) -> Callable[[dict, Any], dict]:
        """``prepare(batch, rng)`` bound to ``special`` and ``options`` (an instance of `options`;
        None: its defaults); an objective `with_tokenizer` also takes what it resolves with the
        run's ``tokenizer`` (cloze's ids, MLM's ``word_initial`` table), one `decoder_start` the
        first decoder input ``decoder_start_id`` (None: the prepare's default, the pad id)."""
        options = self.checked_options(options)
        kwargs = {} if self.with_tokenizer is None else dict(self.with_tokenizer(options, tokenizer))
        if self.decoder_start:
            kwargs["decoder_start_id"] = decoder_start_id
        return functools.partial(self.prepare, special=special, options=options, **kwargs)

    def host_transform(self, special: SpecialTokens, options: Any = None) -> HostFn | None:
        """``f(tokens [n], rng) -> (inputs, targets)``: ``corrupt`` with this objective's
        ``options`` (None: its defaults); None for device-only objectives."""
        if self.corrupt is None:
            return None
        options = self.checked_options(options)
        kwargs = {} if options is None else dataclasses.asdict(options)
        return functools.partial(self.corrupt, special=special, **kwargs)

    def example_transform(self, special: SpecialTokens, options: Any = None
                          ) -> ExampleTransform | None:
        """The pipeline's ``(example, rng) -> example`` step: `host_transform` on
        ``example["inputs"]``, returning the example with ``inputs`` and ``targets``."""
        fn = self.host_transform(special, options)
        if fn is None:
            return None

        def transform(example: dict, rng: np.random.Generator) -> dict:
            inputs, targets = fn(np.asarray(example["inputs"]), rng)
            return {**example, "inputs": inputs, "targets": targets}

        return transform


OBJECTIVES: dict[str, Objective] = {}


def _fields(options: type | None) -> dict[str, dataclasses.Field]:
    return {} if options is None else {f.name: f for f in dataclasses.fields(options)}


def register_objective(objective: Objective) -> Objective:
    """Add ``objective`` to `OBJECTIVES` (ValueError if its name is taken, or if one of its options
    is already declared by another objective's options class with another default)."""
    if objective.name in OBJECTIVES:
        raise ValueError(f"objective {objective.name!r} is already registered")
    mine = objective.options() if objective.options else None
    for other in option_classes():
        theirs = other()
        for key in _fields(objective.options).keys() & _fields(other).keys():
            if getattr(mine, key) != getattr(theirs, key):
                raise ValueError(f"objective {objective.name!r}: option {key!r} defaults to "
                                 f"{getattr(mine, key)!r}, but {other.__name__} declares it with "
                                 f"{getattr(theirs, key)!r}")
    OBJECTIVES[objective.name] = objective
    return objective


def option_classes() -> tuple[type, ...]:
    """The options classes of the registered objectives, each once, in registration order."""
    return tuple(dict.fromkeys(o.options for o in OBJECTIVES.values() if o.options))


def option_settings() -> dict:
    """The declared options of every registered objective (`jaxformer.settings` tree): the
    ``objective`` section of the training config holds them all."""
    return merge(*(section(cls) for cls in option_classes()), where="objective.")


def get_objective(name: str) -> Objective:
    """The registered objective ``name``."""
    if name not in OBJECTIVES:
        raise ValueError(f"unknown objective {name!r}; choose one of {sorted(OBJECTIVES)}")
    return OBJECTIVES[name]


def check_objective(stated: Any) -> str:
    """The name of the ``objective`` config section ``stated`` (a ConfigDict or dict, as the config
    holds it: every objective's options), after checking that the options set in it are its
    objective's: another objective's option at a value other than its default is a ValueError
    naming it. The stated values are compared as their settings read them
    (`jaxformer.settings.as_declared`); the named objective's own options are read once, by
    `jaxformer.train.config.train_settings`."""
    name = stated["name"]
    own = _fields(get_objective(name).options)
    for cls in option_classes():
        for key, s in section(cls).items():  # in declaration order: the first such option is named
            value = stated[key] if key in stated else None
            if key in own or value is None or as_declared(value, s.type) == s.default:
                continue
            users = [n for n, o in OBJECTIVES.items() if o.options is cls]
            raise ValueError(f"objective.{key}={as_declared(value, s.type)!r} applies to objective "
                             f"{users[0]!r}, not {name!r}; leave it at its default {s.default!r}")
    return name


def bind_objective(name: str, options: Any, special: SpecialTokens, *, tokenizer: Any = None,
                   decoder_start_id: int | None = None) -> Callable[[dict, Any], dict]:
    """``prepare(batch, rng)`` of objective ``name`` with ``options`` (`Objective.bind`)."""
    return get_objective(name).bind(options, special, tokenizer=tokenizer,
                                    decoder_start_id=decoder_start_id)


def host_transform(name: str, special: SpecialTokens, options: Any = None) -> HostFn | None:
    """`Objective.host_transform` of objective ``name``: per example ``f(tokens [n], rng) ->
    (inputs, targets)``, or None."""
    return get_objective(name).host_transform(special, options)


def check_data_task(objective: Objective | str, options: Any = None) -> Objective:
    """``objective`` (or the registered objective of that name) with the data task its
    ``options`` (an instance of its options dataclass; None: the defaults) choose
    (`Objective.resolve`); ValueError naming the option when they choose none."""
    objective = get_objective(objective) if isinstance(objective, str) else objective
    if not isinstance(objective, Objective):
        raise TypeError(f"objective={objective!r}: expected an Objective or its name; read a config "
                        "section's options with get_objective(name).read_options(section)")
    return objective.resolve(options)


# The built-in objectives (papers cited in their modules).
register_objective(Objective("clm", prepare_clm, data_task="lm", framing="eos",
                             options=ScheduledSamplingOptions))
register_objective(Objective("mlm", prepare_mlm_gathered, data_task="lm", framing="cls_sep",
                             options=MLMOptions, data_task_for=mlm_data_task,
                             with_tokenizer=mlm_word_initial))
register_objective(Objective("seq2seq", prepare_seq2seq, data_task="seq2seq",
                             options=ScheduledSamplingOptions, decoder_start=True))
register_objective(Objective("span_corruption", prepare_seq2seq, data_task="span_corruption",
                             corrupt=span_corruption, options=SpanCorruptionOptions,
                             decoder_start=True))
register_objective(Objective("denoise", prepare_seq2seq, data_task="span_corruption",
                             corrupt=denoise, options=DenoiseOptions, decoder_start=True))
register_objective(Objective("classify", prepare_classify, data_task="classify", framing=None))
register_objective(Objective("cloze", prepare_cloze, data_task="classify", framing="cls_sep",
                             options=ClozeOptions, with_tokenizer=resolve_cloze))
register_objective(Objective("sft", prepare_sft, data_task="sft"))
register_objective(Objective("qa", prepare_qa, data_task="qa", framing="cls_sep", options=QAOptions))
register_objective(Objective("plm", prepare_plm, data_task="lm", framing="eos", options=PLMOptions))
register_objective(Objective("prefix_lm", prepare_prefix_lm, data_task="lm", framing="eos",
                             options=PrefixLMOptions))
# Preference tuning (DPO, `jaxformer.objectives.dpo`): decoder-only and encoder-decoder rows.
register_objective(Objective("dpo", prepare_dpo, data_task="preference", options=DPOOptions))
register_objective(Objective("dpo_seq2seq", prepare_dpo, data_task="preference_seq2seq",
                             options=DPOOptions, decoder_start=True))
