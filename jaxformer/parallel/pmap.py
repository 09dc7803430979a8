"""The pmap path: data parallelism with a replicated train state, for code that expects `jax.pmap`.

`jax.pmap` is in maintenance mode; the jit path over a mesh is the default. This runner wraps the
same train step (`make_train_step(..., axis_name="batch")`), so both paths compute the same update:
each local device gets ``batch_size / local_device_count`` rows, gradient and loss sums are
`psum`-ed across devices, and every replica applies the identical optimizer update.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np

AXIS = "batch"


class PmapRunner:
    """Holds a replicated state and runs ``step_fn(state, batch)`` under `jax.pmap`.

    ``step_fn`` must be built with ``axis_name="batch"``.
    """

    def __init__(self, step_fn: Callable, state, devices=None):
        self.devices = list(devices or jax.local_devices())
        host_state = jax.device_get(state)
        self._state = jax.device_put_replicated(host_state, self.devices)
        self._step = jax.pmap(step_fn, axis_name=AXIS, devices=self.devices, donate_argnums=(0,))

    def split(self, batch: dict) -> dict:
        n = len(self.devices)
        out = {}
        for k, v in batch.items():
            v = np.asarray(v)
            if v.shape[0] % n:
                raise ValueError(f"pmap: batch[{k!r}] has {v.shape[0]} rows, not divisible by "
                                 f"{n} local devices")
            out[k] = v.reshape(n, v.shape[0] // n, *v.shape[1:])
        return out

    def step(self, batch: dict):
        self._state, metrics = self._step(self._state, self.split(batch))
        return self._state, jax.tree.map(lambda x: x[0], metrics)

    def state(self):
        """The state of replica 0 (all replicas are identical)."""
        return jax.tree.map(lambda x: x[0], self._state)

    def params(self):
        return self.state().params
