"""Images as token sequences: the Vision Transformer's input (Dosovitskiy et al. 2021, ViT).

An image `[B, H, W, C]` (channels last) is cut into ``N = (H/P)·(W/P)`` non-overlapping ``P×P``
patches in row-major order (`patchify`), each flattened and projected linearly to d_model
(`embed_patches`: eq. 1's ``x_p^i E``, a convolution with kernel = stride = P); a learned class
vector may be prepended (``x_class``) and position embeddings added (`image_inputs`). The learned
1-D positions of a pretrained model are a ``g_h × g_w`` grid; fine-tuning at another resolution
resamples that grid in 2-D (§3.2, "2D interpolation of the pre-trained position embeddings"):
`resize_positions`, by `resize_matrix`'s weights, which follow PyTorch's
``interpolate(..., align_corners=False)`` (the bicubic one is what Hugging Face's
``ViTEmbeddings.interpolate_pos_encoding`` calls), so converted models agree.

Parameters are plain dicts laid out by `jaxformer.models.spec` (``image_embedding_spec``): the
patch projection ``patch_embedding`` {``kernel`` `[P, P, C, D]`, ``bias`` `[D]`}, the class vector
``class_embedding`` `[D]` and the learned table ``pos_embedding`` `[N (+1), D]`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.ops.dropout import dropout
from jaxformer.ops.positions import sinusoidal

Array = jnp.ndarray
RESIZE_METHODS = ("bicubic", "bilinear")


def patch_grid(height: int, width: int, patch_size: int) -> tuple[int, int]:
    """``(H/P, W/P)``: the patch grid of an image; ValueError when P does not divide a side."""
    if height % patch_size or width % patch_size:
        raise ValueError(f"images of {height}x{width} pixels do not divide into {patch_size}x"
                         f"{patch_size} patches; use a size that is a multiple of the patch size")
    return height // patch_size, width // patch_size


def patchify(images_BxHxWxC: Array, patch_size: int) -> Array:
    """`[B, H, W, C]` → `[B, N, P, P, C]`: patch ``n = i·(W/P) + j`` holds the pixels
    ``[i·P:(i+1)·P, j·P:(j+1)·P]`` (row-major over the grid, as a strided convolution's output
    flattened)."""
    b, h, w, c = images_BxHxWxC.shape
    gh, gw = patch_grid(h, w, patch_size)
    x = images_BxHxWxC.reshape(b, gh, patch_size, gw, patch_size, c)
    return x.transpose(0, 1, 3, 2, 4, 5).reshape(b, gh * gw, patch_size, patch_size, c)


def embed_patches(params: dict, images_BxHxWxC: Array, *, dtype=None) -> Array:
    """ViT eq. 1's patch projection: `[B, H, W, C]` → `[B, N, D]`, ``patch · kernel + bias`` with
    ``params["kernel"]`` `[P, P, C, D]` (P from its shape) and ``params["bias"]`` `[D]`, in ``dtype``
    (default the images')."""
    dtype = jnp.dtype(dtype or images_BxHxWxC.dtype)
    kernel_PxPxCxD = params["kernel"].astype(dtype)
    patches_BxNxPxPxC = patchify(images_BxHxWxC.astype(dtype), kernel_PxPxCxD.shape[0])
    x_BxNxD = jnp.einsum("bnpqc,pqcd->bnd", patches_BxNxPxPxC, kernel_PxPxCxD)
    if params.get("bias") is not None:
        x_BxNxD = x_BxNxD + params["bias"].astype(dtype)
    return x_BxNxD


def _cubic(t: np.ndarray, a: float = -0.75) -> np.ndarray:
    """Keys' cubic convolution kernel with PyTorch's ``a = -0.75`` (``upsample_bicubic2d``)."""
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


@functools.lru_cache(maxsize=64)
def resize_matrix(n_in: int, n_out: int, method: str = "bicubic") -> np.ndarray:
    """`[n_out, n_in]` float64 weights resampling a 1-D signal of ``n_in`` samples to ``n_out``:
    PyTorch's ``interpolate(mode=method, align_corners=False)`` with a ``size`` (source coordinate
    ``(o + 1/2)·n_in/n_out − 1/2``; bilinear clamps it at 0 and the right neighbour at the edge,
    bicubic reads its four taps clamped to the edge). Rows sum to 1; ``n_in == n_out`` is the
    identity."""
    if method not in RESIZE_METHODS:
        raise ValueError(f"method={method!r} is invalid: choose one of {RESIZE_METHODS}")
    src = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5
    w = np.zeros((n_out, n_in))
    rows = np.arange(n_out)
    if method == "bilinear":
        src = np.maximum(src, 0.0)
        lo = np.minimum(np.floor(src).astype(int), n_in - 1)
        frac = src - lo
        hi = np.minimum(lo + 1, n_in - 1)
        np.add.at(w, (rows, lo), 1 - frac)
        np.add.at(w, (rows, hi), frac)
        return w
    lo = np.floor(src).astype(int)
    frac = src - lo
    for tap in (-1, 0, 1, 2):
        np.add.at(w, (rows, np.clip(lo + tap, 0, n_in - 1)), _cubic(frac - tap))
    return w


def resize_positions(table_NxD: Array, grid_in: tuple[int, int], grid_out: tuple[int, int], *,
                     leading: int = 0, method: str = "bicubic") -> Array:
    """Learned positions of a ``grid_in`` patch grid resampled to ``grid_out`` (ViT §3.2).

    Args:
      table_NxD: `[leading + g_h·g_w, D]`: ``leading`` rows that are not on the grid (the class
        token's) and then the grid in row-major order.
      grid_in, grid_out: ``(g_h, g_w)`` before and after.
      method: "bicubic" (Hugging Face's ``interpolate_pos_encoding``) or "bilinear".

    Returns:
      `[leading + g_h'·g_w', D]`, the leading rows unchanged; separable 2-D interpolation
      ``R_h · G · R_wᵀ`` per feature by `resize_matrix`, in the table's dtype (float32 weights).
    """
    (gh, gw), (oh, ow) = grid_in, grid_out
    if table_NxD.shape[0] != leading + gh * gw:
        raise ValueError(f"a position table of {table_NxD.shape[0]} rows is not {leading} leading "
                         f"row(s) and a {gh}x{gw} grid")
    if (gh, gw) == (oh, ow):
        return table_NxD
    d = table_NxD.shape[-1]
    grid_HxWxD = table_NxD[leading:].reshape(gh, gw, d)
    r_h = jnp.asarray(resize_matrix(gh, oh, method), jnp.float32)
    r_w = jnp.asarray(resize_matrix(gw, ow, method), jnp.float32)
    out = jnp.einsum("oh,hwd,pw->opd", r_h, grid_HxWxD.astype(jnp.float32), r_w,
                     precision=jax.lax.Precision.HIGHEST)
    return jnp.concatenate([table_NxD[:leading], out.reshape(oh * ow, d).astype(table_NxD.dtype)])


def image_inputs(params: dict, images_BxHxWxC: Array, *, grid: tuple[int, int], position: str,
                 dtype, dropout_rate: float = 0.0, dropout_rng: jax.Array | None = None,
                 resize_method: str = "bicubic") -> Array:
    """ViT eq. 1: ``z_0 = [x_class; x_p^1 E; …; x_p^N E] + E_pos``, then dropout: `[B, L, D]`
    with ``L = N (+1 with params["class_embedding"])``.

    Args:
      params: ``patch_embedding`` (`embed_patches`), optionally ``class_embedding`` `[D]`, and with
        ``position="learned"`` ``pos_embedding`` `[L, D]` for the model's patch ``grid``.
      images_BxHxWxC: pixels, channels last.
      grid: ``(g_h, g_w)``, the patch grid the learned table was made for; images of another size
        read that table resampled to their grid (`resize_positions` by ``resize_method``).
      position: "learned", "sinusoidal" (1-D over the sequence) or "none".
    """
    x = embed_patches(params["patch_embedding"], images_BxHxWxC, dtype=dtype)
    b, n, d = x.shape
    lead = 0
    if "class_embedding" in params:
        cls = jnp.broadcast_to(params["class_embedding"].astype(x.dtype), (b, 1, d))
        x, lead = jnp.concatenate([cls, x], axis=1), 1
    if position == "learned":
        here = patch_grid(images_BxHxWxC.shape[1], images_BxHxWxC.shape[2],
                          params["patch_embedding"]["kernel"].shape[0])
        table = resize_positions(params["pos_embedding"], grid, here, leading=lead,
                                 method=resize_method)
        x = x + table.astype(x.dtype)[None]
    elif position == "sinusoidal":
        x = x + sinusoidal(jnp.arange(x.shape[1])[None], d, dtype=x.dtype)
    return dropout(x, dropout_rate, dropout_rng)
