"""Context parallelism: ring attention (`jaxformer.ops.ring_attention`) and the ``context`` mesh
axis (`jaxformer.parallel.context`), on the 8 simulated CPU devices.

The reference is single-device ``xla`` attention (`jaxformer.ops.dot_product_attention`) on the
natural-order sequence: ring attention runs on the zig-zag-ordered blocks and is ordered back.
Outputs and gradients (q, k, v and T5's bias) agree to float32 rounding. The train step on
``context=4`` is compared with ``data=4`` on the same batches (packed, padded rows), for GPT
(learned and RoPE positions), BERT and T5 (relative bias, cross-attention); the step's HLO moves
keys/values with collective-permutes, each of which the compile report's counter counts as often as
it runs.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from jaxformer.compile import collectives
from jaxformer.config import ModelConfig
from jaxformer.models import build_model
from jaxformer.models.presets import preset
from jaxformer.objectives import bind_objective
from jaxformer.objectives.mlm import MLMOptions
from jaxformer.ops import ring_attention as ra
from jaxformer.ops.attention import dot_product_attention
from jaxformer.parallel.context import ring_attention_sharded
from jaxformer.parallel.mesh import make_mesh
from jaxformer.parallel.partition import mesh_rules, sharded_jit
from jaxformer.parallel.rules import batch_sharding
from jaxformer.train.config import base_config, check_context_parallel
from jaxformer.train.optim import make_optimizer, optimizer_settings
from jaxformer.train.state import create_train_state
from jaxformer.train.step import make_train_step
from jaxformer.vocab import SpecialTokens

N = 4  # context shards
# float32 sums over blocks in another order: ~1e-7 relative per addition
ATOL = 2e-5


def test_zigzag_order_round_trips():
    x = jnp.arange(2 * 16 * 3).reshape(2, 16, 3)
    z = ra.to_zigzag(x, 4)
    np.testing.assert_array_equal(z[0, :, 0] // 3, ra.zigzag_order(16, 4))
    np.testing.assert_array_equal(ra.zigzag_order(8, 2), [0, 1, 6, 7, 2, 3, 4, 5])
    np.testing.assert_array_equal(ra.from_zigzag(z, 4), x)
    with pytest.raises(ValueError, match="not divisible by 8"):
        ra.to_zigzag(jnp.zeros((1, 12)), 4)


def test_zigzag_balances_causal_work():
    """Every device computes the same 1 + (N-1)/2 blocks in zig-zag order; in contiguous order
    (skipping fully masked blocks) device d computes d + 1."""
    for n in (4, 8):
        zig = ra.causal_block_work(n)
        assert {w["computed"] for w in zig} == {1 + (n - 1) / 2}
        visible = [w["visible"] for w in zig]
        assert max(visible) - min(visible) < 1e-9
        contiguous = [w["computed"] for w in ra.causal_block_work(n, "contiguous")]
        assert contiguous == [d + 1.0 for d in range(n)]


def _mesh(**axes):
    return make_mesh(axes, jax.devices()[:int(np.prod(list(axes.values())))])


def _ring(mesh, q, k, v, **kw):
    """Ring attention of natural-order global arrays (reordered in and out)."""
    zz = lambda x, axis=1: None if x is None else ra.to_zigzag(x, N, axis)
    bias = kw.pop("bias", None)
    seg = {key: zz(kw.pop(key)) for key in ("q_segment_ids", "kv_segment_ids") if key in kw}
    bias = None if bias is None else zz(zz(bias, 2) if bias.shape[2] > 1 else bias, 3)
    out = ring_attention_sharded(mesh, "context", ("data", "fsdp"), "tensor", zz(q), zz(k),
                                 zz(v), bias=bias, kv_chunk_size=4, **seg, **kw)
    return ra.from_zigzag(out, N)


CASES = {
    "causal": dict(causal=True),
    "bidirectional": dict(),
    "packed_causal": dict(causal=True, packed=True),
    "gqa_causal": dict(causal=True, kv_heads=2),
    "mqa_packed": dict(causal=False, kv_heads=1, packed=True),
    "relative_bias": dict(causal=True, bias=True, packed=True),
    "cross": dict(kv_len=48, packed=True),
    "cross_bias_rows_broadcast": dict(kv_len=16, bias="keys"),
}


# Slow tier: the plain ``causal`` case (its mask without segments is ``gqa_causal``'s, with one kv
# head per query head: the train step and the forward below) and ``bidirectional`` (no mask:
# ``cross_bias_rows_broadcast`` and ``mqa_packed`` are not causal either); ~4 s of CPU each.
COVERED = {"causal", "bidirectional"}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in COVERED else c
                                  for c in sorted(CASES)])
def test_ring_equals_xla_attention_and_gradients(case):
    c = CASES[case]
    b, lq, h, d = 4, 32, 4, 8
    lk, kvh = c.get("kv_len", lq), c.get("kv_heads", h)
    r = np.random.default_rng(0)
    q, k, v = (jnp.asarray(r.normal(size=s), jnp.float32)
               for s in ((b, lq, h, d), (b, lk, kvh, d), (b, lk, kvh, d)))
    kw = {"causal": c.get("causal", False)}
    if c.get("packed"):  # two documents, then padding (id 0) in some rows
        q_seg = np.ones((b, lq), np.int32)
        q_seg[:, lq // 3:] = 2
        q_seg[1, -5:] = 0
        kv_seg = q_seg if lk == lq else np.where(np.arange(lk) < lk // 2, 1, 2)[None].repeat(b, 0)
        kv_seg[2, -3:] = 0
        kw.update(q_segment_ids=jnp.asarray(q_seg), kv_segment_ids=jnp.asarray(kv_seg))
    bias = None
    if c.get("bias") == "keys":  # a key-padding bias [B, 1, 1, S]
        bias = jnp.asarray(np.where(r.random((b, 1, 1, lk)) < 0.2, -1e9, 0.0), jnp.float32)
    elif c.get("bias"):
        bias = jnp.asarray(r.normal(size=(1, h, lq, lk)), jnp.float32)
    mesh = _mesh(data=2, context=N)
    cot = jnp.asarray(r.normal(size=(b, lq, h, d)), jnp.float32)

    def loss(fn):
        return lambda q, k, v, bias: jnp.sum(fn(q, k, v, bias=bias, **kw) * cot)

    ref = lambda q, k, v, bias, **kw: dot_product_attention(q, k, v, bias=bias, **kw)
    ring = lambda q, k, v, bias, **kw: _ring(mesh, q, k, v, bias=bias, **kw)
    argnums = (0, 1, 2, 3) if bias is not None else (0, 1, 2)
    with jax.default_matmul_precision("highest"):
        expect = ref(q, k, v, bias, **kw)
        got = jax.jit(lambda *a: ring(*a, **kw))(q, k, v, bias)
        g_expect = jax.grad(loss(ref), argnums)(q, k, v, bias)
        g_got = jax.jit(jax.grad(loss(ring), argnums))(q, k, v, bias)
    np.testing.assert_allclose(got, expect, atol=ATOL, rtol=ATOL)
    for name, a, e in zip("qkvb", g_got, g_expect):
        np.testing.assert_allclose(a, e, atol=4 * ATOL, rtol=ATOL, err_msg=f"d{name}")


def test_ring_contiguous_layout_and_tensor_split_heads():
    """The contiguous layout (blocks in natural order) gives the same result, with heads split
    over a tensor axis as well."""
    mesh = _mesh(context=N, tensor=2)
    r = np.random.default_rng(1)
    q, k, v = (jnp.asarray(r.normal(size=(2, 16, 4, 8)), jnp.float32) for _ in range(3))
    f = jax.shard_map(
        lambda q, k, v: ra.ring_attention(q, k, v, axis_name="context", causal=True,
                                          layout="contiguous"),
        mesh=mesh, in_specs=(PartitionSpec(None, "context", "tensor"),) * 3,
        out_specs=PartitionSpec(None, "context", "tensor"))
    with jax.default_matmul_precision("highest"):
        np.testing.assert_allclose(jax.jit(f)(q, k, v),
                                   dot_product_attention(q, k, v, causal=True), atol=ATOL)


# --------------------------------------------------------------------------------------------------
# The model and the train step on a context-parallel mesh.

# One layer: what is compared (each attention on the ring, the activations between embedding,
# layer and head staying split over ``context``) is all there in one; XLA:CPU compiles a 2-layer
# step for 8 devices ~1.7x slower (t5, data=4 + context=4: 61 s of CPU against 35 s).
TINY = dict(vocab_size=128, d_model=32, num_heads=4, d_ff=64, num_layers=1, max_len=32,
            dropout_rate=0.0, attention_dropout_rate=0.0, ffn_dropout_rate=0.0)
FAMILIES = {"gpt": ("gpt_tiny", "clm", {}), "gpt_rope_gqa": ("gpt_tiny", "clm",
                                                             dict(position="rope", num_kv_heads=2)),
            # Mistral's sliding window: an additive bias, split by query rows like T5's
            "llama_window": ("llama_tiny", "clm", dict(sliding_window=5)),
            "bert": ("bert_tiny", "mlm", {}), "t5": ("t5_tiny", "seq2seq", {})}
BATCH, LEN = 4, 32


def _batches(family: str, n: int) -> list[dict]:
    """Packed rows: two documents (segments 1, 2) and padding at the end of some rows."""
    r = np.random.default_rng(2)
    out = []
    for _ in range(n):
        seg = np.ones((BATCH, LEN), np.int32)
        seg[:, LEN // 2 - 3:] = 2
        seg[np.arange(LEN) >= LEN - 3 * np.arange(BATCH)[:, None]] = 0
        pos = np.concatenate([np.arange(LEN // 2 - 3), np.arange(LEN - LEN // 2 + 3)])
        tokens = np.where(seg > 0, r.integers(7, TINY["vocab_size"], (BATCH, LEN)), 0)
        b = {"inputs": tokens.astype(np.int32), "inputs_segment_ids": seg,
             "inputs_positions": np.where(seg > 0, pos, 0).astype(np.int32)}
        if family == "t5":
            tl = LEN // 2
            b.update(targets=r.integers(7, TINY["vocab_size"], (BATCH, tl)).astype(np.int32),
                     targets_segment_ids=seg[:, :tl] * 0 + np.where(np.arange(tl) < 9, 1, 2),
                     targets_positions=np.where(np.arange(tl) < 9, np.arange(tl),
                                                np.arange(tl) - 9)[None].repeat(BATCH, 0)
                     .astype(np.int32))
        out.append(b)
    return out


CURVE, CURVE_FAMILIES = 20, ("gpt", "bert", "t5")  # the loss curves' steps and families
PARAMS_AT = 3  # the step after which parameters are compared


@functools.cache
def _run(family: str, mesh_axes: tuple[tuple[str, int], ...]):
    """`_train` once per family and mesh for every test below (`CURVE` steps for the loss curves'
    families, else `PARAMS_AT`): (losses, the parameters after `PARAMS_AT` steps, the compiled
    step). The batches and the schedule do not depend on the number of steps, so a shorter run's
    losses are a longer run's first ones."""
    steps = CURVE if family in CURVE_FAMILIES else PARAMS_AT
    return _train(family, dict(mesh_axes), steps, keep_params_at=PARAMS_AT)


