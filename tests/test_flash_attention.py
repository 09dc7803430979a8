"""Our Pallas flash-attention kernel with T5's relative-position bias (`jaxformer.ops.flash_attention`,
``attention_impl="flash"``), run through the Pallas interpreter (``flash_interpret``) on CPU and
checked against the plain ``xla`` path: outputs and the gradients of q, k, v and the bias table, in
float32, for packed, padded, causal, bidirectional and grouped-kv-head cases; its declared costs
against the planner's FLOPs and a block count; the config and the backend checks. Shapes are small:
each interpreted case compiles a forward and two backward kernels."""

from __future__ import annotations

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.config import ModelConfig
from jaxformer.models.presets import preset
from jaxformer.ops import dot_product_attention
from jaxformer.ops.flash_attention import flash_attention
from jaxformer.ops.kernel_choice import backend_problem, unsupported
from jaxformer.ops.positions import relative_position_bias

B, H, D, BUCKETS = 2, 4, 16, 8


def _segments(length: int, pad: tuple[int, ...]) -> np.ndarray:
    """Row ``r``: two documents (ids 1, 2), then ``pad[r]`` padding positions (id 0)."""
    seg = np.ones((B, length), np.int32)
    seg[:, length // 3:] = 2
    for r, p in enumerate(pad):
        if p:
            seg[r, length - p:] = 0
    return seg


def _positions(seg: np.ndarray) -> np.ndarray:
    """Positions restarting at 0 in each document, as packing gives them."""
    pos = np.zeros_like(seg)
    for r in range(seg.shape[0]):
        for i in range(1, seg.shape[1]):
            pos[r, i] = 0 if seg[r, i] != seg[r, i - 1] else pos[r, i - 1] + 1
    return pos


def _attend(impl, q, k, v, table, *, causal, seg, pos, block):
    """T5 attention: the bias gathered from ``table`` `[buckets, H]` at ``pos`` (1-D: one bias
    `[1, H, L, S]` for the batch; 2-D: `[B, H, L, S]`, a bias per row)."""
    bias = relative_position_bias(table, pos, pos, bidirectional=not causal, max_distance=16)
    return dot_product_attention(q, k, v, bias=bias, causal=causal, q_segment_ids=seg,
                                 kv_segment_ids=seg, scale=1.0, implementation=impl,
                                 kv_chunk_size=block)


CASES = {  # length, kv heads, causal, segments' padding per row (None: no segment ids), per-row bias
    "packed_bidirectional_shared_bias": (100, H, False, (0, 37), False),
    "padded_causal_gqa_per_row_bias": (100, 2, True, (5, 60), True),
    "causal_two_blocks_no_segments": (256, 1, True, None, False),
}


@pytest.mark.parametrize("case", [
    "packed_bidirectional_shared_bias", "padded_causal_gqa_per_row_bias",
    pytest.param("causal_two_blocks_no_segments", marks=pytest.mark.slow)])
def test_outputs_and_gradients_equal_xla(case):
    """Lengths of 100 are padded to one block of 128 by the adapter; 256 with 128-blocks gives a
    2×2 grid whose upper block the causal kernels skip. Padding rows (id 0) see no key: 0 out,
    no gradient, in both paths."""
    length, kv_heads, causal, pad, per_row = CASES[case]
    keys = jax.random.split(jax.random.key(0), 5)
    q = jax.random.normal(keys[0], (B, length, H, D))
    k = jax.random.normal(keys[1], (B, length, kv_heads, D))
    v = jax.random.normal(keys[2], (B, length, kv_heads, D))
    table = jax.random.normal(keys[3], (BUCKETS, H))
    seg = None if pad is None else jnp.asarray(_segments(length, pad))
    pos = jnp.asarray(_positions(np.asarray(seg))) if per_row else jnp.arange(length)
    ct = jax.random.normal(keys[4], (B, length, H, D))
    results = {}
    for impl in ("xla", "flash_interpret"):
        f = lambda *a, impl=impl: _attend(impl, *a, causal=causal, seg=seg, pos=pos, block=128)
        out, vjp = jax.vjp(f, q, k, v, table)
        results[impl] = (out, *vjp(ct))
    for name, got, want in zip(("out", "dq", "dk", "dv", "dtable"), results["flash_interpret"],
                               results["xla"], strict=True):
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5, err_msg=name)
    assert float(jnp.max(jnp.abs(results["xla"][4]))) > 0.1  # the table does get a gradient
    if pad is not None and max(pad):
        blind = np.asarray(seg) == 0
        assert np.all(np.asarray(results["flash_interpret"][0])[blind] == 0)
        assert np.all(np.asarray(results["flash_interpret"][1])[blind] == 0)


