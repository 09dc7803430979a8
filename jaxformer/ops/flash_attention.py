"""Flash attention with an additive bias, as a Pallas (Mosaic) TPU kernel: forward, backward and the
bias gradient — the fused kernel for T5's learned relative-position bias (Raffel et al. 2020, §2.1).

    out = softmax(q kᵀ · scale + bias + M) v                      (Vaswani et al. 2017, eq. 1)

computed block by block with the online softmax (Milakov & Gimelshein 2018; Dao et al. 2022,
"FlashAttention", Alg. 1): the `[L, S]` logits never leave the chip's VMEM. ``M`` is causal
(key index <= query index) AND segments (packing; id 0 = padding, never attended). A query row with
no visible key returns zeros, as `jaxformer.ops.attention` does; its gradients are zero.

Backward (Dao 2023, "FlashAttention-2", Alg. 2): the forward saves only the output and the row
logsumexp; two kernels recompute each block's probabilities from it — one accumulates dK and dV
over the query blocks, the other dQ over the key blocks and writes dS, which is the gradient of the
bias (the logits' gradient, as ``bias`` is added to them). Through XLA's gather of the bias from
its `[buckets, heads]` table, that gradient reaches the table (a scatter-add onto the buckets).

Why a bias block rather than the table: the kernel reads a `[1|B, H, L, S]` bias computed by XLA
(`jaxformer.ops.positions.relative_position_bias`) rather than bucketing relative positions and
looking up the table per element in the kernel. In-kernel, each logit would cost the bucket
(a log, compares) and a 32-way select on the vector unit — some 80 VPU operations (our count)
against the 256 MXU FLOPs of the two matmuls per logit (head_dim 64), several times the matmuls'
time on v5p — and its table gradient 32 masked reductions per block. The bias block costs bytes
instead: one bias element (2 bytes in bfloat16) per logit per kernel; at L = S = 512 and head_dim
64 a row's bias is 2.7× its q, k and v together. A bias shared over the batch (`[1, H, L, S]`)
is read once per (head, q block, kv block) for all the rows of a batch chunk: the batch is the
grid's innermost axis, with the running max, normaliser and output of each row of the chunk held
in VMEM scratch; its gradient is summed over the chunk in VMEM too. The figures measured on a
compiled v5p step are in docs/scaling.md ("T5 on a fused kernel").

Layouts (head-major, as the kernel's blocks need): ``q`` `[B, H, L, D]`, ``k`` `[B, K, S, D]`,
``v`` `[B, K, S, Dv]` with ``H % K == 0`` (grouped kv heads: query head ``h`` reads kv head
``h // (H // K)``); ``bias`` `[1|B, H, L, S]`; segment ids `[B, L]` / `[B, S]` int32. ``L`` and
``S`` must be multiples of the blocks, the blocks multiples of 128 (the adapter
`jaxformer.ops.attention_kernels.flash_attention` pads). ``interpret=True`` runs the same kernels
through the Pallas interpreter on any backend (the CPU tests).

Cost estimates (`pl.CostEstimate`, what XLA's cost analysis and so the roofline read): FLOPs as the
planner counts attention (`jaxformer.plan.model_flops`: 4·L·S·D per head forward, 8·L·S·D backward,
split 4 + 4 between the two backward kernels; halved for causal), not the recomputation the
kernels also execute (forward 4, dK/dV kernel 8, dQ kernel 6); bytes: every block each kernel
reads or writes from HBM, as often as the grid fetches it (q, k, v, o, dO, bias, dS, dQ, dK, dV,
the logsumexp and Δ = rowsum(dO·o) statistics, segment ids). Skipped causal blocks are not
fetched when a batch chunk holds one row; with several rows the row changes at every grid step, so
every step moves its blocks (`_Geometry.fetches`).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

Array = jnp.ndarray
LANES = 128  # TPU lane width: blocks are multiples of it
MASK = -0.7 * float(jnp.finfo(jnp.float32).max)  # finite: exp(MASK - m) is 0, MASK - MASK is 0
NT = (((1,), (1,)), ((), ()))  # a @ bᵀ
VMEM_SCRATCH_BUDGET = 8 * 2**20  # bytes of per-row scratch a batch chunk may hold


def _batch_chunk(batch: int, per_row_bytes: int) -> int:
    """The largest divisor of ``batch`` whose rows' scratch fits `VMEM_SCRATCH_BUDGET`."""
    fits = max(1, VMEM_SCRATCH_BUDGET // per_row_bytes)
    return max(d for d in range(1, batch + 1) if batch % d == 0 and d <= fits)


def _visible(q_idx, kv_idx, q_seg, kv_seg, causal: bool):
    """Boolean mask of a block (shape of the broadcast of ``q_idx`` and ``kv_idx``) or None."""
    mask = kv_idx <= q_idx if causal else None
    if q_seg is not None:
        same = (q_seg == kv_seg) & (kv_seg != 0)
        mask = same if mask is None else mask & same
    return mask


def _masked_logits(q, k, bias_ref, qseg_ref, kvseg_ref, i, j, *, causal: bool, scale: float,
                   bq: int, bk: int):
    """The float32 logits `[bq, bk]` of q block ``i`` against kv block ``j``, q kᵀ · scale + bias,
    with hidden entries (causal, other segment, padding) set to `MASK`: the forward and dQ
    kernels' (query-major) block. ``bias_ref``/``qseg_ref``/``kvseg_ref`` may be None."""
    s = lax.dot_general(q, k, NT, preferred_element_type=jnp.float32) * scale
    if bias_ref is not None:
        s = s + bias_ref[...].astype(jnp.float32)
    q_idx = i * bq + lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
    kv_idx = j * bk + lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
    has_seg = qseg_ref is not None
    mask = _visible(q_idx, kv_idx, qseg_ref[0][:, None] if has_seg else None,
                    kvseg_ref[...] if has_seg else None, causal)
    return s if mask is None else jnp.where(mask, s, MASK)


def _causal_runs(i, j, bq: int, bk: int):
    """Block (q block ``i``, kv block ``j``) holds a visible entry under the causal mask."""
    return j * bk <= i * bq + bq - 1


# --------------------------------------------------------------------------------------------------
# Forward: grid (batch chunk, head, q block, kv block, row of the chunk).


def _fwd_kernel(*refs, causal, scale, has_bias, has_seg, bq, bk, nk):
    q_ref, k_ref, v_ref, *refs = refs
    bias_ref = refs.pop(0) if has_bias else None
    qseg_ref, kvseg_ref = (refs.pop(0), refs.pop(0)) if has_seg else (None, None)
    o_ref, lse_ref, m_sc, l_sc, acc_sc = refs
    i, j, r = pl.program_id(2), pl.program_id(3), pl.program_id(4)

    @pl.when(j == 0)
    def _init():
        m_sc[r] = jnp.full(m_sc.shape[1:], MASK, jnp.float32)
        l_sc[r] = jnp.zeros(l_sc.shape[1:], jnp.float32)
        acc_sc[r] = jnp.zeros(acc_sc.shape[1:], jnp.float32)

    @pl.when(_causal_runs(i, j, bq, bk) if causal else True)
    def _step():
        s = _masked_logits(q_ref[...], k_ref[...], bias_ref, qseg_ref, kvseg_ref, i, j,
                           causal=causal, scale=scale, bq=bq, bk=bk)
        m_prev, l_prev = m_sc[r], l_sc[r]  # [bq, LANES], equal across lanes
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        p = jnp.exp(s - m_new[:, :1])
        corr = jnp.exp(m_prev - m_new)
        m_sc[r] = m_new
        l_sc[r] = corr * l_prev + jnp.sum(p, axis=1, keepdims=True)
        pv = jnp.dot(p.astype(v_ref.dtype), v_ref[...], preferred_element_type=jnp.float32)
        acc_sc[r] = acc_sc[r] * corr[:, :1] + pv

    @pl.when(j == nk - 1)
    def _finish():
        m, norm = m_sc[r], l_sc[r]
        seen = m > MASK / 2  # a row that saw no key kept the mask value as its max
        o_ref[...] = jnp.where(seen[:, :1], acc_sc[r] / norm[:, :1], 0.0).astype(o_ref.dtype)
        # +inf: exp(s - lse) is 0 in the backward pass, so a blind row gets no gradient
        lse = jnp.where(seen, m + jnp.log(jnp.where(seen, norm, 1.0)), jnp.inf)
        lse_ref[...] = lse.T[:1]  # [LANES, bq] → the row [1, bq]


# --------------------------------------------------------------------------------------------------
# Backward, dK and dV: grid (batch chunk, kv head, kv block, group, q block, row of the chunk);
# logits transposed ([bk, bq]) so that dK = dSᵀ q and dV = Pᵀ dO are plain matmuls.


def _dkv_kernel(*refs, causal, scale, has_bias, has_seg, bq, bk, groups, nq):
    q_ref, k_ref, v_ref, *refs = refs
    bias_ref = refs.pop(0) if has_bias else None
    qseg_ref, kvseg_ref = (refs.pop(0), refs.pop(0)) if has_seg else (None, None)
    lse_ref, di_ref, do_ref, dk_ref, dv_ref, dk_sc, dv_sc = refs
    j, g, i, r = pl.program_id(2), pl.program_id(3), pl.program_id(4), pl.program_id(5)

    @pl.when((g == 0) & (i == 0))
    def _init():
        dk_sc[r] = jnp.zeros(dk_sc.shape[1:], jnp.float32)
        dv_sc[r] = jnp.zeros(dv_sc.shape[1:], jnp.float32)

    @pl.when(_causal_runs(i, j, bq, bk) if causal else True)
    def _step():
        q, do = q_ref[...], do_ref[...]
        s_t = lax.dot_general(k_ref[...], q, NT, preferred_element_type=jnp.float32) * scale
        if has_bias:
            s_t = s_t + bias_ref[...].astype(jnp.float32).T
        kv_idx = j * bk + lax.broadcasted_iota(jnp.int32, (bk, bq), 0)
        q_idx = i * bq + lax.broadcasted_iota(jnp.int32, (bk, bq), 1)
        mask = _visible(q_idx, kv_idx, qseg_ref[...] if has_seg else None,
                        kvseg_ref[0][:, None] if has_seg else None, causal)
        if mask is not None:
            s_t = jnp.where(mask, s_t, MASK)
        p_t = jnp.exp(s_t - lse_ref[...])  # [bk, bq]
        dv_sc[r] += jnp.dot(p_t.astype(do.dtype), do, preferred_element_type=jnp.float32)
        dp_t = lax.dot_general(v_ref[...], do, NT, preferred_element_type=jnp.float32)
        ds_t = p_t * (dp_t - di_ref[...])
        dk_sc[r] += jnp.dot(ds_t.astype(q.dtype), q, preferred_element_type=jnp.float32)

    @pl.when((g == groups - 1) & (i == nq - 1))
    def _finish():
        dk_ref[...] = (dk_sc[r] * scale).astype(dk_ref.dtype)
        dv_ref[...] = dv_sc[r].astype(dv_ref.dtype)


# --------------------------------------------------------------------------------------------------
# Backward, dQ and dS (= d bias): grid (batch chunk, head, q block, kv block, row of the chunk).


def _dq_kernel(*refs, causal, scale, has_bias, has_seg, shared_bias, bq, bk, nk):
    q_ref, k_ref, v_ref, *refs = refs
    bias_ref = refs.pop(0) if has_bias else None
    qseg_ref, kvseg_ref = (refs.pop(0), refs.pop(0)) if has_seg else (None, None)
    lse_ref, di_ref, do_ref, dq_ref, *refs = refs
    dbias_ref = refs.pop(0) if has_bias else None
    (dq_sc,) = refs
    i, j, r = pl.program_id(2), pl.program_id(3), pl.program_id(4)

    @pl.when(j == 0)
    def _init():
        dq_sc[r] = jnp.zeros(dq_sc.shape[1:], jnp.float32)

    def dlogits():
        q, k, do = q_ref[...], k_ref[...], do_ref[...]
        s = _masked_logits(q, k, bias_ref, qseg_ref, kvseg_ref, i, j, causal=causal, scale=scale,
                           bq=bq, bk=bk)
        p = jnp.exp(s - lse_ref[0][:, None])
        dp = lax.dot_general(do, v_ref[...], NT, preferred_element_type=jnp.float32)
        ds = p * (dp - di_ref[0][:, None])
        dq_sc[r] += jnp.dot(ds.astype(k.dtype), k, preferred_element_type=jnp.float32)
        return ds

    def store_dbias(ds):
        if shared_bias:  # one block for every row of the chunk: summed here, in float32
            @pl.when(r == 0)
            def _first():
                dbias_ref[...] = ds.astype(dbias_ref.dtype)

            @pl.when(r > 0)
            def _more():
                dbias_ref[...] += ds.astype(dbias_ref.dtype)
        else:
            dbias_ref[...] = ds.astype(dbias_ref.dtype)

    runs = _causal_runs(i, j, bq, bk) if causal else True

    @pl.when(runs)
    def _step():
        ds = dlogits()
        if has_bias:
            store_dbias(ds)

    if has_bias and causal:
        @pl.when(jnp.logical_not(runs))
        def _skipped():  # every dS block is written: above the diagonal it is zero
            store_dbias(jnp.zeros((bq, bk), jnp.float32))

    @pl.when(j == nk - 1)
    def _finish():
        dq_ref[...] = (dq_sc[r] * scale).astype(dq_ref.dtype)


# --------------------------------------------------------------------------------------------------
# The three pallas_calls.


def _nbytes(shape, dtype) -> int:
    return math.prod(shape) * jnp.dtype(dtype).itemsize


class _Geometry:
    """Static shapes, blocks, grid sizes and index maps shared by the three kernels."""

    def __init__(self, q, k, v, bias, has_seg, causal, block_q, block_kv):
        self.b, self.h, self.lq, self.d = q.shape
        self.kv_heads, self.lk, self.dv = k.shape[1], k.shape[2], v.shape[3]
        self.groups = self.h // self.kv_heads
        self.bq, self.bk = min(block_q, self.lq), min(block_kv, self.lk)
        for name, n, blk in (("q length", self.lq, self.bq), ("kv length", self.lk, self.bk)):
            if n % blk or blk % LANES:
                raise ValueError(f"flash attention: {name} {n} must be a multiple of its block "
                                 f"{blk}, itself a multiple of {LANES} (pad first)")
        self.nq, self.nk = self.lq // self.bq, self.lk // self.bk
        self.causal, self.has_seg = causal, has_seg
        self.has_bias = bias is not None
        self.shared_bias = self.has_bias and bias.shape[0] == 1
        if self.has_bias and tuple(bias.shape[1:]) != (self.h, self.lq, self.lk):
            raise ValueError(f"flash attention: bias must be [1|batch, heads, q_len, kv_len] = "
                             f"[1|{self.b}, {self.h}, {self.lq}, {self.lk}], got {bias.shape}")
        # rows per batch chunk: their m, l and accumulators (forward) / dQ (backward) in VMEM
        per_row = 4 * self.bq * (2 * LANES + max(self.d, self.dv))
        self.rows = _batch_chunk(self.b, per_row)
        self.chunks = self.b // self.rows

    def kv_block(self, i, j):
        """kv block ``j`` of q block ``i``, clamped under the causal mask to the last one that
        row block sees: skipped steps keep the block index, so nothing is fetched for them."""
        return jnp.minimum(j, lax.div(i * self.bq + self.bq - 1, self.bk)) if self.causal else j

    def q_block(self, i, j):
        """q block ``i`` of kv block ``j``, clamped under the causal mask to the first one that
        sees it."""
        return jnp.maximum(i, lax.div(j * self.bk, self.bq)) if self.causal else i

    def bias_row(self, row):
        return 0 if self.shared_bias else row

    def visible_pairs(self) -> int:
        """(q block, kv block) pairs the kernels compute."""
        if not self.causal:
            return self.nq * self.nk
        return sum(min(self.nk, (i * self.bq + self.bq - 1) // self.bk + 1) for i in range(self.nq))

    def fetches(self, outer: str) -> int:
        """Block fetches (or write-backs) per (row, query head) of an operand whose block index is
        set by the ``outer`` grid axis ("q": q, o, dO, statistics in the forward and dQ kernels;
        "kv": k, v, dK, dV in the dK/dV kernel) or by both ("pair"). Pallas moves a block when its
        index differs from the previous step's: with several rows per chunk the row changes at
        every step, so every step moves every per-row block (skipped causal steps included)."""
        if self.rows > 1:
            return self.nq * self.nk
        return {"q": self.nq, "kv": self.nk / self.groups, "pair": self.visible_pairs()}[outer]

    def flops(self, per_head_pair: int) -> int:
        """``per_head_pair`` · L · S · D FLOPs per (row, head), halved for causal."""
        half = 0.5 if self.causal else 1.0
        return int(per_head_pair * self.b * self.h * self.lq * self.lk * max(self.d, self.dv) * half)

    def bytes_(self, blocks: dict) -> int:
        """Bytes moved: ``blocks`` maps (rows, cols, dtype) of a block to its `fetches` kind."""
        return int(sum(self.b * self.h * self.fetches(kind) * _nbytes(shape[:2], shape[2])
                       for shape, kind in blocks))

    def bias_bytes(self, bias, kind: str) -> int:
        """Bias bytes one kernel reads: a shared block once per batch chunk and visited pair (its
        index does not change with the row), a per-row block as the other per-row blocks."""
        if bias is None:
            return 0
        block = self.bq * self.bk * bias.dtype.itemsize
        if self.shared_bias:
            return self.chunks * self.h * self.visible_pairs() * block
        return int(self.b * self.h * self.fetches(kind) * block)

def _specs_in(geo: _Geometry, q_map, kv_map, bias_map, qseg_map, kvseg_map):
    specs = [pl.BlockSpec((None, None, geo.bq, geo.d), q_map),
             pl.BlockSpec((None, None, geo.bk, geo.d), kv_map),
             pl.BlockSpec((None, None, geo.bk, geo.dv), kv_map)]
    if geo.has_bias:
        specs.append(pl.BlockSpec((None, None, geo.bq, geo.bk), bias_map))
    if geo.has_seg:
        specs += [pl.BlockSpec((None, 1, geo.bq), qseg_map), pl.BlockSpec((None, 1, geo.bk), kvseg_map)]
    return specs


def _operands(q, k, v, bias, q_seg, kv_seg):
    ops = [q, k, v] + ([bias] if bias is not None else [])
    if q_seg is not None:
        ops += [q_seg[:, None].astype(jnp.int32), kv_seg[:, None].astype(jnp.int32)]
    return ops


def _q_major_maps(geo: _Geometry):
    """Block index maps of the kernels whose grid is (row chunk c, head h, q block i, kv block j,
    row r) — the forward and dQ kernels: those of q (and o, dO, dQ), k/v, the bias, the q and kv
    segment ids, and the per-query statistics (logsumexp, D)."""
    row = lambda c, r: c * geo.rows + r
    return (lambda c, h, i, j, r: (row(c, r), h, i, 0),
            lambda c, h, i, j, r: (row(c, r), lax.div(h, geo.groups), geo.kv_block(i, j), 0),
            lambda c, h, i, j, r: (geo.bias_row(row(c, r)), h, i, geo.kv_block(i, j)),
            lambda c, h, i, j, r: (row(c, r), 0, i),
            lambda c, h, i, j, r: (row(c, r), 0, geo.kv_block(i, j)),
            lambda c, h, i, j, r: (row(c, r), h, 0, i))


def _forward(q, k, v, bias, q_seg, kv_seg, *, causal, scale, block_q, block_kv, interpret):
    geo = _Geometry(q, k, v, bias, q_seg is not None, causal, block_q, block_kv)
    n, bq = geo.rows, geo.bq
    q_map, kv_map, bias_map, qseg_map, kvseg_map, lse_map = _q_major_maps(geo)
    out_dtype = v.dtype
    blocks = [((bq, geo.d, q.dtype), "q"), ((geo.bk, geo.d, k.dtype), "pair"),
              ((geo.bk, geo.dv, v.dtype), "pair"), ((bq, geo.dv, out_dtype), "q"),
              ((1, bq, jnp.float32), "q")]  # q, k, v, o, logsumexp
    blocks += [((1, bq, jnp.int32), "q"), ((1, geo.bk, jnp.int32), "pair")] if geo.has_seg else []
    cost = pl.CostEstimate(flops=geo.flops(4), transcendentals=geo.flops(1) // max(geo.d, geo.dv),
                           bytes_accessed=geo.bytes_(blocks) + geo.bias_bytes(bias, "pair"))
    kernel = functools.partial(_fwd_kernel, causal=causal, scale=scale, has_bias=geo.has_bias,
                               has_seg=geo.has_seg, bq=bq, bk=geo.bk, nk=geo.nk)
    out, lse = pl.pallas_call(
        kernel,
        grid=(geo.chunks, geo.h, geo.nq, geo.nk, n),
        in_specs=_specs_in(geo, q_map, kv_map, bias_map, qseg_map, kvseg_map),
        out_specs=[pl.BlockSpec((None, None, bq, geo.dv), q_map),
                   pl.BlockSpec((None, None, 1, bq), lse_map)],
        out_shape=[jax.ShapeDtypeStruct((geo.b, geo.h, geo.lq, geo.dv), out_dtype),
                   jax.ShapeDtypeStruct((geo.b, geo.h, 1, geo.lq), jnp.float32)],
        scratch_shapes=[pltpu.VMEM((n, bq, LANES), jnp.float32),
                        pltpu.VMEM((n, bq, LANES), jnp.float32),
                        pltpu.VMEM((n, bq, geo.dv), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary", "arbitrary")),
        cost_estimate=cost, interpret=interpret, name="flash_bias_fwd",
    )(*_operands(q, k, v, bias, q_seg, kv_seg))
    return out, lse


def _backward_dkv(q, k, v, bias, q_seg, kv_seg, lse, di, do, *, causal, scale, block_q,
                  block_kv, interpret):
    geo = _Geometry(q, k, v, bias, q_seg is not None, causal, block_q, block_kv)
    n, g = geo.rows, geo.groups
    row = lambda c, r: c * n + r
    q_map = lambda c, kh, j, gi, i, r: (row(c, r), kh * g + gi, geo.q_block(i, j), 0)
    kv_map = lambda c, kh, j, gi, i, r: (row(c, r), kh, j, 0)
    bias_map = lambda c, kh, j, gi, i, r: (geo.bias_row(row(c, r)), kh * g + gi, geo.q_block(i, j), j)
    qseg_map = lambda c, kh, j, gi, i, r: (row(c, r), 0, geo.q_block(i, j))
    kvseg_map = lambda c, kh, j, gi, i, r: (row(c, r), 0, j)
    stat_map = lambda c, kh, j, gi, i, r: (row(c, r), kh * g + gi, 0, geo.q_block(i, j))
    specs = _specs_in(geo, q_map, kv_map, bias_map, qseg_map, kvseg_map)
    specs += [pl.BlockSpec((None, None, 1, geo.bq), stat_map),
              pl.BlockSpec((None, None, 1, geo.bq), stat_map),
              pl.BlockSpec((None, None, geo.bq, geo.dv), q_map)]
    blocks = [((geo.bq, geo.d, q.dtype), "pair"), ((geo.bq, geo.dv, do.dtype), "pair"),
              ((2, geo.bq, jnp.float32), "pair"),  # q, dO, logsumexp and Δ
              ((geo.bk, geo.d, k.dtype), "kv"), ((geo.bk, geo.dv, v.dtype), "kv"),  # k, v
              ((geo.bk, geo.d, k.dtype), "kv"), ((geo.bk, geo.dv, v.dtype), "kv")]  # dK, dV
    blocks += [((1, geo.bq, jnp.int32), "pair"), ((1, geo.bk, jnp.int32), "kv")] if geo.has_seg else []
    cost = pl.CostEstimate(flops=geo.flops(4), transcendentals=geo.flops(1) // max(geo.d, geo.dv),
                           bytes_accessed=geo.bytes_(blocks) + geo.bias_bytes(bias, "pair"))
    kernel = functools.partial(_dkv_kernel, causal=causal, scale=scale, has_bias=geo.has_bias,
                               has_seg=geo.has_seg, bq=geo.bq, bk=geo.bk, groups=g, nq=geo.nq)
    return pl.pallas_call(
        kernel,
        grid=(geo.chunks, geo.kv_heads, geo.nk, g, geo.nq, n),
        in_specs=specs,
        out_specs=[pl.BlockSpec((None, None, geo.bk, geo.d), kv_map),
                   pl.BlockSpec((None, None, geo.bk, geo.dv), kv_map)],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        scratch_shapes=[pltpu.VMEM((n, geo.bk, geo.d), jnp.float32),
                        pltpu.VMEM((n, geo.bk, geo.dv), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=(
            "parallel", "parallel", "parallel", "arbitrary", "arbitrary", "arbitrary")),
        cost_estimate=cost, interpret=interpret, name="flash_bias_dkv",
    )(*_operands(q, k, v, bias, q_seg, kv_seg), lse, di, do)


def _backward_dq(q, k, v, bias, q_seg, kv_seg, lse, di, do, *, causal, scale, block_q,
                 block_kv, interpret):
    geo = _Geometry(q, k, v, bias, q_seg is not None, causal, block_q, block_kv)
    n, bq = geo.rows, geo.bq
    q_map, kv_map, bias_map, qseg_map, kvseg_map, stat_map = _q_major_maps(geo)
    specs = _specs_in(geo, q_map, kv_map, bias_map, qseg_map, kvseg_map)
    specs += [pl.BlockSpec((None, None, 1, bq), stat_map), pl.BlockSpec((None, None, 1, bq), stat_map),
              pl.BlockSpec((None, None, bq, geo.dv), q_map)]
    out_specs = [pl.BlockSpec((None, None, bq, geo.d), q_map)]
    out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype)]
    blocks = [((bq, geo.d, q.dtype), "q"), ((bq, geo.dv, do.dtype), "q"), ((2, bq, jnp.float32), "q"),
              ((bq, geo.d, q.dtype), "q"),  # q, dO, logsumexp and Δ, dQ
              ((geo.bk, geo.d, k.dtype), "pair"), ((geo.bk, geo.dv, v.dtype), "pair")]  # k, v
    blocks += [((1, bq, jnp.int32), "q"), ((1, geo.bk, jnp.int32), "pair")] if geo.has_seg else []
    nbytes = geo.bytes_(blocks)
    if geo.has_bias:
        if geo.shared_bias:  # per batch chunk, summed over the chunks by XLA
            out_specs.append(pl.BlockSpec((None, None, bq, geo.bk), lambda c, h, i, j, r: (c, h, i, j)))
            out_shape.append(jax.ShapeDtypeStruct((geo.chunks, geo.h, geo.lq, geo.lk), jnp.float32))
            nbytes += geo.chunks * geo.h * geo.lq * geo.lk * 4
        else:
            out_specs.append(pl.BlockSpec((None, None, bq, geo.bk),
                                          lambda c, h, i, j, r: (c * n + r, h, i, j)))
            out_shape.append(jax.ShapeDtypeStruct(bias.shape, bias.dtype))
            nbytes += _nbytes(bias.shape, bias.dtype)
        nbytes += geo.bias_bytes(bias, "pair")
    cost = pl.CostEstimate(flops=geo.flops(4), transcendentals=geo.flops(1) // max(geo.d, geo.dv),
                           bytes_accessed=nbytes)
    kernel = functools.partial(_dq_kernel, causal=causal, scale=scale, has_bias=geo.has_bias,
                               has_seg=geo.has_seg, shared_bias=geo.shared_bias, bq=bq, bk=geo.bk,
                               nk=geo.nk)
    out = pl.pallas_call(
        kernel,
        grid=(geo.chunks, geo.h, geo.nq, geo.nk, n),
        in_specs=specs, out_specs=out_specs, out_shape=out_shape,
        scratch_shapes=[pltpu.VMEM((n, bq, geo.d), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary", "arbitrary")),
        cost_estimate=cost, interpret=interpret, name="flash_bias_dq",
    )(*_operands(q, k, v, bias, q_seg, kv_seg), lse, di, do)
    dq, dbias = (out[0], out[1]) if geo.has_bias else (out[0], None)
    if dbias is not None and geo.shared_bias:
        dbias = jnp.sum(dbias, axis=0, keepdims=True).astype(bias.dtype)
    return dq, dbias


# --------------------------------------------------------------------------------------------------
# The differentiable function.


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8, 9, 10))
def _flash(q, k, v, bias, q_seg, kv_seg, causal, scale, block_q, block_kv, interpret):
    return _forward(q, k, v, bias, q_seg, kv_seg, causal=causal, scale=scale, block_q=block_q,
                    block_kv=block_kv, interpret=interpret)[0]


def _flash_fwd(q, k, v, bias, q_seg, kv_seg, causal, scale, block_q, block_kv, interpret):
    out, lse = _forward(q, k, v, bias, q_seg, kv_seg, causal=causal, scale=scale,
                        block_q=block_q, block_kv=block_kv, interpret=interpret)
    return out, (q, k, v, bias, q_seg, kv_seg, out, lse)


def _flash_bwd(causal, scale, block_q, block_kv, interpret, res, do):
    q, k, v, bias, q_seg, kv_seg, out, lse = res
    # Δ = rowsum(dO · o) (FlashAttention-2, Alg. 2 line 4): [B, H, 1, L] as the logsumexp
    di = jnp.sum(do.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)[:, :, None]
    kw = dict(causal=causal, scale=scale, block_q=block_q, block_kv=block_kv, interpret=interpret)
    dk, dv = _backward_dkv(q, k, v, bias, q_seg, kv_seg, lse, di, do, **kw)
    dq, dbias = _backward_dq(q, k, v, bias, q_seg, kv_seg, lse, di, do, **kw)
    return dq, dk, dv, dbias, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def flash_attention(q: Array, k: Array, v: Array, bias: Array | None = None,
                    q_segment_ids: Array | None = None, kv_segment_ids: Array | None = None, *,
                    causal: bool = False, scale: float = 1.0, block_q: int = 512,
                    block_kv: int = 512, interpret: bool = False) -> Array:
    """Flash attention of ``q`` `[B, H, L, D]` over ``k`` `[B, K, S, D]`, ``v`` `[B, K, S, Dv]`
    with an additive ``bias`` `[1|B, H, L, S]` (differentiable), segment ids `[B, L]` / `[B, S]`
    (both or neither) and a causal mask; logits ``q kᵀ · scale + bias``. Lengths must be
    multiples of the blocks (``min(block, length)``, a multiple of 128).

    Returns `[B, H, L, Dv]` in ``v.dtype``; rows with no visible key are 0."""
    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("flash attention: pass both q_segment_ids and kv_segment_ids, or neither")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"flash attention: query heads {q.shape[1]} must be a multiple of kv "
                         f"heads {k.shape[1]}")
    return _flash(q, k, v, bias, q_segment_ids, kv_segment_ids, causal, float(scale), block_q,
                  block_kv, interpret)


__all__ = ["flash_attention"]
