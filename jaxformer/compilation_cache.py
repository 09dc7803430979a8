"""JAX's persistent compilation cache for the command lines: a second run skips XLA compilation.

A tiny fine-tune on a 2-core machine spent most of its start-up compiling the same programs
(parameter init, train step, eval step) every run; JAX can keep the compiled executables on disk,
keyed by the program, the backend and the JAX version, and reuse them. `enable_compilation_cache`
turns that on at ``<jaxformer cache>/xla`` (``$JAXFORMER_CACHE``, default ``~/.cache/jaxformer``)
for ``train.py`` and ``python -m jaxformer.cli.evaluate`` / ``predict`` / ``generate`` / ``answer``.
``JAX_COMPILATION_CACHE_DIR`` (JAX's own setting) wins when set; ``JAXFORMER_COMPILATION_CACHE=0``
turns it off. Library functions leave JAX's configuration alone; only these commands set it.

The compile-only commands (``jaxformer-compile``, ``jaxformer-plan --topology``) do the opposite:
`disable_compilation_cache`. Their programs are compiled for devices this process does not have (a
TPU slice from libtpu's topology), which JAX can write to the cache but not load back ("PjRtCompiler
must be constructed with a Client to call DeserializeLoadedExecutable"): with
``JAX_COMPILATION_CACHE_DIR`` set, as many TPU users have it, each run left tens of MB of entries and
the next run warned and compiled again.
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


def disable_compilation_cache() -> None:
    """Turn JAX's persistent compilation cache off for this process, whatever the environment
    says. JAX decides once per process, at its first compile, whether to use the cache, so call
    this before anything is compiled (a command's entry point)."""
    jax.config.update("jax_enable_compilation_cache", False)