def test_kernel_without_bias_or_segments_equals_xla():
    """The kernel called directly (head-major), no bias and no segment ids, bidirectional, with
    a query length unequal to the key length (L = 128, S = 256: two kv blocks)."""
    keys = jax.random.split(jax.random.key(1), 4)
    q = jax.random.normal(keys[0], (1, 2, 128, D))
    k, v = (jax.random.normal(kk, (1, 2, 256, D)) for kk in keys[1:3])
    ct = jax.random.normal(keys[3], (1, 2, 128, D))
    plain = lambda q, k, v: jnp.swapaxes(dot_product_attention(
        *(jnp.swapaxes(x, 1, 2) for x in (q, k, v)), scale=0.25), 1, 2)
    fused = lambda q, k, v: flash_attention(q, k, v, scale=0.25, block_q=128, block_kv=128,
                                            interpret=True)
    (want, want_vjp), (got, got_vjp) = jax.vjp(plain, q, k, v), jax.vjp(fused, q, k, v)
    np.testing.assert_allclose(got, want, atol=2e-5)
    for g, w in zip(got_vjp(ct), want_vjp(ct), strict=True):
        np.testing.assert_allclose(g, w, atol=2e-5)


def test_bidirectional_call_without_a_bias_takes_the_kernel_and_equals_xla():
    """BERT's self-attention and T5's cross-attention (no bias, not causal) through
    ``flash_interpret`` run our kernel, not splash (`fused_attention`; its residual is the
    `[B, H, L]` logsumexp, splash's a 128-lane float32 copy, docs/scaling.md): packed and padded
    rows, outputs and gradients equal to xla's. A causal call without a bias still takes splash."""
    length = 100
    keys = jax.random.split(jax.random.key(2), 4)
    q, k, v = (jax.random.normal(kk, (B, length, H, D)) for kk in keys[:3])
    ct = jax.random.normal(keys[3], (B, length, H, D))
    seg = jnp.asarray(_segments(length, (0, 37)))

    def attend(impl, causal=False):
        return lambda q, k, v: dot_product_attention(
            q, k, v, causal=causal, q_segment_ids=seg, kv_segment_ids=seg, scale=0.25,
            implementation=impl, kv_chunk_size=128)

    kernels = set(_costs(attend("flash_interpret"), q, k, v))
    assert kernels and all(n.startswith("flash_bias") for n in kernels), kernels
    causal = set(_costs(attend("flash_interpret", causal=True), q, k, v))
    assert causal and not any(n.startswith("flash_bias") for n in causal), causal
    (want, want_vjp), (got, got_vjp) = (jax.vjp(attend(impl), q, k, v)
                                        for impl in ("xla", "flash_interpret"))
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)
    for name, g, w in zip(("dq", "dk", "dv"), got_vjp(ct), want_vjp(ct), strict=True):
        np.testing.assert_allclose(g, w, atol=2e-5, rtol=2e-5, err_msg=name)


# --------------------------------------------------------------------------------------------------
# Declared costs.


