"""Learning-rate schedules as optax schedules (``step -> lr``, jit-able).

Step convention (all schedules): ``step`` is optax's update count, the number of optimizer updates
already applied, so the first update is evaluated at step 0. Warmups are linear from 0 at step 0 to
the peak at ``step == warmup_steps``, as in `optax.warmup_cosine_decay_schedule`. With gradient
accumulation the count advances once per applied update, not per micro-batch.

* `inverse_sqrt` — Vaswani et al. 2017, eq. (3):
  ``lr = scale · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)``. The formula is undefined at
  step 0 (step^-0.5 = ∞); we take its limit there, the warmup branch, which is 0 — consistent
  with the other warmups (the first update only initialises Adam's moments).
* `warmup_rsqrt` — the same shape with a given peak: ``peak · min(step / warmup,
  sqrt(warmup / step))``; ``inverse_sqrt(d, w, s) == warmup_rsqrt(s · (d·w)^-0.5, w)``.
* `warmup_cosine` — linear warmup, then cosine decay to ``end_value`` at ``total_steps``
  (Loshchilov & Hutter 2017, without restarts); constant ``end_value`` afterwards.
* `warmup_linear` — linear warmup, then linear decay to ``end_value`` at ``total_steps`` (BERT,
  Devlin et al. 2019 §A.2).
* `constant`.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import optax
from absl import logging


def _check_warmup(warmup_steps: int, total_steps: int | None = None, *, positive: bool = False):
    if warmup_steps < (1 if positive else 0):
        raise ValueError(f"optimizer.warmup_steps={warmup_steps} must be "
                         f"{'≥ 1 for rsqrt schedules' if positive else '≥ 0'}")
    if total_steps is not None and total_steps <= warmup_steps:
        raise ValueError(f"total steps {total_steps} must exceed optimizer.warmup_steps="
                         f"{warmup_steps} for a schedule that decays after the warmup")


def warmup_rsqrt(peak: float, warmup_steps: int) -> optax.Schedule:
    """Linear warmup to ``peak`` at ``warmup_steps``, then ``peak · sqrt(warmup_steps / step)``."""
    _check_warmup(warmup_steps, positive=True)

    def schedule(step):
        s = jnp.asarray(step, jnp.float32)
        decay = jnp.sqrt(warmup_steps / jnp.maximum(s, 1.0))  # finite at step 0, where warmup is 0
        return peak * jnp.minimum(s / warmup_steps, decay)

    return schedule


def inverse_sqrt(d_model: int, warmup_steps: int, scale: float = 1.0) -> optax.Schedule:
    """Vaswani et al. 2017 eq. (3): ``scale · d_model^-0.5 · min(step^-0.5, step·warmup^-1.5)``,
    0 at step 0 (see the module docstring); peak ``scale · (d_model · warmup)^-0.5``."""
    if d_model < 1:
        raise ValueError(f"d_model={d_model} must be ≥ 1")
    _check_warmup(warmup_steps, positive=True)
    return warmup_rsqrt(scale * (d_model * warmup_steps) ** -0.5, warmup_steps)


def warmup_cosine(peak: float, warmup_steps: int, total_steps: int,
                  end_value: float = 0.0) -> optax.Schedule:
    """Linear warmup (0 → peak), cosine decay to ``end_value`` at ``total_steps`` (warmup
    included, as `optax.warmup_cosine_decay_schedule`), then constant."""
    _check_warmup(warmup_steps, total_steps)
    return optax.warmup_cosine_decay_schedule(0.0, peak, warmup_steps, total_steps, end_value)


def warmup_linear(peak: float, warmup_steps: int, total_steps: int,
                  end_value: float = 0.0) -> optax.Schedule:
    """Linear warmup (0 → peak), linear decay to ``end_value`` at ``total_steps``, then constant."""
    _check_warmup(warmup_steps, total_steps)
    return optax.join_schedules(
        [optax.linear_schedule(0.0, peak, warmup_steps),
         optax.linear_schedule(peak, end_value, total_steps - warmup_steps)], [warmup_steps])


def constant(value: float) -> optax.Schedule:
    """``lr = value`` at every step."""
    return optax.constant_schedule(value)


SCHEDULES = ("inverse_sqrt", "warmup_rsqrt", "warmup_cosine", "warmup_linear", "constant")


def make_schedule(opt_cfg: Any, d_model: int, total_steps: int) -> optax.Schedule:
    """The schedule named ``opt_cfg.schedule``, from the ``optimizer`` config keys ``peak_lr``,
    ``scale``, ``warmup_steps``, ``end_lr`` (``d_model`` only for ``inverse_sqrt``; ``total_steps``,
    the number of optimizer updates, only for the decaying schedules). A decaying schedule's warmup
    that is not shorter than the run (a smoke run of a long config) is clipped to
    ``total_steps - 1``, with a warning."""
    name = opt_cfg.schedule
    if name == "inverse_sqrt":
        return inverse_sqrt(d_model, opt_cfg.warmup_steps, opt_cfg.scale)
    if name == "warmup_rsqrt":
        return warmup_rsqrt(opt_cfg.peak_lr, opt_cfg.warmup_steps)
    if name in ("warmup_cosine", "warmup_linear"):
        warmup = clipped_warmup(opt_cfg.warmup_steps, total_steps)
        decaying = warmup_cosine if name == "warmup_cosine" else warmup_linear
        return decaying(opt_cfg.peak_lr, warmup, total_steps, opt_cfg.end_lr)
    if name == "constant":
        return constant(opt_cfg.peak_lr)
    raise ValueError(f"unknown optimizer.schedule {name!r}; choose one of {list(SCHEDULES)}")


def clipped_warmup(warmup_steps: int, total_steps: int) -> int:
    """``warmup_steps``, or ``total_steps - 1`` (warning once) when the run is not longer."""
    if warmup_steps < total_steps or warmup_steps < 0 or total_steps < 1:
        return warmup_steps  # fits, or invalid: the schedule's check names it
    logging.warning("optimizer.warmup_steps=%d is not shorter than the run (%d steps): clipped to "
                    "%d", warmup_steps, total_steps, total_steps - 1)
    return total_steps - 1
