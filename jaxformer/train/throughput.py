"""Where a training run's wall time goes: step time, tokens/s, model TFLOP/s per device and MFU of
each logged interval, and the run's goodput at its end.

The loop tells `Throughput` what it is doing besides training steps (`phase`): compiling (the
first step of the process, blocked on, its own run included), waiting for data, evaluating,
checkpointing, writing a profile. What is left of the wall time is training steps.

* **Step time** of a logged row: the wall time since the previous row (or since the compiled first
  step), less the phases in between, over the steps in between. It is taken when the row's metrics
  have been fetched (the device has finished the step), so it is the device's step time plus any
  input stall, as MaxText logs it. A row with no step in its interval but the compiling one (the
  first row of ``log_every_steps=1``) has none.
* **tokens/s** (``examples_per_s`` for classification): the step's own count (non-padding tokens
  or labelled examples, the ``tokens`` metric) over the step time.
* **model TFLOP/s per device**: model FLOPs of a step (`jaxformer.flops.model_flops`, padding
  included, causal attention halved) over the step time and the devices of the mesh.
* **MFU**: that rate over the device's peak (`jaxformer.flops.device_peak_flops`: the chip's
  published bf16 rate, or on a CPU host a float32 matmul rate measured at start-up).
* **Data wait**: the host's time fetching a batch (Grain, the checks, the transfer), counted only
  when the device had finished the previous step by the end of the fetch (``is_ready``); a fetch
  that ends while the device still runs the previous step was hidden behind it and costs nothing.
  A fetch that overlapped only part of a step counts whole, so it is an upper bound.
* **Goodput** (`goodput`): training-step time over the run's wall time from the first step to
  the end (the last checkpoint's wait included); the rest by phase.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import jax

PHASES = ("compilation", "data_wait", "evaluation", "checkpoint", "profile")
# The row keys measured with the wall clock: they differ between runs, resumes and processes,
# so the run's returned summary leaves them out (its processes report the same figures).
TIMING_KEYS = ("step_time_s", "tokens_per_s", "examples_per_s", "tflops_per_device", "mfu")


def ready(tree) -> bool:
    """Whether every array of ``tree`` is computed (`jax.Array.is_ready`; a host value: yes)."""
    return all(x.is_ready() for x in jax.tree.leaves(tree) if isinstance(x, jax.Array))


class Throughput:
    """The loop's clock (module docstring). ``flops_per_step``: model FLOPs of one step;
    ``peak_flops``: of one device, or None (no MFU); ``count_name``: ``tokens`` or ``examples``."""

    def __init__(self, start_step: int, *, flops_per_step: float, num_devices: int,
                 peak_flops: float | None, count_name: str = "tokens"):
        self.flops, self.num_devices, self.peak = flops_per_step, num_devices, peak_flops
        self.count_name = count_name
        self.totals = dict.fromkeys(PHASES, 0.0)
        self.start = time.perf_counter()
        self._mark = (start_step, self.start)  # (step, time) of the last row
        self._excluded, self._excluded_steps = 0.0, 0  # phases and compiled steps since then

    def add(self, phase: str, seconds: float, *, steps: int = 0) -> None:
        """Count ``seconds`` of ``phase`` (``steps``: training steps inside it, the compiled one)."""
        self.totals[phase] += seconds
        self._excluded += seconds
        self._excluded_steps += steps

    @contextlib.contextmanager
    def phase(self, name: str, *, steps: int = 0) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0, steps=steps)

    def row(self, step: int, count: float | None = None) -> dict:
        """The interval's step time, rate, TFLOP/s per device and MFU (module docstring) for the
        row of ``step``; ``count``: the step's tokens (or examples). Starts the next interval."""
        now = time.perf_counter()
        steps = step - self._mark[0] - self._excluded_steps
        seconds = now - self._mark[1] - self._excluded
        self._mark, self._excluded, self._excluded_steps = (step, now), 0.0, 0
        if steps <= 0 or seconds <= 0:
            return {}
        step_time = seconds / steps
        out = {"step_time_s": step_time}
        if count is not None:
            out[f"{self.count_name}_per_s"] = count / step_time
        per_device = self.flops / step_time / self.num_devices
        out["tflops_per_device"] = per_device / 1e12
        out["mfu"] = None if self.peak is None else per_device / self.peak
        return out

    def goodput(self) -> dict:
        """Wall seconds since the loop started, the training steps' share (``goodput``) and
        seconds, and each phase's seconds."""
        wall = time.perf_counter() - self.start
        steps = max(wall - sum(self.totals.values()), 0.0)
        return {"goodput": steps / wall if wall > 0 else None, "wall_s": wall, "steps_s": steps,
                **{f"{k}_s": v for k, v in self.totals.items()}}


