"""Manual-axis typing inside `jax.shard_map`: which mesh axes an array varies along, and casts.

Under `jax.shard_map` (``check_vma``, the default) every value's type records the manual mesh axes
along which it differs between devices. A loop (`jax.lax.scan`, `jax.lax.fori_loop`) needs its
carry's type to be the same in and out, so a carry started from constants (zeros, -inf) but
updated from device-varying inputs must be cast to varying first (`jax.lax.pcast`; jax's
shard_map guide, "scan-vma"). Outside shard_map every array varies along no axis and these are
identities, so the ops that use them run unchanged under jit.
"""

from __future__ import annotations

import jax
from jax import Array, lax


def varying(x: Array) -> set[str]:
    """The manual mesh axes along which ``x`` differs between devices (inside `jax.shard_map`):
    ``manual_axis_type.varying`` of its type (``vma`` in jax < 0.12)."""
    aval = jax.typeof(x)
    manual = getattr(aval, "manual_axis_type", None)
    return set(manual.varying) if manual is not None else set(getattr(aval, "vma", ()))


def vary(x: Array, axes) -> Array:
    """``x`` typed as varying along mesh ``axes`` (a name or several; those it already varies
    along are left)."""
    missing = tuple(sorted(set((axes,) if isinstance(axes, str) else axes) - varying(x)))
    return lax.pcast(x, missing, to="varying") if missing else x


def vary_like(tree, *refs):
    """Every leaf of ``tree`` varying along all axes that some array of ``refs`` varies along (the
    initial carry of a loop whose body mixes them in)."""
    axes = set().union(*(varying(r) for r in refs if r is not None))
    return jax.tree.map(lambda x: vary(x, axes), tree)


def grad_like(grad: Array, primal: Array) -> Array:
    """``grad`` in ``primal``'s dtype, summed over the mesh axes along which ``primal`` is the
    same on every device but ``grad`` is not (e.g. a bias replicated over the devices: each holds
    the gradient of its own rows) — the transpose of that implicit broadcast, as a custom VJP's
    backward rule must return it."""
    extra = tuple(sorted(varying(grad) - varying(primal)))
    return (lax.psum(grad, extra) if extra else grad).astype(primal.dtype)