def _train(family: str, mesh_axes: dict, steps: int, keep_params_at: int | None = None):
    name, objective, extra = FAMILIES[family]
    cfg = ModelConfig.from_dict(preset(name, **{**TINY, **extra}))
    model = build_model(cfg)
    opt = optimizer_settings("gpt3", peak_lr=1e-2, warmup_steps=1, eps=1e-3)
    tx, schedule = make_optimizer(opt, cfg.d_model, 30)
    options = MLMOptions(mask_rate=0.3) if objective == "mlm" else None
    prepare = bind_objective(objective, options, SpecialTokens(cfg.vocab_size))
    mesh = _mesh(**mesh_axes)
    state, shardings = create_train_state(model, tx, mesh, seed=0)
    step = sharded_jit(make_train_step(model, tx, prepare, schedule), mesh,
                       in_shardings=(shardings, None), out_shardings=(shardings, None))
    losses, compiled, kept = [], None, None
    for b in _batches(family, steps):
        batch = {k: jax.device_put(v, batch_sharding(mesh, v.ndim)) for k, v in b.items()}
        compiled = compiled or step.lower(state, batch).compile()
        state, m = compiled(state, batch)
        losses.append(float(m["loss"]))
        if len(losses) == keep_params_at:
            kept = jax.device_get(state.params)
    return np.array(losses), (state.params if kept is None else kept), compiled