def goodput_line(g: dict) -> str:
    """``goodput 81.2%: 97.4 s of 120.0 s in training steps; compilation 12.1 s, …`` (the phases
    that took any time)."""
    parts = ", ".join(f"{k.replace('_', ' ')} {g[f'{k}_s']:.1f} s" for k in PHASES
                      if g[f"{k}_s"] >= 0.05)
    share = "n/a" if g["goodput"] is None else f"{100 * g['goodput']:.1f}%"
    return (f"goodput {share}: {g['steps_s']:.1f} s of {g['wall_s']:.1f} s in training steps"
            + (f"; {parts}" if parts else ""))


GOODPUT_FILE = "goodput.json"
PROFILE_DIR = "profile"


def profile_window(profile_steps: str) -> tuple[int, int] | None:
    """``"N,M"`` (or ``"N"``) → (N, M), the first and last step to trace; ``""`` → None. A
    ValueError names the setting and the accepted form."""
    if not profile_steps.strip():
        return None
    parts = [p.strip() for p in profile_steps.split(",")]
    if len(parts) > 2 or not all(p.isdigit() for p in parts):
        raise ValueError(f"profile_steps={profile_steps!r}: expected 'N,M' (trace steps N to M) "
                         "or 'N', with 1 <= N <= M, e.g. --config.profile_steps=10,12")
    first, last = int(parts[0]), int(parts[-1])
    if not 1 <= first <= last:
        raise ValueError(f"profile_steps={profile_steps!r}: expected 1 <= N <= M, e.g. "
                         "--config.profile_steps=10,12")
    return first, last


class ProfileWindow:
    """A `jax.profiler` trace of steps N to M (``profile_steps``) in ``<workdir>/profile``:
    XProf's ``*.xplane.pb`` (TensorBoard's profile plugin, XProf) and a Perfetto ``*.trace.json.gz``,
    under ``plugins/profile/<run>/``. Started before step N is dispatched and stopped once step M
    has finished; a resumed run past N traces nothing. Starting and stopping (writing the trace)
    count as the ``profile`` phase of the clock."""

    def __init__(self, profile_steps: str, workdir, clock: Throughput):
        self.window, self.dir, self.clock = profile_window(profile_steps), workdir, clock
        self.active = False

    def before(self, step: int) -> None:
        if self.window is not None and step == self.window[0] and jax.process_index() == 0:
            with self.clock.phase("profile"):
                jax.profiler.start_trace(str(self.dir / PROFILE_DIR), create_perfetto_trace=True)
            self.active = True

    def after(self, step: int, metrics) -> None:
        if self.active and step == self.window[1]:
            jax.block_until_ready(metrics)
            self.close()

    def close(self) -> None:
        if self.active:
            self.active = False
            with self.clock.phase("profile"):
                jax.profiler.stop_trace()


def check_profile_steps(value: str) -> str | None:
    """The ``profile_steps`` setting's check (`jaxformer.settings`): None when valid."""
    try:
        profile_window(value)
    except ValueError:
        return "expected 'N,M' with 1 <= N <= M (trace steps N to M, e.g. 10,12), or '' for none"
    return None
