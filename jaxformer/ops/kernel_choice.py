"""Which fused attention kernel a model and a platform can run, and the fastest of them: the
kernels' limits (`unsupported`), the platform they are checked against (`target_platform`,
`backend_problem`) and ``model.attention_impl="auto"``'s choice (`fastest_attention`).

Checked at config time (`jaxformer.config.ModelConfig`, `jaxformer.train.config.check_config`),
before anything compiles, and by the kernels themselves (`jaxformer.ops.attention_kernels`, whose
docstring says why each limit is there): pure Python over the settings and jax's backend, no arrays.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from jax.extend import backend as jax_backend

KERNELS = ("cudnn", "splash", "splash_interpret", "flash", "flash_interpret")
# the kernels that add T5's relative bias and give its gradient
BIAS_KERNELS = ("cudnn", "flash", "flash_interpret")
CUDNN_DTYPES = ("bfloat16", "float16")
CUDNN_MAX_HEAD_DIM = 256  # Hopper and later; 128 on older GPUs (cuDNN refuses at compile time)
SPLASH_LANES = 128  # TPU lane width: splash blocks and padded lengths are multiples of it


def unsupported(impl: str, *, dtype: str, head_dim: int, relative_bias: bool,
                attention_dropout_rate: float, chunk_size: int, local_window: bool = False
                ) -> tuple[str, str] | None:
    """(field, why) of the first model setting ``impl`` cannot compute, or None. ``local_window``:
    ModernBERT's local layers, whose window is a dense mask no kernel here takes."""
    if impl not in KERNELS:
        return None
    name = f"attention_impl={impl!r}"
    if local_window:
        return "local_attention", (f"{name} takes no dense mask, which the local layers' window is; "
                                   "use 'xla' or 'chunked' (or 'auto')")
    if relative_bias and impl not in BIAS_KERNELS:
        return "position", (f"{name} cannot add T5's learned relative-position bias (it has no bias "
                            f"operand); use 'xla', 'chunked' or one of {BIAS_KERNELS}")
    if attention_dropout_rate:
        return "attention_dropout_rate", f"{name} has no attention dropout; set it to 0.0"
    if impl == "cudnn" and dtype not in CUDNN_DTYPES:
        return "dtype", f"{name} computes in {' or '.join(CUDNN_DTYPES)} only, not {dtype}"
    if impl == "cudnn" and (head_dim % 8 or head_dim > CUDNN_MAX_HEAD_DIM):
        return "head_dim", (f"{name} needs head_dim a multiple of 8 and <= "
                            f"{CUDNN_MAX_HEAD_DIM}, got {head_dim}")
    if impl != "cudnn" and chunk_size % SPLASH_LANES:
        return "attention_chunk_size", (f"{name} uses it as its block length, which must be a "
                                        f"multiple of {SPLASH_LANES}, got {chunk_size}")
    return None


_TARGET: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "jaxformer_target_platform", default=None)


@contextlib.contextmanager
def target_platform(platform: str, version: str = "") -> Iterator[None]:
    """Within this context the kernels are checked against ``platform`` ("tpu", "cuda", "cpu"),
    the platform a program is compiled for (`jaxformer.compile`), not this process's backend."""
    token = _TARGET.set((platform, version or platform))
    try:
        yield
    finally:
        _TARGET.reset(token)


def _platform(platform: str | None = None, version: str | None = None) -> str:
    """"tpu", "cuda", "cpu", ...: ``platform`` if given, else the `target_platform` in context, else
    jax's default backend (a GPU backend counts as "cuda" when its version names CUDA)."""
    if platform is None and _TARGET.get() is not None:
        platform, version = _TARGET.get()
    if platform is None:
        backend = jax_backend.get_backend()
        platform, version = backend.platform, backend.platform_version
    cuda = platform == "cuda" or (platform == "gpu" and "cuda" in (version or "").lower())
    return "cuda" if cuda else platform


