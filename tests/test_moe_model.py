"""MoE feed-forward blocks in the three families (issue 62): one expert, k = 1 and unlimited capacity
is the dense model (outputs, gradients, a 20-step loss curve); decoding with a KV cache, scanned and
rematerialised stacks compute the unrolled model's function; the router losses reach the train
step's loss and metrics; the config's MoE fields are validated with one-line errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.config import ModelConfig
from jaxformer.models import build_model
from jaxformer.models.presets import preset
from jaxformer.objectives import bind_objective
from jaxformer.train.optim import default_optimizer_config, make_optimizer
from jaxformer.train.state import TrainState
from jaxformer.train.step import loss_and_metrics, make_train_step
from jaxformer.vocab import SpecialTokens

SMALL = dict(vocab_size=64, d_model=32, num_heads=4, d_ff=48, num_layers=2, max_len=16,
             dropout_rate=0.0, attention_dropout_rate=0.0, ffn_dropout_rate=0.0)
FAMILIES = {"gpt": "gpt_tiny", "bert": "bert_tiny", "t5": "t5_tiny", "llama": "llama_tiny"}
ONE_EXPERT = dict(num_experts=1, experts_per_token=1, capacity_factor=1.0)  # C = L: no drops


def _cfg(name, **kw):
    return ModelConfig.from_dict(preset(FAMILIES[name], **{**SMALL, **kw}))


def _as_one_expert(params):
    """Dense parameters in the MoE layout: every FFN's kernels and biases get a leading expert axis
    of 1 (after a scanned stack's layer axis) and a zero router `[D, 1]`."""
    def ffn(p):
        out = {}
        for name, dense in p.items():
            out[name] = {k: jnp.expand_dims(v, v.ndim - (2 if k == "kernel" else 1))
                         for k, v in dense.items()}
        lead = p["wi"]["kernel"].shape[:-2]
        out["router"] = {"kernel": jnp.zeros((*lead, p["wi"]["kernel"].shape[-2], 1))}
        return out

    def walk(tree):
        return {k: ffn(v) if k == "ffn" else walk(v) if isinstance(v, dict) else v
                for k, v in tree.items()}

    return walk(params)


def _inputs(cfg, length=8):
    tokens = np.random.default_rng(0).integers(3, cfg.vocab_size, (2, length)).astype(np.int32)
    if cfg.family == "encoder_decoder":
        return {"inputs": tokens, "targets_in": tokens[:, :6]}
    return {"tokens": tokens}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_one_expert_is_the_dense_model_outputs_and_gradients(name):
    dense_cfg = _cfg(name)
    moe_cfg = dense_cfg.replace(**ONE_EXPERT)
    dense, moe = build_model(dense_cfg), build_model(moe_cfg)
    params = dense.init(jax.random.key(0))
    moe_params = _as_one_expert(params)
    assert jax.tree.map(jnp.shape, moe_params) == jax.tree.map(jnp.shape, moe.abstract())
    inputs = _inputs(dense_cfg)
    out = lambda m, p: m.apply(p, **inputs)  # noqa: E731
    np.testing.assert_array_equal(out(moe, moe_params), out(dense, params))
    grad = lambda m, p: jax.grad(lambda q: jnp.sum(jnp.sin(out(m, q))))(p)  # noqa: E731
    g_moe, g_dense = grad(moe, moe_params), grad(dense, params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
                 _as_one_expert(g_dense), g_moe)  # the router's gradient: 0 (one expert)


def _run_steps(cfg, params, steps=20):
    model = build_model(cfg)
    tx, schedule = make_optimizer(default_optimizer_config("gpt3", peak_lr=3e-3, warmup_steps=2),
                                  cfg.d_model, steps)
    seq2seq = cfg.family == "encoder_decoder"
    prepare = bind_objective("seq2seq" if seq2seq else "clm", None, SpecialTokens(cfg.vocab_size))
    step = jax.jit(make_train_step(model, tx, prepare, schedule))
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                       rng=jax.random.key_data(jax.random.key(1)))
    rows = np.random.default_rng(2).integers(3, cfg.vocab_size, (4, 16)).astype(np.int32)
    batch = {"inputs": rows, "targets": rows[:, ::-2]} if seq2seq else {"inputs": rows}
    losses, metrics = [], {}
    for _ in range(steps):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    return np.array(losses), metrics