def _costs(fn, *args) -> dict:
    """{kernel name: its `pl.CostEstimate`} of the pallas_calls in ``fn``'s jaxpr."""
    out = {}

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "pallas_call":
                out[eqn.params["name"]] = eqn.params["cost_estimate"]
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_declared_flops_are_the_planners_and_bytes_count_the_blocks(causal):
    """FLOPs: 4·L·S·D per (row, head) forward, 4 + 4 backward (the planner's 12·L·S·D per layer,
    `jaxformer.plan.model_flops`), halved for causal. Bytes, one row (so the causal kernels skip
    the block above the diagonal: 3 of the 2×2 blocks are fetched), bfloat16, a shared bias."""
    b, h, n, d, blk = 1, 2, 256, 64, 128
    bf = jnp.bfloat16
    q = k = v = jnp.zeros((b, h, n, d), bf)
    bias = jnp.zeros((1, h, n, n), bf)
    loss = lambda q, k, v, bias: jnp.sum(flash_attention(
        q, k, v, bias, causal=causal, block_q=blk, block_kv=blk, interpret=True).astype(jnp.float32))
    costs = _costs(jax.grad(loss, argnums=(0, 1, 2, 3)), q, k, v, bias)
    assert set(costs) == {"flash_bias_fwd", "flash_bias_dkv", "flash_bias_dq"}
    half = 0.5 if causal else 1.0
    for name in costs:
        assert costs[name].flops == 4 * b * h * n * n * d * half, name
    pairs = 3 if causal else 4
    tile, row = blk * d * 2, blk * 4  # a [128, 64] bf16 block; a [1, 128] f32 statistic
    bias_tile = blk * blk * 2
    q_blocks = n // blk
    # forward: q once per q block; k, v per pair; o and logsumexp once per q block
    fwd = b * h * (q_blocks * tile + pairs * 2 * tile + q_blocks * (tile + row)) + h * pairs * bias_tile
    # dK/dV: q, dO, logsumexp, Δ per pair; k, v, dK, dV once per kv block
    dkv = b * h * (pairs * (2 * tile + 2 * row) + q_blocks * 4 * tile) + h * pairs * bias_tile
    # dQ/dS: q, dO, statistics, dQ once per q block; k, v per pair; dS written for every block (f32)
    dq = (b * h * (q_blocks * (3 * tile + 2 * row) + pairs * 2 * tile) + h * pairs * bias_tile
          + h * n * n * 4)
    assert {k: c.bytes_accessed for k, c in costs.items()} == {
        "flash_bias_fwd": fwd, "flash_bias_dkv": dkv, "flash_bias_dq": dq}


# --------------------------------------------------------------------------------------------------
# Config and backend.


def test_t5_config_takes_flash_and_cudnn_and_splash_still_refuses_its_bias():
    for impl in ("flash", "flash_interpret", "cudnn"):
        assert ModelConfig.from_dict(preset("t5_base_bf16", attention_impl=impl)).attention_impl == impl
    for impl in ("splash", "splash_interpret"):
        with pytest.raises(ValueError, match="no bias operand.*'flash'"):
            ModelConfig.from_dict(preset("t5_base_bf16", attention_impl=impl))
    assert unsupported("flash", dtype="bfloat16", head_dim=64, relative_bias=True,
                       attention_dropout_rate=0.1, chunk_size=512)[0] == "attention_dropout_rate"
    assert unsupported("flash", dtype="float32", head_dim=64, relative_bias=True,
                       attention_dropout_rate=0.0, chunk_size=100)[0] == "attention_chunk_size"


def test_flash_needs_a_tpu_and_the_interpreter_runs_anywhere():
    assert backend_problem("flash", "tpu", "") is None
    assert "needs a TPU" in backend_problem("flash", "cpu", "")
    assert "flash_interpret" in backend_problem("flash", "cpu", "")
    assert backend_problem("flash_interpret", "cpu", "") is None
    if jax.default_backend() != "tpu":  # at trace time too, naming 'flash' even with no bias
        q = jnp.zeros((1, 8, H, D))
        for bias in (None, jnp.zeros((1, H, 8, 8))):
            with pytest.raises(ValueError, match="attention_impl='flash' needs a TPU"):
                dot_product_attention(q, q, q, bias=bias, implementation="flash")


