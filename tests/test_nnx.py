"""The NNX models against the parameter-spec table, Hugging Face PyTorch, flax's Linen bridge and
their own invariants (scanned vs unrolled, remat vs none, cached decoding vs the uncached forward).

Parameter trees and logical axes are compared for every option that changes the tree (shapes only,
`jax.eval_shape`: no compile).
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxformer import nnx as jnnx
from jaxformer.config import ModelConfig
from jaxformer.convert import from_hf
from jaxformer.decode import generate, generate_text
from jaxformer.layers.params import ParamSpec, model_spec
from jaxformer.models import build_model
from jaxformer.models.presets import preset

TINY = dict(vocab_size=64, d_model=32, num_heads=4, d_ff=64, num_layers=2, max_len=32,
            num_classes=3)
GPT, BERT, T5 = (functools.partial(preset, n, **TINY) for n in ("gpt_tiny", "bert_tiny", "t5_tiny"))
# Every option that changes the parameter tree.
TREES = {
    "gpt": GPT(),
    "gpt_untied_bias": GPT(tie_embeddings=False, lm_head_bias=True),
    "gpt_tied_bias": GPT(lm_head_bias=True),
    "gpt_rope_gqa_gated_rms_nobias": GPT(position="rope", num_kv_heads=2, gated_ffn=True,
                                         activation="silu", norm="rms", use_bias=False),
    "gpt_relative_scan": GPT(position="relative", scan_layers=True),
    # Qwen2's q/k/v-only biases, Mistral's sliding window, YaRN-scaled RoPE (tests/test_convert_llama.py)
    "llama_qkv_bias_window_yarn": GPT(
        position="rope", num_kv_heads=2, gated_ffn=True, activation="silu", norm="rms",
        use_bias=False, qkv_bias=True, tie_embeddings=False, sliding_window=3, rope_scaling="yarn",
        rope_scaling_factor=4.0, rope_original_max_len=8),
    "gpt_classify_pooler": GPT(head="classify", pooling="last", pooler=True),
    "gpt_token_classify": GPT(head="token_classify"),
    "gpt_none": GPT(head="none"),
    "gpt_bf16_params": GPT(param_dtype="bfloat16"),
    "bert_mlm": BERT(),
    "bert_nsp_scan": BERT(nsp_head=True, scan_layers=True),
    "bert_untied_no_transform": BERT(tie_embeddings=False, mlm_transform=False),
    "bert_tied_no_bias_no_transform": BERT(lm_head_bias=False, mlm_transform=False),
    "bert_classify": BERT(head="classify"),
    "bert_classify_no_pooler": BERT(head="classify", pooler=False, pooling="mean"),
    "bert_token_classify": BERT(head="token_classify"),
    "bert_none_pooler": BERT(head="none"),
    "bert_none_no_pooler": BERT(head="none", pooler=False),
    "t5": T5(),
    "t5_scan_untied_gated_3_1": T5(scan_layers=True, tie_embeddings=False,
                                   rescale_tied_logits=False, gated_ffn=True, activation="gelu",
                                   num_encoder_layers=3, num_decoder_layers=1),
    "transformer_post_ln_sinusoidal": preset("transformer_tiny", **TINY),
}


# Test-local programs compile at XLA's fast level (~2x quicker; as tests/test_parallel.py).
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def cfg_of(name: str, **kw) -> ModelConfig:
    return ModelConfig.from_dict(dict(TREES[name], **kw))


def batch(cfg: ModelConfig, seed: int = 0) -> tuple[tuple, dict]:
    """(args, kwargs) of a packed batch: row 0 holds two segments, row 1 one plus padding."""
    r = np.random.default_rng(seed)
    toks = r.integers(7, cfg.vocab_size, (2, 8)).astype(np.int32)
    seg = np.array([[1] * 5 + [2] * 3, [1] * 6 + [0] * 2], np.int32)
    pos = np.array([[0, 1, 2, 3, 4, 0, 1, 2], list(range(8))], np.int32)
    if cfg.family == "encoder_decoder":
        tgt = r.integers(7, cfg.vocab_size, (2, 8)).astype(np.int32)
        return (toks, tgt), dict(inputs_segment_ids=seg, inputs_positions=pos,
                                 targets_segment_ids=seg, targets_positions=pos)
    kw = dict(segment_ids=seg, positions=pos)
    if cfg.family == "encoder":
        kw["token_types"] = (pos >= 2).astype(np.int32) * (seg > 0)
    return (toks,), kw


def boxed(cfg: ModelConfig):
    """Abstract boxed params of the functional model's ``init`` (shapes, dtypes, logical names),
    nothing computed."""
    return jax.eval_shape(lambda: jnnx.FunctionalModel(cfg).init(jax.random.key(0)))["params"]


def random_params(cfg: ModelConfig, seed: int = 0) -> dict:
    """Random weights in the model's tree (non-trivial scales and biases, so an ignored one shows)."""
    r = np.random.default_rng(seed)

    def draw(path, s):
        base = 1.0 if "scale" in jax.tree_util.keystr(path) else 0.0
        return jnp.asarray(base + 0.1 * r.normal(size=s.shape), s.dtype)

    return jax.tree_util.tree_map_with_path(draw, nn.unbox(boxed(cfg)))


