"""Checks of the machine the demo runs on (they explain a slow run rather than change it).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np


def xla_denormal_check(n: int = 384, repeats: int = 10) -> dict:
    """Does XLA on CPU flush float32 denormals to zero, and do denormal inputs slow it down?

    T5's unscaled attention logits can underflow to denormals, which run ~10-100x slower on x86
    unless the FPU flushes them (FTZ) and treats denormal inputs as zero (DAZ). Checks both flags
    on results and inputs, and times one jitted matmul+elementwise op on normal vs denormal data.
    """
    tiny = np.float32(1e-20)
    ftz = float(jax.jit(lambda a, b: a * b)(tiny, tiny)) == 0.0  # 1e-40 is denormal
    daz = float(jax.jit(lambda a: a * 2.0)(np.float32(1e-40))) == 0.0
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    f = jax.jit(lambda a, b: jnp.tanh(a @ b) + b * b)

    def timed(b):
        f(a, b).block_until_ready()
        t = time.perf_counter()
        for _ in range(repeats):
            f(a, b).block_until_ready()
        return (time.perf_counter() - t) / repeats

    normal = timed(rng.standard_normal((n, n), dtype=np.float32))
    denormal = timed((rng.standard_normal((n, n)) * 1e-39).astype(np.float32))
    return {"flush_to_zero": ftz, "denormals_are_zero": daz,
            "denormal_slowdown": round(denormal / normal, 2)}