@pytest.mark.parametrize("family", ["gpt", *(pytest.param(f, marks=pytest.mark.slow)
                                             for f in ("gpt_rope_gqa", "llama_window", "bert", "t5"))])
def test_train_step_context4_equals_data4(family):
    """Three steps on the same packed batches: losses and parameters of ``context=4`` match
    ``data=4``; the compiled step passes keys/values with collective-permutes and gathers no
    activation."""
    ref_losses, ref_params, _ = _run(family, (("data", 4),))
    losses, params, compiled = _run(family, (("context", 4),))
    np.testing.assert_allclose(losses[:PARAMS_AT], ref_losses[:PARAMS_AT], rtol=2e-5)
    for a, e in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), atol=2e-5)
    text = compiled.as_text()
    assert collectives(text)["collective-permute"]["count"] > 0
    # nothing floating-point is gathered (T5 gathers its int32 positions for the bias columns)
    gathered = re.findall(r"= \(?(\w+)\[[\d,]*\][^=]*? all-gather(?:-start)?\(", text)
    assert not [t for t in gathered if t.startswith(("f", "bf"))], gathered


def test_compile_report_counts_each_ring_permute_as_often_as_it_runs():
    """The compile report's counter (`jaxformer.compile.collectives`) on the compiled ``context=4``
    GPT step, against XLA's own module structure (jaxlib's ``HloModule``: each instruction's opcode
    and shape, the ``while`` loops' bodies), with the trip count from the ring itself: a body runs
    ``N - 1`` times (`ring_attention`'s ``fori_loop(1, n, hop)``). XLA gives every ``ppermute`` of
    the ring the same ``channel_id``; the counter once took them for one collective and counted
    one per ring step (13 here, of 36)."""
    compiled = _run("gpt", (("context", N),))[2]
    instructions = [(c.name, i) for m in compiled.runtime_executable().hlo_modules()
                    for c in m.computations() for i in c.instructions()]
    bodies = {re.search(r"\bbody=%?([\w.\-]+)", i.to_string()).group(1)
              for _, i in instructions if i.opcode.name == "kWhile"}
    permutes = [(name in bodies, i) for name, i in instructions
                if i.opcode.name in ("kCollectivePermute", "kCollectivePermuteStart")]
    # one layer: K, V and segment ids per hop in the forward pass; with dK and dV in the backward
    assert sum(in_body for in_body, _ in permutes) == 3 + 5
    runs = [(N - 1 if in_body else 1, i) for in_body, i in permutes]
    got = collectives(compiled.as_text())["collective-permute"]
    assert got["count"] == sum(n for n, _ in runs)
    assert got["bytes"] == sum(n * np.prod(i.shape.dimensions()) * i.shape.numpy_dtype().itemsize
                               for n, i in runs)