def backend_problem(impl: str, platform: str | None = None, version: str | None = None
                    ) -> str | None:
    """Why the backend cannot run ``impl``, or None. The backend: ``platform`` if given, else the
    `target_platform` in context, else jax's default backend."""
    if impl not in ("cudnn", "splash", "flash"):
        return None
    platform = _platform(platform, version)
    if impl == "cudnn" and platform != "cuda":
        return (f"model.attention_impl='cudnn' needs a CUDA GPU, but jax's backend is {platform!r}; "
                "use 'xla' or 'chunked'")
    if impl in ("splash", "flash") and platform != "tpu":
        return (f"model.attention_impl={impl!r} needs a TPU, but jax's backend is {platform!r}; "
                f"use 'xla' or 'chunked' ('{impl}_interpret' runs the kernel interpreted, slowly, "
                "for tests)")
    return None


# The fused kernels of each platform, fastest first: `fastest_attention` takes the first that is
# built (in `KERNELS`) and runs the model. On a TPU splash (MaxText's default) leads for causal
# models, and the Pallas flash kernel with T5's relative bias follows for the configs splash refuses.
# For models with bidirectional attention (encoders, encoder-decoders) the flash kernel leads
# (`BIDIRECTIONAL_FIRST`): with no causal blocks to skip, the two kernels do the same FLOPs, and
# splash moves more bytes — its forward residual is the logsumexp broadcast to 128 lanes in float32
# (`[B, H, L, 128]`, 64× the `[B, H, L]` row ours keeps) with a layout copy and a slice of it, plus a
# pass scaling q and one zeroing blind rows; on bert_base_bf16 at v5p:2x2x1 (docs/scaling.md) the
# roofline bound is higher with flash. Elsewhere (CPU) "xla": at the lengths a CPU trains, its one
# einsum over the whole `[B, H, L, S]` score matrix is faster than "chunked"'s loop over key blocks
# (0.91× at L 256, docs/models.md); "chunked" is the memory choice for long rows, named explicitly.
FASTEST = {"tpu": ("splash", "flash"), "cuda": ("cudnn",)}
BIDIRECTIONAL_FIRST = {"tpu": "flash"}


def fastest_attention(*, dtype: str, head_dim: int, relative_bias: bool, causal: bool,
                      attention_dropout_rate: float, chunk_size: int, platform: str | None = None,
                      version: str | None = None, local_window: bool = False) -> str:
    """``model.attention_impl="auto"``: the fastest implementation the platform (``platform``, else
    the `target_platform` in context, else jax's backend) runs for a model with these settings
    (`unsupported`'s): the first of its `FASTEST` kernels that accepts them (`BIDIRECTIONAL_FIRST`
    first when the model is not ``causal``), else "xla"."""
    target = _platform(platform, version)
    settings = dict(dtype=dtype, head_dim=head_dim, relative_bias=relative_bias,
                    attention_dropout_rate=attention_dropout_rate, chunk_size=chunk_size,
                    local_window=local_window)
    order = FASTEST.get(target, ())
    if not causal and target in BIDIRECTIONAL_FIRST:
        first = BIDIRECTIONAL_FIRST[target]
        order = (first, *(k for k in order if k != first))
    for impl in order:
        if (impl in KERNELS and backend_problem(impl, target) is None
                and unsupported(impl, **settings) is None):
            return impl
    return "xla"


def check_backend(impl: str) -> None:
    """Raise ValueError (naming model.attention_impl) if this process's backend cannot run it."""
    problem = backend_problem(impl)
    if problem:
        raise ValueError(problem)


# --------------------------------------------------------------------------------------------------
# Shared pieces.


__all__ = ["KERNELS", "BIAS_KERNELS", "CUDNN_DTYPES", "CUDNN_MAX_HEAD_DIM", "SPLASH_LANES", "FASTEST",
           "BIDIRECTIONAL_FIRST", "unsupported", "target_platform", "backend_problem",
           "fastest_attention", "check_backend"]
