"""Scheduled sampling (Bengio et al. 2015; for transformers, Mihaylova & Martins 2019).

Teacher forcing feeds the decoder the gold previous token; at inference it reads its own. Scheduled
sampling closes that gap during training. At step ``i`` each decoder input position keeps its gold
token with probability ``ε_i`` (the teacher-forcing rate) and otherwise gets the model's own
prediction of that token. Bengio et al. 2015, §2.4, decay ``ε_i`` by one of:

    linear            ε_i = max(ε, k − c·i)           (0 ≤ ε ≤ k ≤ 1, c > 0)
    exponential       ε_i = k^i                       (0 < k < 1)
    inverse sigmoid   ε_i = k / (k + exp(i / k))      (k ≥ 1)

with ``ε`` = ``ss_min_rate`` (a floor for every schedule; 0 by default, so the last two are the
paper's formulas exactly). A transformer predicts all positions at once, so (Mihaylova & Martins
2019, §3) a first teacher-forced pass gives the predictions, each decoder input position ``t`` is
replaced with probability ``1 − ε_i`` by the prediction made at position ``t − 1`` (argmax, or
sampled at a temperature), and a second pass on the mixed inputs computes the loss on the original
targets. The first pass runs without dropout (the model's own predictions, as at inference) and
under `jax.lax.stop_gradient`; the mixed inputs are integer tokens, so no gradient flows through
them. The first input of every packed segment (BOS / the decoder start token, which no position
predicts) and padding (segment id 0) are never replaced. Evaluation stays teacher-forced.

`scheduled_sampling_mixer` builds the train step's ``mix_inputs(params, prepared, step, rng)`` hook
(`jaxformer.train.step.make_train_step`) from the objective's name and options and the model; with
``objective.scheduled_sampling="none"`` (the default) it returns None and the step is unchanged.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxformer.objectives._common import shift_right_within_segments
from jaxformer.settings import fraction, setting

Array = jnp.ndarray
MixFn = Callable[[Any, dict, Array, jax.Array], dict]

SCHEDULES = ("none", "linear", "exponential", "inverse_sigmoid")
SAMPLINGS = ("argmax", "sample")


# The ``objective.*`` options of scheduled sampling with their defaults (off). ss_k = 0 is unset:
# the linear schedule then starts at k = 1; the other two need it.
@dataclasses.dataclass(frozen=True)
class ScheduledSamplingOptions:
    """The ``objective.*`` options of objectives ``clm`` and ``seq2seq`` (Bengio et al. 2015);
    which combinations take effect: `check_scheduled_sampling`."""

    scheduled_sampling: str = setting(
        "none", "clm/seq2seq: decay of the teacher-forcing rate (Bengio et al. 2015): 'none', "
        "'linear', 'exponential' or 'inverse_sigmoid'")
    ss_k: float = setting(
        0.0, "scheduled sampling: k of the schedule (linear: start rate, default 1; exponential: "
        "0 < k < 1; inverse_sigmoid: k >= 1); 0 = unset")
    ss_c: float = setting(0.0, "scheduled sampling: linear decay per step c (> 0; linear only)")
    ss_min_rate: float = setting(
        0.0, "scheduled sampling: floor of the teacher-forcing rate (epsilon)", check=fraction)
    ss_sampling: str = setting(
        "argmax", "scheduled sampling: the model's predictions by 'argmax' or 'sample'")
    ss_temperature: float = setting(
        1.0, "scheduled sampling: temperature of ss_sampling='sample' (> 0)")


# Per objective: the decoder-input tokens that are mixed and their segment ids (`model_inputs` keys).
MIXED_INPUTS = {"clm": ("tokens", "segment_ids"), "seq2seq": ("targets_in", "targets_segment_ids")}


def linear_rate(step: Array, k: float, c: float, min_rate: float = 0.0) -> Array:
    """ε_i = max(ε, k − c·i) (Bengio et al. 2015, §2.4), float32 scalar."""
    return jnp.maximum(min_rate, k - c * jnp.asarray(step, jnp.float32))


def exponential_rate(step: Array, k: float, min_rate: float = 0.0) -> Array:
    """ε_i = max(ε, k^i), 0 < k < 1 (Bengio et al. 2015, §2.4), float32 scalar."""
    # exp(i · ln k) with ln k taken in float64: k rounded to float32 first would be off by
    # i · 6e-8 relative (3e-4 at i = 5000).
    return jnp.maximum(min_rate, jnp.exp(jnp.asarray(step, jnp.float32) * math.log(k)))


def inverse_sigmoid_rate(step: Array, k: float, min_rate: float = 0.0) -> Array:
    """ε_i = max(ε, k / (k + exp(i/k))), k ≥ 1 (Bengio et al. 2015, §2.4), float32 scalar."""
    return jnp.maximum(min_rate, k / (k + jnp.exp(jnp.asarray(step, jnp.float32) / k)))


@dataclasses.dataclass(frozen=True)
class ScheduledSampling:
    """Checked scheduled-sampling settings (`check_scheduled_sampling`)."""

    schedule: str
    k: float
    c: float
    min_rate: float
    sampling: str
    temperature: float

    def rate(self, step: Array) -> Array:
        """The teacher-forcing rate ε_i at optimizer step ``step``, float32 scalar in [0, 1]."""
        if self.schedule == "linear":
            rate = linear_rate(step, self.k, self.c, self.min_rate)
        elif self.schedule == "exponential":
            rate = exponential_rate(step, self.k, self.min_rate)
        else:
            rate = inverse_sigmoid_rate(step, self.k, self.min_rate)
        return jnp.clip(rate, 0.0, 1.0)


def check_scheduled_sampling(options: Any) -> ScheduledSampling | None:
    """The settings of ``options``, or None when scheduled sampling is off (or ``options`` are
    another objective's: not `ScheduledSamplingOptions`).

    ValueError naming the field for an unknown schedule or sampling, a parameter outside its
    schedule's range, or an ``ss_*`` option that would have no effect.
    """
    if not isinstance(options, ScheduledSamplingOptions):
        return None
    values, defaults = dataclasses.asdict(options), dataclasses.asdict(ScheduledSamplingOptions())
    schedule = values["scheduled_sampling"]
    if schedule not in SCHEDULES:
        raise ValueError(f"objective.scheduled_sampling={schedule!r} must be one of {SCHEDULES}")
    unused = ({"ss_k", "ss_c", "ss_min_rate", "ss_sampling", "ss_temperature"} if schedule == "none"
              else {"ss_c"} if schedule != "linear" else set())
    if values["ss_sampling"] == "argmax":
        unused.add("ss_temperature")
    for key in sorted(unused):
        if values[key] != defaults[key]:
            raise ValueError(f"objective.{key}={values[key]!r} has no effect with objective."
                             f"scheduled_sampling={schedule!r}, ss_sampling="
                             f"{values['ss_sampling']!r}; leave it at {defaults[key]!r}")
    if schedule == "none":
        return None
    k, c, floor = float(values["ss_k"]), float(values["ss_c"]), float(values["ss_min_rate"])
    if schedule == "linear":
        k = k or 1.0
        if not (0.0 < k <= 1.0 and c > 0.0):
            raise ValueError(f"objective.ss_k={k} and objective.ss_c={c}: the linear schedule "
                             "max(ss_min_rate, k − c·step) needs 0 < k <= 1 and c > 0 (e.g. c = "
                             "k / num_train_steps)")
    elif schedule == "exponential" and not 0.0 < k < 1.0:
        raise ValueError(f"objective.ss_k={k}: the exponential schedule k^step needs 0 < k < 1 "
                         "(e.g. 0.999; 0 = unset)")
    elif schedule == "inverse_sigmoid" and k < 1.0:
        raise ValueError(f"objective.ss_k={k}: the inverse sigmoid schedule k / (k + exp(step/k)) "
                         "needs k >= 1 (its rate is 1/2 near step k·ln k; 0 = unset)")
    if not 0.0 <= floor < 1.0:
        raise ValueError(f"objective.ss_min_rate={floor} must be in [0, 1)")
    if values["ss_sampling"] not in SAMPLINGS:
        raise ValueError(f"objective.ss_sampling={values['ss_sampling']!r} must be one of "
                         f"{SAMPLINGS}")
    if not values["ss_temperature"] > 0.0:
        raise ValueError(f"objective.ss_temperature={values['ss_temperature']} must be > 0")
    return ScheduledSampling(schedule, k, c, floor, values["ss_sampling"],
                             float(values["ss_temperature"]))


def model_predictions(logits: Array, rng: jax.Array, sampling: str = "argmax",
                      temperature: float = 1.0) -> Array:
    """The model's own tokens from logits `[B, L, V]`: int32 `[B, L]`, ``argmax`` or sampled from
    softmax(logits / temperature). Position ``t`` holds the prediction of the token after ``t``."""
    logits = jax.lax.stop_gradient(logits)
    if sampling == "argmax":
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return jax.random.categorical(rng, logits.astype(jnp.float32) / temperature).astype(jnp.int32)


def mix_predictions(tokens: Array, segment_ids: Array, predictions: Array,
                    teacher_forcing_rate: Array, rng: jax.Array) -> tuple[Array, Array]:
    """Replace decoder inputs by the model's predictions with probability ``1 − rate``.

    Args:
      tokens: decoder inputs `[B, L]` int32 (teacher forcing: the gold previous tokens).
      segment_ids: `[B, L]` int32, 0 on padding; packed segments numbered 1, 2, ….
      predictions: `[B, L]` int32, ``predictions[t]`` made at position ``t`` for input ``t + 1``.
      teacher_forcing_rate: ε_i, float scalar: the probability of keeping the gold token.
      rng: key of the per-position coin flips.

    Returns:
      ``(mixed, replaced)``, both `[B, L]`: ``mixed[t] = predictions[t − 1]`` where ``replaced``,
      else ``tokens[t]``. The first position of each segment and padding are never replaced.
    """
    proposed = shift_right_within_segments(predictions, segment_ids, start=0)
    continues = shift_right_within_segments(jnp.ones_like(segment_ids), segment_ids, start=0) == 1
    coin = jax.random.uniform(rng, tokens.shape)
    replaced = continues & (coin >= teacher_forcing_rate)
    return jnp.where(replaced, proposed, tokens).astype(tokens.dtype), replaced


def scheduled_sampling_mixer(name: str, options: Any, model: Any) -> MixFn | None:
    """``mix_inputs(params, prepared, step, rng) -> prepared`` for the train step, or None when
    scheduled sampling is off (``options.scheduled_sampling`` is "none", or ``options`` are not
    `ScheduledSamplingOptions`: another objective's).

    ``name`` is the objective (one of `MIXED_INPUTS`), ``model`` a module with
    ``apply(params, **model_inputs)``. The hook runs the first,
    teacher-forced pass on ``prepared["model_inputs"]`` with ``stop_gradient(params)``, then returns
    ``prepared`` with the decoder inputs mixed (`mix_predictions`) at the rate of ``step``.
    """
    settings = check_scheduled_sampling(options)
    if settings is None:
        return None
    if name not in MIXED_INPUTS:
        raise ValueError(f"objective.scheduled_sampling={settings.schedule!r} applies to the "
                         f"objectives {sorted(MIXED_INPUTS)}, not objective.name={name!r}")
    tokens_key, segments_key = MIXED_INPUTS[name]

    def mix_inputs(params, prepared: dict, step: Array, rng: jax.Array) -> dict:
        sample_key, coin_key = jax.random.split(rng)
        inputs = prepared["model_inputs"]
        out = model.apply(jax.lax.stop_gradient(params), **inputs)
        logits = out[0] if isinstance(out, tuple) else out
        predictions = model_predictions(logits, sample_key, settings.sampling, settings.temperature)
        mixed, _ = mix_predictions(inputs[tokens_key], inputs[segments_key], predictions,
                                   settings.rate(step), coin_key)
        return {**prepared, "model_inputs": {**inputs, tokens_key: mixed}}

    return mix_inputs