@pytest.mark.slow
def test_context_combines_with_fsdp_and_tensor():
    ref_losses = _run("gpt", (("data", 4),))[0][:2]
    losses, _, _ = _train("gpt", {"fsdp": 2, "context": 2, "tensor": 2}, 2)
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-5)


@pytest.mark.slow
@pytest.mark.parametrize("family", CURVE_FAMILIES)
def test_loss_curve_20_steps_context_equals_data(family):
    ref_losses, _, _ = _run(family, (("data", 4),))
    losses, _, _ = _run(family, (("context", 4),))
    # float32 rounding, amplified by training: ~1e-7 here (Adam ε 1e-3, one narrow layer); a
    # larger run drifts further, whichever mesh (docs/scaling.md, bench/context_drift.py)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-4)
    assert losses[-1] < losses[0]  # it trains


def test_model_outputs_natural_order_under_context_mesh():
    """A forward under `mesh_rules` on ``context=4`` returns the single-device logits (natural
    order in and out)."""
    cfg = ModelConfig.from_dict(preset("gpt_tiny", **TINY))
    model = build_model(cfg)
    params = model.init(jax.random.key(0))
    tokens = jnp.asarray(np.random.default_rng(3).integers(7, 128, (2, LEN)), jnp.int32)
    expect = model.apply(params, tokens)
    mesh = _mesh(context=N)
    with mesh_rules(mesh):
        got = jax.jit(lambda p, t: model.apply(p, t))(params, tokens)
    np.testing.assert_allclose(got, expect, atol=1e-4)


