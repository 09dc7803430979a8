"""JAX's persistent compilation cache for the command lines: a second run skips XLA compilation.

A tiny fine-tune on a 2-core machine spent most of its start-up compiling the same programs
(parameter init, train step, eval step) every run; JAX can keep the compiled executables on disk,
keyed by the program, the backend and the JAX version, and reuse them. `enable_compilation_cache`
turns that on at ``<jaxformer cache>/xla`` (``$JAXFORMER_CACHE``, default ``~/.cache/jaxformer``)
for ``train.py`` and ``python -m jaxformer.cli.evaluate`` / ``predict`` / ``generate`` / ``answer``.
``JAX_COMPILATION_CACHE_DIR`` (JAX's own setting) wins when set; ``JAXFORMER_COMPILATION_CACHE=0``
turns it off. Library functions leave JAX's configuration alone; only these commands set it.
"""

from __future__ import annotations

import os

import jax

from jaxformer.data.fetch import cache_dir

OFF_ENV = "JAXFORMER_COMPILATION_CACHE"
MIN_COMPILE_SECONDS = 0.2  # JAX's default, 1 s, leaves out the many small programs of a step


def enable_compilation_cache() -> str | None:
    """Point JAX's persistent compilation cache at ``<jaxformer cache>/xla`` unless it already has
    a directory or ``$JAXFORMER_COMPILATION_CACHE`` is 0/false/no; returns the directory in use
    (None: off)."""
    if os.environ.get(OFF_ENV, "").strip().lower() in ("0", "false", "no"):
        return None
    if jax.config.jax_compilation_cache_dir:
        return jax.config.jax_compilation_cache_dir
    path = cache_dir() / "xla"
    jax.config.update("jax_compilation_cache_dir", str(path))
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    return str(path)