@pytest.mark.parametrize("name", ["llama", "t5"])
def test_one_expert_matches_the_dense_20_step_loss_curve(name):
    dense_cfg = _cfg(name)
    params = build_model(dense_cfg).init(jax.random.key(0))
    dense_losses, _ = _run_steps(dense_cfg, params)
    moe_losses, metrics = _run_steps(dense_cfg.replace(**ONE_EXPERT), _as_one_expert(params))
    assert dense_losses[-1] < dense_losses[0] - 0.5  # it learns
    np.testing.assert_allclose(moe_losses, dense_losses, rtol=2e-5)
    assert float(metrics["moe_dropped"]) == 0.0 and float(metrics["moe_load_0"]) == 1.0


def _moe_decoder(**kw):
    return _cfg("llama", num_experts=4, experts_per_token=2, num_layers=2, **kw)


@pytest.mark.parametrize("dropless", [True, False])
def test_kv_cache_decoding_equals_the_full_forward(dropless):
    cfg = _moe_decoder(moe_dropless=dropless, capacity_factor=2.0)  # C = L·k/2: nothing dropped
    model = build_model(cfg)
    params = model.init(jax.random.key(3))
    tokens = _inputs(cfg)["tokens"]
    full = model.apply(params, tokens)
    cache = model.init_cache(2, tokens.shape[1])
    steps = []
    for t in range(tokens.shape[1]):
        logits, cache = model.apply(params, tokens[:, t:t + 1], cache=cache)
        steps.append(logits)
    np.testing.assert_allclose(jnp.concatenate(steps, 1), full, rtol=1e-4, atol=1e-5)


def test_scanned_and_rematerialised_stacks_equal_the_unrolled_one():
    cfg = _moe_decoder(moe_dropless=True)
    unrolled = build_model(cfg)
    params = unrolled.init(jax.random.key(4))
    layers = [params["decoder"][f"layer_{i}"] for i in range(cfg.num_layers)]
    scanned_params = {**params, "decoder": {"layers": jax.tree.map(lambda *a: jnp.stack(a), *layers)}}
    inputs = _inputs(cfg)
    want, want_stats = unrolled.apply(params, **inputs, router_stats=True)
    for kw in (dict(scan_layers=True), dict(scan_layers=True, remat_policy="full"),
               dict(remat_policy="dots")):
        model = build_model(cfg.replace(**kw))
        p = scanned_params if kw.get("scan_layers") else params
        got, stats = jax.jit(lambda q, model=model: model.apply(q, **inputs, router_stats=True))(p)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5), stats, want_stats)


def test_switch_layout_puts_experts_in_every_other_layer_of_both_stacks():
    cfg = _cfg("t5", num_experts=8, experts_per_token=1, moe_every=2, num_layers=4)
    spec = build_model(cfg).abstract()
    for stack in ("encoder", "decoder"):
        moe = [i for i in range(4) if "router" in spec[stack][f"layer_{i}"]["ffn"]]
        assert moe == [1, 3]
        assert spec[stack]["layer_1"]["ffn"]["wi"]["kernel"].shape == (8, 32, 48)