def test_generation_on_a_context_mesh_runs_attention_whole():
    """Decoding steps, and a T5 prompt of 4 tokens (no 2N-chunk split), run without the ring on
    a ``context=4`` mesh and generate what one device does."""
    from jaxformer.decode.api import generate

    cfg = ModelConfig.from_dict(preset("t5_tiny", **TINY))
    model = build_model(cfg)
    params = model.init(jax.random.key(0))
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12]]
    expect = generate(model, params, prompts, max_new_tokens=4, eos_id=None)
    with mesh_rules(_mesh(context=N)):
        got = generate(model, params, prompts, max_new_tokens=4, eos_id=None)
    np.testing.assert_array_equal(got.tokens, expect.tokens)


@pytest.mark.parametrize("change, match", [
    ({"data.seq_len": 30}, r"data.seq_len=30 is not divisible by 2 × mesh.context=2 = 4"),
    ({"model.attention_impl": "splash"}, r"model.attention_impl='splash' cannot run"),
    ({"model.attention_dropout_rate": 0.1}, r"set model.attention_dropout_rate=0.0"),
])
def test_context_config_refusals(change, match):
    c = base_config()
    c.model.update(preset("gpt_tiny", **TINY))
    c.data.seq_len, c.mesh.context = 32, 2
    for key, value in change.items():
        section, field = key.split(".")
        c[section][field] = value
    with pytest.raises(ValueError, match=match):
        check_context_parallel(c, ModelConfig.from_dict(c.model))


def test_context_needs_the_jit_path():
    from jaxformer.train.config import check_config
    c = base_config()
    c.model.update(preset("gpt_tiny", **TINY))
    c.mesh.context, c.parallel = 2, "shard_map"
    with pytest.raises(ValueError, match=r"mesh.context=2 would be ignored"):
        check_config(c, ModelConfig.from_dict(c.model))


def test_context_shards_activations():
    """The rules split activations' length over ``context``."""
    mesh = _mesh(context=N)
    with mesh_rules(mesh):
        import flax.linen as nn
        x = jax.jit(lambda x: nn.with_logical_constraint(x, ("batch", "act_length", "act_embed")))(
            jnp.zeros((2, LEN, 8)))
    assert x.sharding.is_equivalent_to(NamedSharding(mesh, PartitionSpec(None, "context")), 3)


def test_planner_knows_the_context_axis():
    from jaxformer import plan

    config = plan.preset_config("gpt2_small_bf16", batch=2, seq_len=64, mesh="data=2,context=4")
    assert plan.plan(config, devices=8, compile=False)["mesh"] == {
        "data": 2, "fsdp": 1, "expert": 1, "context": 4, "tensor": 1}
    config = plan.preset_config("gpt2_small_bf16", batch=2, seq_len=60, mesh="data=2,context=4")
    with pytest.raises(ValueError, match=r"data.seq_len=60 is not divisible by 2 × mesh.context"):
        plan.plan(config, devices=8, compile=False)