def test_kernel_refuses_a_dense_mask_and_dropout_at_trace_time():
    q = jnp.zeros((1, 8, H, D))
    with pytest.raises(ValueError, match="dense mask"):
        dot_product_attention(q, q, q, bias=jnp.zeros((1, H, 8, 8)), mask=jnp.ones((1, 1, 8, 8), bool),
                              implementation="flash_interpret")
    with pytest.raises(ValueError, match="no attention dropout"):
        dot_product_attention(q, q, q, bias=jnp.zeros((1, H, 8, 8)), dropout_rate=0.1,
                              dropout_rng=jax.random.key(0), implementation="flash_interpret")


# --------------------------------------------------------------------------------------------------
# Training: a tiny T5's loss curve with the interpreted kernel equals xla's.

CURVE_STEPS, CURVE_LEN = 50, 32


def _t5_losses(impl: str, steps: int) -> np.ndarray:
    """``steps`` train steps of a one-layer t5_tiny (seq2seq, packed rows with padding) on one
    device with ``attention_impl=impl``: the losses. Self-attention (with the bias) and
    cross-attention (no bias, bidirectional) go through the kernel."""

    from jaxformer.models import build_model
    from jaxformer.objectives import bind_objective
    from jaxformer.parallel.mesh import make_mesh
    from jaxformer.parallel.partition import sharded_jit
    from jaxformer.train.optim import make_optimizer, optimizer_settings
    from jaxformer.train.state import create_train_state
    from jaxformer.train.step import make_train_step
    from jaxformer.vocab import SpecialTokens

    cfg = ModelConfig.from_dict(preset(
        "t5_tiny", vocab_size=128, num_layers=1, max_len=CURVE_LEN, dropout_rate=0.0,
        attention_dropout_rate=0.0, ffn_dropout_rate=0.0, attention_impl=impl))
    model = build_model(cfg)
    tx, schedule = make_optimizer(optimizer_settings("gpt3", peak_lr=1e-2, warmup_steps=1,
                                                           eps=1e-3), cfg.d_model, steps)
    prepare = bind_objective("seq2seq", None, SpecialTokens(cfg.vocab_size))
    mesh = make_mesh({"data": 1}, jax.devices()[:1])
    state, shardings = create_train_state(model, tx, mesh, seed=0)
    step = sharded_jit(make_train_step(model, tx, prepare, schedule), mesh,
                       in_shardings=(shardings, None), out_shardings=(shardings, None))
    rng, n, tl = np.random.default_rng(2), CURVE_LEN, CURVE_LEN // 2
    seg = _segments(n, (0, 7))
    tseg = np.where(np.arange(tl) < 9, 1, 2)[None].repeat(B, 0)
    compiled, losses = None, []
    for _ in range(steps):
        batch = {"inputs": np.where(seg > 0, rng.integers(7, 128, (B, n)), 0).astype(np.int32),
                 "inputs_segment_ids": seg, "inputs_positions": _positions(seg),
                 "targets": rng.integers(7, 128, (B, tl)).astype(np.int32),
                 "targets_segment_ids": tseg.astype(np.int32),
                 "targets_positions": _positions(tseg.astype(np.int32))}
        compiled = compiled or step.lower(state, batch).compile()
        state, metrics = compiled(state, batch)
        losses.append(float(metrics["loss"]))
    return np.array(losses)


@pytest.mark.slow
def test_t5_loss_curve_50_steps_flash_equals_xla():
    want = _t5_losses("xla", CURVE_STEPS)
    got = _t5_losses("flash_interpret", CURVE_STEPS)
    np.testing.assert_allclose(got, want, rtol=1e-4)
    assert got[-1] < got[0]  # it trains