def flat(tree, is_leaf=None) -> dict:
    return {jax.tree_util.keystr(p): v
            for p, v in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)[0]}


def assert_trees_equal(got, want, **tol):
    got, want = flat(got), flat(want)
    assert got.keys() == want.keys()
    for k in want:
        if tol:
            np.testing.assert_allclose(np.asarray(got[k], np.float32),
                                       np.asarray(want[k], np.float32), err_msg=k, **tol)
        else:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)


# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(TREES))
def test_parameter_tree_and_logical_axes_are_the_spec_tables(name):
    """The NNX state, its logical axes and the functional ``init``'s boxes are `model_spec`'s."""
    cfg = cfg_of(name)
    model = jnnx.abstract_model(cfg)
    is_axes = lambda x: isinstance(x, tuple)
    want = {k: (s.shape, jnp.dtype(cfg.param_dtype), tuple(s.axes)) for k, s in flat(
        model_spec(cfg), is_leaf=lambda x: isinstance(x, ParamSpec)).items()}
    axes = flat(jnnx.logical_axes(model), is_axes)
    params = flat(jnnx.param_dict(model))
    got = {k: (v.shape, v.dtype, axes[k]) for k, v in params.items()}
    assert got == want
    # the functional model's init boxes each parameter with the same names
    init_axes = jax.tree.map(tuple, nn.get_partition_spec(boxed(cfg)),
                             is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    assert flat(init_axes, is_axes) == {k: w[2] for k, w in want.items()}
    # the NNX state holds nothing but these parameters (the KV cache comes with init_cache)
    assert flat(jnnx.param_dict(model)).keys() == flat(nnx.to_pure_dict(nnx.state(model))).keys()


BRIDGED = ["gpt_rope_gqa_gated_rms_nobias", "bert_nsp_scan", "t5"]


@pytest.mark.parametrize("name", BRIDGED)
def test_linen_bridge_holds_the_same_tree_and_computes_the_same(name):
    """`jnnx.linen_model` (flax.nnx.bridge): its init has the parameter tree, and its apply on a
    params tree equals the NNX model's call (bit for bit: the same operations)."""
    cfg = cfg_of(name)
    params, (args, kw) = random_params(cfg), batch(cfg)
    linen = jnnx.linen_model(cfg)
    init = jax.eval_shape(lambda: linen.init(jax.random.key(0), *args, **kw))
    assert set(init) == {"params"}
    assert {k: v.shape for k, v in flat(nn.unbox(init["params"])).items()} == {
        k: v.shape for k, v in flat(params).items()}
    got = linen.apply({"params": params}, *args, **kw)
    assert_trees_equal(got, jnnx.from_params(cfg, params)(*args, **kw))
    assert np.all(np.isfinite(jax.tree.leaves(got)[0]))


def _loss(out):
    return sum(jnp.sum(jnp.sin(o.astype(jnp.float32))) for o in jax.tree.leaves(out))


@pytest.mark.slow
@pytest.mark.parametrize("name,overrides", [("gpt", dict(scan_layers=True, remat_policy="dots")),
                                            ("t5", dict(remat_policy="full"))])
def test_jitted_values_and_gradients_with_scan_and_remat_equal_the_plain_model(name, overrides):
    """Under jit (split/merge: a pure function of the parameter dict) with scanned / remat stacks,
    outputs and gradients equal the unrolled model's without remat."""
    cfg = cfg_of(name)
    params, (args, kw) = random_params(cfg.replace(**overrides)), batch(cfg)
    model = jnnx.from_params(cfg.replace(**overrides), params)
    graphdef, state = nnx.split(model)

    @functools.partial(jax.jit, compiler_options=FAST_COMPILE)
    def nnx_loss(state):
        out = nnx.merge(graphdef, state)(*args, **kw)
        return _loss(out), out

    plain_params = params
    if cfg.replace(**overrides).scan_layers:  # the plain reference is unrolled
        plain_params = dict(params, decoder={f"layer_{i}": jax.tree.map(
            lambda x, i=i: x[i], params["decoder"]["layers"]) for i in range(cfg.num_layers)})
    plain = jnnx.FunctionalModel(cfg)
    (v, out), g = jax.value_and_grad(nnx_loss, has_aux=True)(state)
    (v_ref, out_ref), g_ref = jax.jit(jax.value_and_grad(
        lambda p: (_loss(o := plain.apply({"params": p}, *args, **kw)), o), has_aux=True),
        compiler_options=FAST_COMPILE)(plain_params)
    np.testing.assert_allclose(v, v_ref, rtol=1e-5)
    assert_trees_equal(out, out_ref, atol=1e-5, rtol=1e-5)
    if "layers" in g["decoder"]:
        g_ref = dict(g_ref, decoder={"layers": jax.tree.map(
            lambda *xs: jnp.stack(xs), *[g_ref["decoder"][f"layer_{i}"] for i in range(2)])})
    assert_trees_equal(nnx.to_pure_dict(g), g_ref, atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_scanned_equals_unrolled_with_dropout_too():
    """Layer i draws split(stack key, L)[i] in both layouts: equal with dropout on or off."""
    cfg = cfg_of("gpt", ffn_dropout_rate=0.1)
    params, (args, kw) = random_params(cfg), batch(cfg)
    stacked = dict(params, decoder={"layers": jax.tree.map(
        lambda *xs: jnp.stack(xs), *[params["decoder"][f"layer_{i}"] for i in range(2)])})
    unrolled = jnnx.from_params(cfg, params)
    scanned = jnnx.from_params(cfg.replace(scan_layers=True), stacked)
    key = jax.random.key(7)
    for det in (True, False):
        a = unrolled(*args, **kw, deterministic=det, rngs=key)
        b = scanned(*args, **kw, deterministic=det, rngs=key)
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_dropout_keys_train_eval_and_errors():
    cfg = cfg_of("bert_classify")
    params, (args, kw) = random_params(cfg), batch(cfg)
    model = jnnx.from_params(cfg, params)  # no dropout stream
    clean = model(*args, **kw)
    k1, k2 = jax.random.key(1), jax.random.key(2)
    drop = lambda key, **o: model(*args, **kw, deterministic=False, rngs=key, **o)
    np.testing.assert_array_equal(drop(k1), drop(k1))
    assert not np.allclose(drop(k1), drop(k2)) and not np.allclose(drop(k1), clean)
    with pytest.raises(ValueError, match="dropout is on .* but no key: pass rngs="):
        model(*args, **kw, deterministic=False)
    model.train()
    np.testing.assert_array_equal(model(*args, **kw, rngs=k1), drop(k1))
    np.testing.assert_array_equal(model(*args, **kw, deterministic=True), clean)
    model.eval()
    np.testing.assert_array_equal(model(*args, **kw), clean)
    # a model built with a dropout stream draws fresh keys from it call after call
    own = jnnx.build_model(cfg, nnx.Rngs(params=0, dropout=5), deterministic=False)
    nnx.update(own, nnx.state(model))
    first, second = own(*args, **kw), own(*args, **kw)
    assert not np.allclose(first, second) and not np.allclose(first, clean)
    np.testing.assert_array_equal(own(*args, **kw, rngs=nnx.Rngs(dropout=3)),
                                  drop(nnx.Rngs(dropout=3)))


def test_parameters_convert_both_ways():
    cfg = cfg_of("t5")
    params, (args, kw) = random_params(cfg), batch(cfg)
    model = jnnx.from_params(cfg, {"params": params})
    assert_trees_equal(jnnx.param_dict(model), params)
    linen, back = jnnx.to_linen(model)
    assert_trees_equal(back, params)
    np.testing.assert_array_equal(linen.apply({"params": back}, *args, **kw), model(*args, **kw))
    graphdef, state = nnx.split(model)  # split / merge round trip
    np.testing.assert_array_equal(nnx.merge(graphdef, state)(*args, **kw), model(*args, **kw))
    # a fresh model has the same tree
    fresh = jnnx.param_dict(jnnx.build_model(cfg, nnx.Rngs(0)))
    assert {k: v.shape for k, v in flat(fresh).items()} == {k: v.shape for k, v in flat(params).items()}
    with pytest.raises(ValueError, match=r"stacks are unrolled .* set model.scan_layers=False"):
        jnnx.from_params(cfg.replace(scan_layers=True), params)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt_relative_scan", "t5"])
def test_sharded_init_gives_the_rules_shardings(name):
    """On a 2×2×2 (data, fsdp, tensor) mesh of 8 simulated devices. One layer per stack: a second
    one has the same parameters and rules (and doubled the two init compiles, ~9 s of the test)."""
    from jaxformer.parallel.mesh import make_mesh
    from jaxformer.parallel.rules import param_shardings
    from jaxformer.train.state import create_params

    cfg = cfg_of(name, num_layers=1)
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    model = build_model(cfg)
    want = param_shardings(model.logical_axes(), model.abstract(), mesh)  # the rules on the spec's names
    got = jnnx.param_shardings(jnnx.abstract_model(cfg), mesh)
    assert flat(got) == flat(want)
    assert any(s.spec != jax.sharding.PartitionSpec() for s in flat(want).values())
    created = jax.tree.map(lambda x: x.sharding, create_params(build_model(cfg), want, 0))
    model = jnnx.build_sharded(cfg, mesh, jax.random.key(0))
    got = jax.tree.map(lambda x: x.sharding, jnnx.param_dict(model))
    assert {k: (s.mesh, s.spec) for k, s in flat(got).items()} == {
        k: (s.mesh, s.spec) for k, s in flat(created).items()}


# ------------------------------------------------------------------------------------------------
PROMPTS = [[5, 6, 7], [9], [11, 12, 13, 14, 15]]


# Slow tier: the RoPE / GQA model (~7 s of CPU), whose cached logits are also
# tests/test_decode.py::test_cached_steps_match_full_forward's (the same NNX model, through
# build_model); the NNX cache API stays checked on the GPT and T5 cases.
@pytest.mark.parametrize("name,overrides", [
    pytest.param("gpt_rope_gqa_gated_rms_nobias", {}, marks=pytest.mark.slow),
    ("gpt", dict(scan_layers=True)), ("t5", dict(scan_layers=True))])
def test_nnx_kv_cache_steps_equal_the_uncached_forward(name, overrides):
    """``init_cache`` + calls with ``decode=True`` (a 3-token prefill, then one token per call, the
    cache as `nnx.Cache` state) give the logits of the uncached forward on the whole sequence."""
    cfg = cfg_of(name, **overrides)
    model = jnnx.from_params(cfg, random_params(cfg))
    r = np.random.default_rng(1)
    tgt = r.integers(7, cfg.vocab_size, (2, 6)).astype(np.int32)
    if cfg.family == "encoder_decoder":
        src = r.integers(7, cfg.vocab_size, (2, 5)).astype(np.int32)
        full = model(src, tgt)
        enc = model.encode(src)
        model.init_cache(2, 6, source_length=5)
        call = lambda t, first: model.decode(enc if first else None, t, decode=True)
    else:
        full = model(tgt)
        model.init_cache(2, 6)
        call = lambda t, first: model(t, decode=True)
    assert isinstance(model.cache, jnnx.DecodeCache)
    cache = nnx.to_pure_dict(nnx.state(model, nnx.Cache))["cache"]
    assert set(cache) == {"decoder", "index", "positions"}
    steps = [call(tgt[:, :3], True)] + [call(tgt[:, i:i + 1], False) for i in range(3, 6)]
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=2e-5, rtol=2e-5)
    assert int(model.cache.index.get_value()) == 6
    with pytest.raises(ValueError, match="overflows the cache of 6 slots"):
        call(tgt[:, :1], False)
    model.set_cache(None)
    with pytest.raises(ValueError, match=r"needs the model's KV cache: call model.init_cache"):
        call(tgt[:, :1], True)


def test_greedy_generation_equals_argmax_of_the_nnx_forward():
    """The cached decode program on the NNX model vs re-running the NNX model on the
    whole prefix for every token (no cache)."""
    cfg = cfg_of("gpt_rope_gqa_gated_rms_nobias")
    model = jnnx.from_params(cfg, random_params(cfg))
    got = generate(model, PROMPTS[:1], max_new_tokens=6, eos_id=None).sequences()[0]
    seq = np.zeros((1, 9), np.int32)  # one shape for every step: causal, so the tail is unread
    n = len(PROMPTS[0])
    seq[0, :n] = PROMPTS[0]
    for i in range(n, 9):
        seq[0, i] = int(jnp.argmax(model(seq)[0, i - 1]))
    assert got == seq[0, n:].tolist()


def test_generate_text_with_an_nnx_model():
    from types import SimpleNamespace

    cfg = cfg_of("gpt")
    params = random_params(cfg)
    tok = SimpleNamespace(encode=lambda s: [7 + ord(c) % 50 for c in s],
                          decode=lambda ids: ",".join(map(str, ids)),
                          special=SimpleNamespace(eos_id=1, pad_id=0, bos_id=2))
    got = generate_text(jnnx.from_params(cfg, params), tok, ["ab", "xyz"], max_new_tokens=4)
    want = generate_text(build_model(cfg), params, tok, ["ab", "xyz"], max_new_tokens=4)
    assert got == want and all(got)


# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gpt2", "t5_v1_0"])
def test_from_hf_logits_equal_pytorch(name):
    """Golden tiny Hugging Face GPT-2 and T5 models (PyTorch logits, eager attention; `tests/golden.py`)."""
    from golden import golden_dir, reference, rel_err

    ref = reference(name)
    model = from_hf(golden_dir(name))
    assert isinstance(model, nnx.Module)
    if name == "gpt2":
        got = model(ref["input_ids"])
    else:
        got = model(ref["input_ids"], ref["decoder_input_ids"], inputs_segment_ids=ref["attention_mask"])
    assert rel_err(got, ref["logits"]) < 1e-4, name
