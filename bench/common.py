"""Shared benchmark helpers: timing jitted steps, the backend's measured matmul peak, model FLOPs.

Every benchmark reports ratios against a reference measured in the same run, because the machines
are shared and noisy: MFU divides by the matmul rate measured here, not by a datasheet number.

Model FLOPs of one training step (forward + backward) come from `jaxformer.flops.model_flops` (the
same numbers `python -m jaxformer.cli.plan` prints), the accounting of Kaplan et al. (2020) §2.1 and
PaLM (Chowdhery et al. 2022, App. B), as MaxText logs it:

* dense part: ``6 · N · tokens`` with N the parameters that enter a matmul — the kernels of the
  blocks plus the unembedding ``vocab × d_model`` (which is a matmul even when tied). Embedding
  lookups, position tables, norms and biases are not matmuls and are left out. Forward is
  ``2·N`` per token (a multiply and an add per weight); backward is twice that (gradients with
  respect to activations and to weights).
* attention scores: per layer and sequence, ``QKᵀ`` and ``softmax·V`` each cost
  ``2 · L · S · (heads · head_dim)`` forward, so ``4·L²·H·Dh`` forward and ``12·L²·H·Dh``
  forward + backward — ``12·layers·L²·d`` when ``H·Dh = d``. A causal mask makes half of the score
  matrix useless, so it is halved (the work a fused kernel would skip; the plain XLA path still
  does it, which MFU then shows).
"""

from __future__ import annotations

import hashlib
import os
import re
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxformer.flops import measure_matmul_peak  # noqa: F401  (the benchmarks import it from here)
from jaxformer.host import cpu_name, skip_absent_tpu

skip_absent_tpu()  # no failed libtpu start on a CPU host (the benchmarks that do not import this
# module call it themselves; the TPU-compile ones load libtpu on purpose)


def block(x: Any) -> Any:
    """Wait for every array in ``x`` (asynchronous dispatch) and return it."""
    return jax.block_until_ready(x)


def time_calls(fn: Callable[[], Any], *, steps: int, warmup: int = 1) -> dict[str, Any]:
    """Time ``fn()`` (which must return its arrays): first call, ``warmup`` more, then ``steps``.

    Returns seconds: ``first`` (compile + one run for a jitted function), ``median``, ``min``,
    ``times`` (every timed call).
    """
    t0 = time.perf_counter()
    block(fn())
    first = time.perf_counter() - t0
    for _ in range(warmup):
        block(fn())
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        block(fn())
        times.append(time.perf_counter() - t0)
    return {"first": first, "median": statistics.median(times), "min": min(times), "times": times}


def compile_seconds(jitted: Callable, *args, **kwargs) -> tuple[Any, float]:
    """(compiled executable, seconds to trace + lower + compile) of a `jax.jit` function."""
    t0 = time.perf_counter()
    compiled = jitted.lower(*args, **kwargs).compile()
    return compiled, time.perf_counter() - t0


def machine(matmul_n: int = 2048) -> dict[str, Any]:
    """The machine a benchmark ran on, for its JSON: the CPU's name and cores, the load average as
    it starts, and the float32 ``matmul_n``² matmul rate measured now. The 2-core machines here
    differ by up to 3× in that rate, and same-run ratios against a peer move with it (a step that
    is mostly matmuls leaves less for a peer's extra work to add), so a ratio is read beside it."""
    return {"backend": jax.default_backend(), "cpu": cpu_name(), "cpu_count": os.cpu_count(),
            "load_average": round(os.getloadavg()[0], 2),
            "matmul_f32_gflops": round(measure_matmul_peak(matmul_n)["peak_flops"] / 1e9, 1)}


def measure_copy_bandwidth(n_bytes: int = 2**30, repeats: int = 10) -> dict[str, float]:
    """Device-memory bandwidth of a jitted elementwise pass over ``n_bytes`` of random bfloat16
    (each element read once and written once: ``2 · n_bytes`` moved), best of ``repeats`` calls."""
    x = jax.random.normal(jax.random.key(0), (n_bytes // 2,), jnp.bfloat16)
    f = jax.jit(lambda x: x * jnp.bfloat16(1.5))
    t = time_calls(lambda: f(x), steps=repeats, warmup=1)
    return {"n_bytes": n_bytes, "bytes_per_s": 2.0 * n_bytes / t["min"],
            "median_bytes_per_s": 2.0 * n_bytes / t["median"]}


def train_step_flops(cfg, params, *, batch: int, seq_len: int) -> dict[str, float]:
    """Model FLOPs of one forward + backward step (`jaxformer.flops.model_flops`, the accounting
    above) of a decoder-only or encoder model with ``params`` (its ``"params"`` tree)."""
    from jaxformer.flops import model_flops

    f = model_flops(cfg, params, batch, seq_len, seq_len)
    return {"dense": f["dense_flops_per_step"], "attention": f["attention_flops_per_step"],
            "total": f["model_flops_per_step"], "tokens": f["tokens_per_step"]}


def format_table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    """Plain-text table: ``columns`` are (key, header, format spec)."""
    cells = [[h for _, h, _ in columns]]
    for r in rows:
        cells.append([("-" if r.get(k) is None else format(r[k], fmt)) for k, _, fmt in columns])
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def program_fingerprint(compiled: Any) -> str:
    """Hash of a compiled executable's optimized, scheduled HLO without the names of its values
    and parameters and without source metadata: equal for two front ends that compile to the same
    program (then their speed differs by noise only)."""
    text = compiled.as_text()
    text = re.sub(r"\n(FileNames|FunctionNames|FileLocations|StackFrames)\n.*?(?=\n\n|\nENTRY|\n%|\Z)",
                  "\n", text, flags=re.S)
    text = re.sub(r", (metadata=\{[^}]*\}|stack_frame_id=\d+)", "", text)
    text = re.sub(r"%[\w.\-]+|[\w.]+: (?=[fsu]\d+\[)|HloModule \S+", "", text)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def round_robin_times(calls: dict[Any, Callable[[], Any]], repeats: int) -> dict[Any, list[float]]:
    """Seconds of each of ``repeats`` calls of every (already compiled) function, one call of each
    per round, so that every function sees the same machine load."""
    times = {k: [] for k in calls}
    for _ in range(repeats):
        for k, f in calls.items():
            t0 = time.perf_counter()
            block(f())
            times[k].append(time.perf_counter() - t0)
    return times


def time_round_robin(entries: list[dict], *, steps: int, warmup: int) -> None:
    """One step of each entry per round, so that every entry sees the same machine load; fills
    ``step_s`` (median), ``step_min_s``, ``first_s``, ``first_loss`` (the loss the first step
    computes, at the fresh parameters) and ``final_loss`` (the last step's) of each row."""
    for e in entries:
        t0 = time.perf_counter()
        e["row"]["first_loss"] = float(block(e["run"]()))
        e["row"]["first_s"] = time.perf_counter() - t0
        for _ in range(warmup):
            block(e["run"]())
        e["times"] = []
    for _ in range(steps):
        for e in entries:
            t0 = time.perf_counter()
            loss = block(e["run"]())
            e["times"].append(time.perf_counter() - t0)
            e["row"]["final_loss"] = float(loss)
    for e in entries:
        e["row"]["step_s"] = statistics.median(e["times"])
        e["row"]["step_min_s"] = min(e["times"])
