"""Fused attention kernels behind `jaxformer.ops.dot_product_attention`: adapters that map our masks
onto each kernel's arguments exactly. The limits of each kernel, and which one ``"auto"`` picks, are
stated once in `jaxformer.ops.kernel_choice` (checked at config time); why each limit is there is said
here.

Same function as the plain path, softmax(q kᵀ · scale + M) v (Vaswani et al. 2017, eq. 1), with
``M`` = causal AND segment (packing, id 0 = padding) AND an optional boolean mask; a query row with
no visible key returns zeros, as in `jaxformer.ops.attention`.

``"cudnn"``: `jax.nn.dot_product_attention(..., implementation="cudnn")`, cuDNN's fused flash
attention (Dao et al. 2022) on CUDA GPUs. Its public signature has no segment ids: packed rows
must arrive as the boolean ``mask`` (here: `jaxformer.ops.masks.segment_mask` AND the user's mask,
`[B, 1|H, L, S]`; cuDNN adds it as a bias) with ``is_causal`` for causality. Passing only
``is_causal`` — the mistake MaxText users hit — lets packed documents attend to each other.
cuDNN fills masked logits with a large negative number, not −∞, and its backward pass gives NaN
for a fully masked row (a padding query) of a bidirectional mask: such rows are given every key
(no fully masked row reaches cuDNN) and their outputs are zeroed here. Limits: bf16/fp16 inputs, head_dim a
multiple of 8 and ≤ 256 (≤ 128 before Hopper), no dropout (jax's API has no dropout argument).
An additive ``bias`` `[1|B, H, L, S]` (T5's learned relative positions) goes to cuDNN with its
gradient: jax's cuDNN primitive (``jax/_src/cudnn/fused_attention_stablehlo.py``, jax 0.12) asks the
kernel for dbias whenever the bias is differentiable, of the bias's own shape — a batch-1 bias's
gradient summed over the batch by the kernel, a per-row `[B, H, L, S]` bias's per row — and jax adds
a boolean mask to the bias (one `[B|1, H, L, S]` operand), so with packing or padding the kernel
reads a per-row bias. The bias is added in the inputs' dtype (cuDNN's operand; ``xla`` adds it to
float32 logits). With a mask or a bias, odd lengths are padded by one masked key / dropped query
(cuDNN trains with a bias only at even lengths). Checked on this CPU-only project by jax's own
reference of the same call (``implementation="xla"``) and by an ahead-of-time compile for an H100
(the fused forward and backward custom calls take the bias and return dbias): the numbers on a
real GPU are unverified.

``"splash"``: the TPU Pallas splash-attention kernel (`jax.experimental.pallas.ops.tpu
.splash_attention`, MaxText's TPU default): block-sparse flash attention with a static causal or
full mask and `SegmentIds` for packing, grouped-query attention native (``heads % kv_heads == 0``).
It has no bias operand (T5's relative bias is refused) and no dropout; it does not scale the logits
(``q`` is scaled here) and gives id 0 no special meaning (padding queries attend padding keys), so
rows with no visible key are zeroed here. Lengths are padded to a multiple of the block (a multiple
of 128; the block is ``min(attention_chunk_size, length rounded up to 128)``) with segment id 0.
Chosen over ``flash_attention`` from the same package, which takes a bias but has neither grouped
kv heads nor an interpret mode (so could not be tested on CPU). ``"splash_interpret"`` runs the
same kernel through the Pallas interpreter: any backend, slow — for tests on CPU.

``"flash"``: our own Pallas TPU flash-attention kernel (`jaxformer.ops.flash_attention`), the one
fused kernel that adds a bias — T5's learned relative-position bias, `[1|B, H, L, S]` computed by
XLA, with its gradient (hence the bucket table's) — with causal and segment masks (id 0 = padding)
and grouped kv heads. No dense ``mask`` and no dropout. Lengths are padded to a multiple of the
block as for splash (padded keys get segment id 0, padded bias entries 0). A call without a bias
(T5's cross-attention) goes to splash. ``"flash_interpret"`` runs both through the Pallas
interpreter (CPU tests).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as splash

from jaxformer.ops.flash_attention import flash_attention as flash_kernel
from jaxformer.ops.kernel_choice import BIAS_KERNELS, SPLASH_LANES, check_backend
from jaxformer.ops.masks import causal_mask, combine_masks, segment_mask

Array = jnp.ndarray


def _pad_to(x: Array | None, axis: int, length: int, value=0) -> Array | None:
    if x is None or x.shape[axis] in (1, length):
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, length - x.shape[axis])
    return jnp.pad(x, widths, constant_values=value)


def _zero_blind_rows(out_BxLxHxDv: Array, visible: Array) -> Array:
    """``out`` with rows that see no key set to 0; ``visible`` `[B|1, H|1, L]` bool."""
    return out_BxLxHxDv * jnp.swapaxes(visible, 1, 2)[..., None].astype(out_BxLxHxDv.dtype)


def _refuse(impl: str, bias, dropout_rate: float, dropout_rng) -> None:
    if bias is not None and impl not in BIAS_KERNELS:
        raise ValueError(f"implementation={impl!r} takes no additive bias (T5's relative "
                         f"positions): use 'xla', 'chunked' or one of {BIAS_KERNELS}")
    if dropout_rate and dropout_rng is not None:
        raise ValueError(f"implementation={impl!r} has no attention dropout: set the rate to 0")


# --------------------------------------------------------------------------------------------------
# cuDNN.


def cudnn_arguments(q: Array, k: Array, v: Array, *, bias: Array | None, mask: Array | None,
                    causal: bool, q_segment_ids: Array | None, kv_segment_ids: Array | None,
                    scale: float) -> tuple[dict, Array | None]:
    """(keyword arguments of `jax.nn.dot_product_attention`, rows that see a key `[B|1, H|1, L]`
    or None when every row does) for our masks.

    ``q`` `[B, L, H, Dh]`, ``k``/``v`` `[B, S, K, Dh]`; ``bias`` `[B|1, H, L, S]` or None, passed
    in ``q.dtype``; ``mask`` broadcastable to `[B, H, L, S]`; segment ids `[B, L]` / `[B, S]`.
    Segments and ``mask`` become one boolean mask; causality stays ``is_causal`` (cuDNN skips the
    upper triangle's blocks)."""
    segments = None if q_segment_ids is None else segment_mask(q_segment_ids, kv_segment_ids)
    full = combine_masks(mask, segments)
    kwargs = {"query": q, "key": k, "value": v, "mask": full, "is_causal": causal, "scale": scale,
              "bias": None if bias is None else bias.astype(q.dtype)}
    if full is None:
        return kwargs, None
    seen = combine_masks(full, causal_mask(q.shape[1], k.shape[1])) if causal else full
    visible = jnp.any(seen, axis=-1)
    # A row that sees no key (padding queries) is given every key instead: cuDNN's backward pass
    # returns NaN gradients for fully masked rows without a causal mask (seen on an H100, cuDNN
    # 9.19, jax 0.11.2). Its output is zeroed by the caller, so nothing flows through it.
    kwargs["mask"] = full | ~visible[..., None]
    return kwargs, visible


def cudnn_attention(q: Array, k: Array, v: Array, *, bias: Array | None, mask: Array | None,
                    causal: bool, q_segment_ids: Array | None, kv_segment_ids: Array | None,
                    scale: float, dropout_rate: float = 0.0, dropout_rng=None,
                    implementation: str = "cudnn") -> Array:
    """Attention through `jax.nn.dot_product_attention` (``implementation="cudnn"``; ``"xla"``
    runs jax's reference of the same call, e.g. to test the argument mapping on CPU).

    Shapes as `cudnn_arguments`; returns `[B, L, H, Dv]` in ``q.dtype``."""
    _refuse("cudnn", bias, dropout_rate, dropout_rng)
    if implementation == "cudnn":
        check_backend("cudnn")
    b, lq, h, _ = q.shape
    lk = k.shape[1]
    has_mask = mask is not None or q_segment_ids is not None or bias is not None
    pad_q, pad_k = (lq % 2, lk % 2) if has_mask else (0, 0)
    if pad_q or pad_k:
        q_segment_ids, kv_segment_ids = _default_segments(q_segment_ids, kv_segment_ids, q, k)
        q, q_segment_ids = _pad_to(q, 1, lq + pad_q), _pad_to(q_segment_ids, 1, lq + pad_q)
        k, v = _pad_to(k, 1, lk + pad_k), _pad_to(v, 1, lk + pad_k)
        kv_segment_ids = _pad_to(kv_segment_ids, 1, lk + pad_k)
        mask = _pad_to(_pad_to(mask, 2, lq + pad_q, True), 3, lk + pad_k, True)
        bias = _pad_to(_pad_to(bias, 2, lq + pad_q), 3, lk + pad_k)  # their keys are masked
    kwargs, visible = cudnn_arguments(q, k, v, bias=bias, mask=mask, causal=causal,
                                      q_segment_ids=q_segment_ids,
                                      kv_segment_ids=kv_segment_ids, scale=scale)
    out = jax.nn.dot_product_attention(**kwargs, implementation=implementation)
    if visible is not None:
        out = _zero_blind_rows(out, visible)
    return out[:, :lq]


def _default_segments(q_seg, kv_seg, q, k):
    """Segment ids of all ones when none are given (padding extra positions with id 0 masks them)."""
    if q_seg is None:
        q_seg = jnp.ones(q.shape[:2], jnp.int32)
        kv_seg = jnp.ones(k.shape[:2], jnp.int32)
    return q_seg, kv_seg


# --------------------------------------------------------------------------------------------------
# Kernels on a device mesh. XLA cannot partition a Pallas (Mosaic) kernel ("Mosaic kernels cannot
# be automatically partitioned"): inside a sharded program the kernel runs per device under
# `jax.shard_map`, rows split as the batch is and heads as the attention heads are.

_MESH: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("jaxformer_kernel_mesh",
                                                                     default=None)


@contextlib.contextmanager
def kernel_mesh(mesh, batch_axes, head_axes) -> Iterator[None]:
    """Within this context the Pallas kernels run per device of ``mesh`` (`jax.shard_map`): rows
    split over ``batch_axes`` and heads over ``head_axes`` (mesh axis names, a tuple or None: the
    logical rules' ``batch`` and ``heads``). `jaxformer.parallel.partition.sharded_jit` enters it."""
    token = _MESH.set((mesh, batch_axes, head_axes))
    try:
        yield
    finally:
        _MESH.reset(token)


def _axes_size(mesh, axes) -> int:
    axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    return math.prod(mesh.shape[a] for a in axes)


def _per_device(fn, q_BxHxLxD: Array, k_BxKxSxD: Array, v_BxKxSxD: Array, q_seg: Array,
                kv_seg: Array, *bias_BxHxLxS: Array) -> Array:
    """``fn(q, k, v, q_seg, kv_seg[, bias])`` (head-major layouts, `[B, L]` segment ids, an
    optional bias `[1|B, H, L, S]`), run per device under `kernel_mesh` when one is active: a
    dimension that its mesh axes do not divide stays whole (replicated), and grouped kv heads split
    with the query heads (the rules refuse a kv head count the tensor axis does not divide)."""
    ctx = _MESH.get()
    if ctx is None or ctx[0].size == 1:
        return fn(q_BxHxLxD, k_BxKxSxD, v_BxKxSxD, q_seg, kv_seg, *bias_BxHxLxS)
    mesh, batch_axes, head_axes = ctx
    rows = batch_axes if q_BxHxLxD.shape[0] % _axes_size(mesh, batch_axes) == 0 else None
    n_heads = _axes_size(mesh, head_axes)
    heads = head_axes if q_BxHxLxD.shape[1] % n_heads == 0 and k_BxKxSxD.shape[1] % n_heads == 0 \
        else None
    spec = jax.sharding.PartitionSpec(rows, heads, None, None)
    seg = jax.sharding.PartitionSpec(rows, None)
    bias_specs = tuple(jax.sharding.PartitionSpec(rows if b.shape[0] > 1 else None, heads, None, None)
                       for b in bias_BxHxLxS)
    return jax.shard_map(fn, mesh=mesh, in_specs=(spec, spec, spec, seg, seg, *bias_specs),
                         out_specs=spec, check_vma=False)(q_BxHxLxD, k_BxKxSxD, v_BxKxSxD, q_seg,
                                                          kv_seg, *bias_BxHxLxS)


# --------------------------------------------------------------------------------------------------
# TPU splash attention.


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _sees_a_key(q_seg: Array, kv_seg: Array, causal: bool) -> Array:
    """`[L]` bool: query ``i`` has a key ``j`` with ``kv_seg[j] == q_seg[i] != 0`` (and ``j <= i``
    when causal), found by binary search over the sorted key ids: O((L + S) log S), no `[L, S]`."""
    order = jnp.argsort(kv_seg, stable=True)
    pos = jnp.minimum(jnp.searchsorted(kv_seg[order], q_seg), kv_seg.shape[0] - 1)
    found = (kv_seg[order][pos] == q_seg) & (q_seg != 0)
    if causal:  # the stable sort puts each id's earliest key first
        found &= order[pos] <= jnp.arange(q_seg.shape[0])
    return found


def _refuse_dense_mask(impl: str, mask: Array | None) -> None:
    """The Pallas kernels take causal and segment masks, not a dense ``mask``."""
    if mask is not None:
        raise ValueError(f"implementation={impl!r} takes causal and segment masks only, not a "
                         "dense mask: use 'xla', 'chunked' or 'cudnn'")


def _blocks(lq: int, lk: int, block: int) -> tuple[int, int, int, int]:
    """(block_q, block_kv, padded lq, padded lk) of the Pallas kernels: a block is ``block`` or
    the length rounded up to the 128 lanes, whichever is smaller; lengths pad to a multiple."""
    block_q = min(block, _round_up(lq, SPLASH_LANES))
    block_kv = min(block, _round_up(lk, SPLASH_LANES))
    return block_q, block_kv, _round_up(lq, block_q), _round_up(lk, block_kv)


def _tpu_kernel_blocks(impl: str, bias, mask, dropout_rate, dropout_rng, q: Array, k: Array,
                       block: int, interpret: bool) -> tuple[int, int, int, int]:
    """The refusals a TPU kernel shares (bias where unsupported, a dense mask, dropout, a missing
    backend unless interpreted), then its blocks and padded lengths (`_blocks`)."""
    _refuse(impl, bias, dropout_rate, dropout_rng)
    _refuse_dense_mask(impl, mask)
    if not interpret:
        check_backend(impl)
    return _blocks(q.shape[1], k.shape[1], block)


def splash_attention(q: Array, k: Array, v: Array, *, bias: Array | None, mask: Array | None,
                     causal: bool, q_segment_ids: Array | None, kv_segment_ids: Array | None,
                     scale: float, dropout_rate: float = 0.0, dropout_rng=None,
                     block: int = 512, interpret: bool = False) -> Array:
    """Splash attention of ``q`` `[B, L, H, Dh]` over ``k``/``v`` `[B, S, K, Dh|Dv]` with causal
    and segment masks (no dense ``mask``: splash's masks are static and per shape).

    Returns `[B, L, H, Dv]` in ``q.dtype``."""
    block_q, block_kv, lq_pad, lk_pad = _tpu_kernel_blocks(
        "splash_interpret" if interpret else "splash", bias, mask, dropout_rate, dropout_rng, q, k,
        block, interpret)
    lq = q.shape[1]
    q_seg, kv_seg = _default_segments(q_segment_ids, kv_segment_ids, q, k)
    q_seg, kv_seg = _pad_to(q_seg, 1, lq_pad), _pad_to(kv_seg, 1, lk_pad)
    q_BxHxLxDh = jnp.swapaxes(_pad_to(q * jnp.asarray(scale, q.dtype), 1, lq_pad), 1, 2)
    k_BxKxSxDh, v_BxKxSxDv = (jnp.swapaxes(_pad_to(x, 1, lk_pad), 1, 2) for x in (k, v))
    shape = (lq_pad, lk_pad)
    head_mask = splash.CausalMask(shape) if causal else splash.FullMask(shape)
    blocks = splash.BlockSizes(
        block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv, block_q_dkv=block_q,
        block_kv_dkv=block_kv, block_kv_dkv_compute=block_kv, block_q_dq=block_q,
        block_kv_dq=block_kv)

    def rows(q_BxHxLxDh, k_BxKxSxDh, v_BxKxSxDv, q_seg, kv_seg):  # the heads this device holds
        kernel = splash.make_splash_mha(
            splash.MultiHeadMask([head_mask] * q_BxHxLxDh.shape[1]), block_sizes=blocks,
            head_shards=1, q_seq_shards=1, interpret=interpret)
        one_row = lambda qq, kk, vv, sq, sk: kernel(qq, kk, vv,
                                                    segment_ids=splash.SegmentIds(sq, sk))
        return jax.vmap(one_row)(q_BxHxLxDh, k_BxKxSxDh, v_BxKxSxDv, q_seg, kv_seg)

    out_BxHxLxDv = _per_device(rows, q_BxHxLxDh, k_BxKxSxDh, v_BxKxSxDv, q_seg, kv_seg)
    visible_Bx1xL = jax.vmap(_sees_a_key, in_axes=(0, 0, None))(q_seg, kv_seg, causal)[:, None]
    out = _zero_blind_rows(jnp.swapaxes(out_BxHxLxDv, 1, 2), visible_Bx1xL)
    return out[:, :lq].astype(q.dtype)


# --------------------------------------------------------------------------------------------------
# TPU flash attention with a bias (`jaxformer.ops.flash_attention`).


def flash_attention(q: Array, k: Array, v: Array, *, bias: Array | None, mask: Array | None,
                    causal: bool, q_segment_ids: Array | None, kv_segment_ids: Array | None,
                    scale: float, dropout_rate: float = 0.0, dropout_rng=None, block: int = 512,
                    interpret: bool = False) -> Array:
    """Our flash kernel on ``q`` `[B, L, H, Dh]`, ``k``/``v`` `[B, S, K, Dh|Dv]`, with an additive
    ``bias`` broadcastable to `[B, H, L, S]` (its batch axis 1 or B: shared or per row), causal
    and segment masks (no dense ``mask``). Blocks: ``min(block, length rounded up to 128)``;
    lengths are padded to a multiple with segment id 0 and bias 0.

    Returns `[B, L, H, Dv]` in ``q.dtype``."""
    block_q, block_kv, lq_pad, lk_pad = _tpu_kernel_blocks(
        "flash_interpret" if interpret else "flash", None, mask, dropout_rate, dropout_rng, q, k,
        block, interpret)
    b, lq, h, _ = q.shape
    lk = k.shape[1]
    q_seg, kv_seg = q_segment_ids, kv_segment_ids
    if (lq_pad, lk_pad) != (lq, lk):  # padded keys are hidden by segment id 0
        q_seg, kv_seg = _default_segments(q_seg, kv_seg, q, k)
        q_seg, kv_seg = _pad_to(q_seg, 1, lq_pad), _pad_to(kv_seg, 1, lk_pad)
    q_BxHxLxDh = jnp.swapaxes(_pad_to(q, 1, lq_pad), 1, 2)
    k_BxKxSxDh, v_BxKxSxDv = (jnp.swapaxes(_pad_to(x, 1, lk_pad), 1, 2) for x in (k, v))
    bias_args = ()
    if bias is not None:
        bias = bias.reshape((1,) * (4 - bias.ndim) + bias.shape)
        bias = jnp.broadcast_to(bias, (bias.shape[0], h, lq, lk))
        bias_args = (_pad_to(_pad_to(bias, 2, lq_pad), 3, lk_pad),)

    if q_seg is None:  # no segment ids: `_per_device` splits two empty `[B, 0]` stand-ins
        q_seg = kv_seg = jnp.zeros((b, 0), jnp.int32)

    def rows(q_BxHxLxDh, k_BxKxSxDh, v_BxKxSxDv, q_seg, kv_seg, *bias_BxHxLxS):
        segments = (q_seg, kv_seg) if q_seg.shape[1] else (None, None)
        return flash_kernel(q_BxHxLxDh, k_BxKxSxDh, v_BxKxSxDv, *(bias_BxHxLxS or (None,)),
                            *segments, causal=causal, scale=scale, block_q=block_q,
                            block_kv=block_kv, interpret=interpret)

    out_BxHxLxDv = _per_device(rows, q_BxHxLxDh, k_BxKxSxDh, v_BxKxSxDv, q_seg, kv_seg, *bias_args)
    return jnp.swapaxes(out_BxHxLxDv, 1, 2)[:, :lq].astype(q.dtype)


def fused_attention(implementation: str, q: Array, k: Array, v: Array, *, block: int, **kw
                    ) -> Array:
    """Dispatch to the kernel ``implementation`` (one of `KERNELS`); ``kw`` as `cudnn_attention`."""
    if implementation == "cudnn":
        return cudnn_attention(q, k, v, **kw)
    if implementation.startswith("flash"):
        interpret = implementation == "flash_interpret"
        if not interpret:
            check_backend("flash")
        if kw["bias"] is None and kw["causal"]:  # a causal call without a bias: splash
            return splash_attention(q, k, v, block=block, interpret=interpret, **kw)
        return flash_attention(q, k, v, block=block, interpret=interpret, **kw)
    return splash_attention(q, k, v, block=block, interpret=implementation == "splash_interpret",
                            **kw)


__all__ = ["kernel_mesh",
           "cudnn_arguments", "cudnn_attention", "splash_attention", "flash_attention",
           "fused_attention"]