def test_router_losses_reach_the_loss_and_the_metrics():
    cfg = _moe_decoder(router_aux_loss_weight=0.5, router_z_loss_weight=0.1, capacity_factor=0.5)
    model = build_model(cfg)
    params = model.init(jax.random.key(5))
    tokens = _inputs(cfg)["tokens"]
    prepared = {"model_inputs": {"tokens": tokens}, "targets": tokens,
                "weights": np.ones(tokens.shape, np.float32)}
    sums = loss_and_metrics(model, params, prepared, deterministic=True, dropout_rng=None)
    _, stats = model.apply(params, tokens, router_stats=True)
    w = float(sums["weight"])
    want = 0.5 * float(stats.aux_loss) + 0.1 * float(stats.z_loss)
    np.testing.assert_allclose(float(sums["router_loss"]) / w, want, rtol=1e-6)
    assert 0.0 < float(sums["moe_dropped"]) / w < 1.0  # capacity 0.5 drops some
    np.testing.assert_allclose(sum(float(sums[f"moe_load_{i}"]) for i in range(4)) / w, 1.0,
                               rtol=1e-6)
    # the router's gradient comes from the task loss and from the router losses
    router = lambda p: p["decoder"]["layer_0"]["ffn"]["router"]["kernel"]  # noqa: E731
    g_aux = jax.grad(lambda p: loss_and_metrics(model, p, prepared, deterministic=True,
                                                dropout_rng=None)["router_loss"])(params)
    assert float(jnp.abs(router(g_aux)).sum()) > 0


@pytest.mark.parametrize("kw,match", [
    (dict(num_experts=4, experts_per_token=5), r"model.experts_per_token=5 is invalid"),
    (dict(num_experts=-1), r"model.num_experts=-1 is invalid"),
    (dict(num_experts=4, capacity_factor=0.0), r"model.capacity_factor=0.0 is invalid.*dropless"),
    (dict(num_experts=4, moe_every=2, scan_layers=True), r"model.moe_every=2 is invalid.*scan"),
    (dict(num_experts=4, shared_expert_gate=True), r"model.shared_expert_gate=True is invalid"),
    (dict(num_experts=4, router_jitter_noise=1.5), r"model.router_jitter_noise=1.5 is invalid"),
])
def test_moe_fields_are_validated_with_one_line_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        _cfg("gpt", **kw)


def test_shared_experts_and_their_gate_add_a_dense_ffn():
    cfg = _moe_decoder(num_shared_experts=2, shared_expert_gate=True, moe_d_ff=8,
                       moe_dropless=True)
    ffn = build_model(cfg).abstract()["decoder"]["layer_0"]["ffn"]
    assert ffn["shared"]["wi"]["kernel"].shape == (32, 16)  # 2 shared experts × moe_d_ff
    assert ffn["shared_gate"]["kernel"].shape == (32, 1)
    assert ffn["wi"]["kernel"].shape == (4, 32, 8)


@pytest.mark.parametrize("name,want", [("mixtral_8x7b", 46_702_792_704),
                                       ("switch_base_8", 619_339_008)])
def test_moe_presets_have_the_published_parameter_counts(name, want):
    """Mixtral-8x7B: HF's 46,702,792,704. Switch-Base-8: T5-base v1.0 (222,903,552) plus 7 more
    FFNs (2 · 768 · 3072 each) and a router (768 · 8) in 12 of its 24 layers."""
    cfg = ModelConfig.from_dict(preset(name))
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(build_model(cfg).abstract()))
    assert count == want
    if name == "switch_base_8":
        assert count == 222_903_552 + 12 * (7 * 2 * 768 * 3072 + 768 * 8)


@pytest.mark.parametrize("scan", [False, True])
def test_model_flops_count_the_active_experts(scan):
    """6 · N · tokens with an MoE FFN's experts at k / E of their weights: 8 experts of width F at
    k = 1 cost the dense model's FLOPs plus the router's 6 · D · 8 per token and layer; shared
    experts count in full, once per layer (not as ALBERT's shared block)."""
    from jaxformer.flops import model_flops

    def flops(cfg):
        return model_flops(cfg, build_model(cfg).abstract(), 2, 8, 8)["dense_flops_per_step"]

    dense = _cfg("llama", scan_layers=scan)
    moe = dense.replace(num_experts=8, experts_per_token=1)
    tokens, layers = 2 * 8, dense.num_layers
    assert flops(moe) == flops(dense) + 6 * tokens * layers * dense.d_model * 8
    shared = moe.replace(num_shared_experts=1)
    ffn = 3 * dense.d_model * dense.d_ff  # wi, wi_gate, wo
    assert flops(shared) == flops(moe) + 6 * tokens * layers * ffn
