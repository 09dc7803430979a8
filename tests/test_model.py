"""The one model layer (`jaxformer.models.model.Model`, `jaxformer.models.module.Transformer`)
against the parameter-spec table, Hugging Face PyTorch's logits and its own invariants: fresh
parameters drawn leaf by leaf in the spec's order, the parameter tree and logical axes of every
option that changes the tree (shapes only, `jax.eval_shape`: no compile), scanned vs unrolled
(dropout on) and remat vs none, cached decoding vs the uncached forward, and the NNX class equal
to the pure functions.

Bitwise equality with the former implementation (``jaxformer.nnx``, removed in issue 61) was checked
while both existed; what guards it now: the HLO of `bench/step_hlo.py` / `bench/trainer_step_hlo.py`,
`tests/test_init.py` (fresh values) and `tests/test_legacy_checkpoint.py` (an old run's logits).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxformer.config import ModelConfig
from jaxformer.convert import from_hf
from jaxformer.decode import generate, generate_text
from jaxformer.models.model import Model, build_model, check_params, init_cache, param_shardings
from jaxformer.models.module import Transformer
from jaxformer.models.presets import preset
from jaxformer.models.spec import ParamSpec, model_spec

TINY = dict(vocab_size=64, d_model=16, num_heads=2, d_ff=32, num_layers=2, max_len=16,
            num_classes=3)
GPT, BERT, T5 = (functools.partial(preset, n, **TINY) for n in ("gpt_tiny", "bert_tiny", "t5_tiny"))
DROP = dict(dropout_rate=0.1, attention_dropout_rate=0.1)
CONFIGS = {
    "gpt": GPT(**DROP),
    "gpt_scan": GPT(scan_layers=True, **DROP),
    "bert_nsp": BERT(nsp_head=True, **DROP),
    "bert_nsp_scan": BERT(nsp_head=True, scan_layers=True, **DROP),
    "t5": T5(target_token_dropout_rate=0.1, **DROP),
    "t5_scan": T5(scan_layers=True, **DROP),
    "albert_shared": preset("albert_tiny", **dict(TINY, d_model=32), **DROP),
    "gpt_rope_gqa_gated_rms_nobias": GPT(position="rope", num_kv_heads=1, gated_ffn=True,
                                         activation="silu", norm="rms", use_bias=False),
}
# Every option that changes the parameter tree.
TREES = {
    "gpt": GPT(),
    "gpt_untied_bias": GPT(tie_embeddings=False, lm_head_bias=True),
    "gpt_tied_bias": GPT(lm_head_bias=True),
    "gpt_rope_gqa_gated_rms_nobias": CONFIGS["gpt_rope_gqa_gated_rms_nobias"],
    "gpt_relative_scan": GPT(position="relative", scan_layers=True),
    # Qwen2's q/k/v-only biases, Mistral's sliding window, YaRN-scaled RoPE (tests/test_convert_llama.py)
    "llama_qkv_bias_window_yarn": GPT(
        position="rope", num_kv_heads=1, gated_ffn=True, activation="silu", norm="rms",
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
    "albert_shared_scan": preset("albert_tiny", scan_layers=True, **dict(TINY, d_model=32)),
    "transformer_post_ln_sinusoidal": preset("transformer_tiny", **TINY),
}
# Test-local programs compile at XLA's fast level (~2x quicker; as tests/test_parallel.py).
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def cfg_of(name: str, **kw) -> ModelConfig:
    return ModelConfig.from_dict(dict(CONFIGS[name], **kw))


def inputs(cfg: ModelConfig) -> tuple[tuple, dict]:
    """(args, kwargs) of a packed batch: row 0 two segments, row 1 one plus padding."""
    r = np.random.default_rng(0)
    toks = jnp.asarray(r.integers(7, cfg.vocab_size, (2, 8)), jnp.int32)
    seg = jnp.asarray([[1] * 5 + [2] * 3, [1] * 6 + [0] * 2], jnp.int32)
    pos = jnp.asarray([[0, 1, 2, 3, 4, 0, 1, 2], list(range(8))], jnp.int32)
    if cfg.family == "encoder_decoder":
        tgt = jnp.asarray(r.integers(7, cfg.vocab_size, (2, 8)), jnp.int32)
        return (toks, tgt), dict(inputs_segment_ids=seg, inputs_positions=pos,
                                 targets_segment_ids=seg, targets_positions=pos)
    kw = dict(segment_ids=seg, positions=pos)
    if cfg.family == "encoder":
        kw["token_types"] = (pos >= 2).astype(jnp.int32) * (seg > 0)
    return (toks,), kw


def random_params(cfg: ModelConfig, seed: int = 0) -> dict:
    """Random weights in the model's tree (non-trivial scales and biases, so an ignored one shows)."""
    r = np.random.default_rng(seed)

    def draw(path, s):
        base = 1.0 if "scale" in jax.tree_util.keystr(path) else 0.0
        return jnp.asarray(base + 0.1 * r.normal(size=s.shape), s.dtype)

    return jax.tree_util.tree_map_with_path(draw, Model(cfg).abstract())


def stacked(params: dict, num_layers: int) -> dict:
    """An unrolled decoder stack's ``layer_i`` as the scanned layout's ``layers`` (leading axis)."""
    return dict(params, decoder={"layers": jax.tree.map(
        lambda *xs: jnp.stack(xs), *[params["decoder"][f"layer_{i}"] for i in range(num_layers)])})


def flat(tree, is_leaf=None) -> dict:
    return {"/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in p): v
            for p, v in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)[0]}


def assert_trees_equal(got, want, **tol):
    got, want = flat(got), flat(want)
    assert got.keys() == want.keys()
    for k in want:
        if tol:
            np.testing.assert_allclose(np.asarray(got[k], np.float32),
                                       np.asarray(want[k], np.float32), err_msg=k, **tol)
        else:
            np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]), err_msg=k)


def spec_leaves_in_order(spec: dict, prefix=()):
    """(path, ParamSpec) depth first in insertion order: the reference order, written out."""
    for name, s in spec.items():
        if isinstance(s, ParamSpec):
            yield (*prefix, name), s
        else:
            yield from spec_leaves_in_order(s, (*prefix, name))


# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gpt", "bert_nsp_scan", "t5", "albert_shared"])
def test_init_draws_leaf_i_from_the_nnx_params_stream_in_spec_order(name):
    """Leaf i (insertion order, depth first) is drawn from ``nnx.Rngs(params=key).params()``'s
    i-th key: the values of every fresh run before issue 61. Block specs list ``self_attn`` before
    ``ffn`` (sorted order puts ``ffn`` first), so `jax.tree` order or `split` keys would fail."""
    cfg = cfg_of(name)
    key = jax.random.key(11)
    got = flat(build_model(cfg).init(key))
    rngs = nnx.Rngs(params=key)
    dtype = jnp.dtype(cfg.param_dtype)
    for path, s in spec_leaves_in_order(Model(cfg).spec()):
        want = s.initializer()(rngs.params(), s.shape, dtype)
        np.testing.assert_array_equal(got["/".join(path)], want, err_msg=str(path))
    # raw key data (as the trainer passes it) draws the same; so does the NNX class's seed
    assert_trees_equal(Model(cfg).init(jax.random.key_data(key)), got)
    assert_trees_equal(Transformer(cfg, nnx.Rngs(params=key)).param_dict(), got)


@pytest.mark.parametrize("name", list(TREES))
def test_parameter_tree_and_logical_axes_are_the_spec_tables(name):
    """`Model.init`'s tree (shapes, dtypes), `Model.logical_axes` and `Transformer`'s `nnx.Param`
    state (its ``out_sharding`` metadata) are `model_spec`'s, for every option changing the tree."""
    cfg = ModelConfig.from_dict(TREES[name])
    model = build_model(cfg)
    is_axes = lambda x: isinstance(x, tuple)  # noqa: E731
    want = {k: (s.shape, jnp.dtype(cfg.param_dtype), tuple(s.axes)) for k, s in flat(
        model_spec(cfg), is_leaf=lambda x: isinstance(x, ParamSpec)).items()}
    axes = flat(model.logical_axes(), is_axes)
    params = flat(jax.eval_shape(model.init, jax.random.key(0)))
    assert {k: (v.shape, v.dtype, axes[k]) for k, v in params.items()} == want
    assert flat(model.abstract()).keys() == want.keys()
    t = nnx.eval_shape(lambda: Transformer(cfg, nnx.Rngs(params=0)))  # no dropout stream
    state = nnx.state(t, nnx.Param)
    got = flat(nnx.to_pure_dict(state, extract_fn=lambda v: (
        v.get_value().shape, v.get_value().dtype, tuple(v.get_metadata("out_sharding", None)))), is_axes)
    assert got == want
    # the module holds nothing but these (no dropout stream given; the KV cache comes with init_cache)
    assert flat(nnx.to_pure_dict(nnx.state(t))).keys() == want.keys()


def test_abstract_axes_and_shardings_follow_the_spec():
    cfg = cfg_of("bert_nsp_scan")
    model = build_model(cfg)
    assert model.logical_axes()["encoder"]["layers"]["ffn"]["wi"]["kernel"] == ("layers", "embed", "mlp")
    from jaxformer.parallel.mesh import make_mesh
    from jaxformer.parallel.rules import param_shardings as rules_shardings
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    want = rules_shardings(model.logical_axes(), model.abstract(), mesh)
    assert flat(param_shardings(cfg, mesh)) == flat(want)
    assert any(s.spec != jax.sharding.PartitionSpec() for s in flat(want).values())
    assert model == build_model(cfg) and hash(model) == hash(build_model(cfg))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt_relative_scan", "t5"])
def test_sharded_init_gives_the_rules_shardings(name):
    """On a 2×2×2 (data, fsdp, tensor) mesh of 8 simulated devices, fresh parameters are placed by
    the logical rules on the spec's names. One layer per stack (a second has the same rules)."""
    from jaxformer.parallel.mesh import make_mesh
    from jaxformer.train.state import create_params

    cfg = ModelConfig.from_dict(dict(TREES[name], num_layers=1))
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    want = param_shardings(cfg, mesh)
    created = create_params(build_model(cfg), want, 0)
    got = jax.tree.map(lambda x: x.sharding, created)
    assert {k: (s.mesh, s.spec) for k, s in flat(got).items()} == {
        k: (s.mesh, s.spec) for k, s in flat(want).items()}
    # the values of one device: seed 0's init key is fold_in(key(0), 0) (`train.state._init_key`)
    assert_trees_equal(created, build_model(cfg).init(jax.random.fold_in(jax.random.key(0), 0)))


def test_check_params_names_the_missing_and_the_fix():
    cfg = cfg_of("gpt")
    params = build_model(cfg).init(jax.random.key(0))
    check_params(cfg, params)
    with pytest.raises(ValueError, match=r"stacks are unrolled .* set model.scan_layers=False"):
        check_params(cfg.replace(scan_layers=True), params)
    with pytest.raises(ValueError, match=r"stacks are unrolled .* set model.scan_layers=False"):
        Transformer(cfg.replace(scan_layers=True), params=params)


def _loss(out):
    return sum(jnp.sum(jnp.sin(o.astype(jnp.float32))) for o in jax.tree.leaves(out))


@pytest.mark.slow
@pytest.mark.parametrize("name,overrides", [("gpt", dict(scan_layers=True, remat_policy="dots")),
                                            ("t5", dict(remat_policy="full"))])
def test_values_and_gradients_with_scan_and_remat_equal_the_plain_model(name, overrides):
    """Jitted, with scanned / remat stacks: outputs and gradients (dropout on, same key) equal the
    unrolled model's without remat."""
    cfg = cfg_of(name)
    plain_params = random_params(cfg)
    params = stacked(plain_params, cfg.num_layers) if overrides.get("scan_layers") else plain_params
    args, kw = inputs(cfg)
    key = jax.random.key(5)

    def value_and_grad(model, p):
        fn = jax.value_and_grad(lambda p: (_loss(o := model.apply(p, *args, rng=key, **kw)), o),
                                has_aux=True)
        return jax.jit(fn, compiler_options=FAST_COMPILE)(p)

    (v, out), g = value_and_grad(build_model(cfg.replace(**overrides)), params)
    (v_ref, out_ref), g_ref = value_and_grad(build_model(cfg), plain_params)
    np.testing.assert_allclose(v, v_ref, rtol=1e-5)
    assert_trees_equal(out, out_ref, atol=1e-5, rtol=1e-5)
    if "layers" in g["decoder"]:
        g_ref = stacked(g_ref, cfg.num_layers)
    assert_trees_equal(g, g_ref, atol=1e-5, rtol=1e-4)


def test_scanned_equals_unrolled_with_dropout_too():
    """Layer i draws split(stack key, L)[i] in both layouts: equal with dropout on or off."""
    cfg = cfg_of("gpt")
    params = random_params(cfg)
    args, kw = inputs(cfg)
    unrolled, scanned = build_model(cfg), build_model(cfg.replace(scan_layers=True))
    key = jax.random.key(7)
    for rng in (None, key):
        a = unrolled.apply(params, *args, rng=rng, **kw)
        b = scanned.apply(stacked(params, cfg.num_layers), *args, rng=rng, **kw)
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    assert not np.allclose(unrolled.apply(params, *args, **kw),
                           unrolled.apply(params, *args, rng=key, **kw))  # dropout ran


# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gpt", pytest.param("t5_scan", marks=pytest.mark.slow)])
def test_cached_decoding_equals_the_uncached_forward(name):
    """A 3-token prefill then one token per call (`Model.apply(..., cache=c)` → (logits, c')):
    the logits of the uncached forward on the whole sequence; an overflow is an error."""
    cfg = cfg_of(name)
    model = build_model(cfg)
    params = model.init(jax.random.key(2))
    r = np.random.default_rng(1)
    tgt = jnp.asarray(r.integers(7, cfg.vocab_size, (2, 6)), jnp.int32)
    t5 = cfg.family == "encoder_decoder"
    src = jnp.asarray(r.integers(7, cfg.vocab_size, (2, 5)), jnp.int32)
    cache = init_cache(cfg, 2, 6, source_length=5 if t5 else None)
    assert_trees_equal(cache, model.init_cache(2, 6, 5 if t5 else None))
    full = model.apply(params, src, tgt) if t5 else model.apply(params, tgt)
    enc = model.encode(params, src) if t5 else None
    steps = []
    for lo, hi in [(0, 3), (3, 4), (4, 5), (5, 6)]:
        t = tgt[:, lo:hi]
        if t5:
            logits, cache = model.apply(params, None, t, encoder_out=enc if lo == 0 else None,
                                        cache=cache)
        else:
            logits, cache = model.apply(params, t, cache=cache)
        steps.append(logits)
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=2e-5, rtol=2e-5)
    assert int(cache["index"]) == 6
    with pytest.raises(ValueError, match="overflows the cache of 6 slots"):
        model.apply(params, None, tgt[:, :1], cache=cache) if t5 else model.apply(
            params, tgt[:, :1], cache=cache)


@pytest.mark.parametrize("name", ["bert_nsp", pytest.param("t5_scan", marks=pytest.mark.slow)])
def test_transformer_module_equals_the_pure_model(name):
    """``Transformer(cfg, params=p)(x)`` is ``Model.apply(p, x)`` (dropout on, same key, too;
    train()/eval()); its `nnx.Param` state is ``p``; split/merge round-trips; seeded by
    ``nnx.Rngs(0)`` it holds ``Model.init(key(0))``."""
    cfg = cfg_of(name)
    model = build_model(cfg)
    params = model.init(jax.random.key(3))
    args, kw = inputs(cfg)
    t = Transformer(cfg, params=params)
    clean = model.apply(params, *args, **kw)
    assert_trees_equal(t(*args, **kw), clean)
    key = jax.random.key(4)
    dropped = model.apply(params, *args, rng=key, **kw)
    assert_trees_equal(t(*args, **kw, deterministic=False, rngs=key), dropped)
    t.train()
    assert_trees_equal(t(*args, **kw, rngs=key), dropped)
    assert_trees_equal(t(*args, **kw, deterministic=True), clean)
    t.eval()
    assert_trees_equal(t.param_dict(), params)
    assert_trees_equal(nnx.to_pure_dict(nnx.state(t, nnx.Param)), params)
    graphdef, state = nnx.split(t)  # split / merge round trip
    assert_trees_equal(nnx.merge(graphdef, state)(*args, **kw), clean)
    keyless = Transformer(cfg, nnx.Rngs(params=0), params=params)  # no dropout stream
    with pytest.raises(ValueError, match="dropout is on .* but no key: pass rngs="):
        keyless(*args, **kw, deterministic=False)
    assert_trees_equal(Transformer(cfg, nnx.Rngs(0)).param_dict(), model.init(jax.random.key(0)))


def test_transformer_dropout_stream_draws_fresh_keys():
    """A module built with a dropout stream draws a new key per call (an `nnx.Rngs` passed to the
    call keys it as ``Model.apply(rng=that stream's next key)``)."""
    cfg = cfg_of("gpt")
    params = random_params(cfg)
    args, kw = inputs(cfg)
    own = Transformer(cfg, nnx.Rngs(params=0, dropout=5), params=params, deterministic=False)
    clean = build_model(cfg).apply(params, *args, **kw)
    first, second = own(*args, **kw), own(*args, **kw)
    assert not np.allclose(first, second) and not np.allclose(first, clean)
    np.testing.assert_array_equal(own(*args, **kw, rngs=nnx.Rngs(dropout=3)),
                                  build_model(cfg).apply(params, *args, rng=nnx.Rngs(dropout=3).dropout(),
                                                         **kw))


@pytest.mark.parametrize("name,overrides", [
    pytest.param("gpt_rope_gqa_gated_rms_nobias", {}, marks=pytest.mark.slow),
    ("gpt", dict(scan_layers=True)), ("t5", dict(scan_layers=True))])
def test_transformer_kv_cache_as_nnx_cache_state(name, overrides):
    """``init_cache`` + calls with ``decode=True`` (a 3-token prefill, then one token per call, the
    cache as `nnx.Cache` state) give the logits of the uncached forward on the whole sequence."""
    cfg = cfg_of(name, **overrides)
    t = Transformer(cfg, params=random_params(cfg))
    r = np.random.default_rng(1)
    tgt = jnp.asarray(r.integers(7, cfg.vocab_size, (2, 6)), jnp.int32)
    if cfg.family == "encoder_decoder":
        src = jnp.asarray(r.integers(7, cfg.vocab_size, (2, 5)), jnp.int32)
        full, enc = t(src, tgt), t.encode(src)
        t.init_cache(2, 6, source_length=5)
        call = lambda x, first: t(None, x, encoder_out=enc if first else None, decode=True)  # noqa: E731
    else:
        full = t(tgt)
        with pytest.raises(ValueError, match=r"needs the model's KV cache: call model.init_cache"):
            t(tgt[:, :1], decode=True)
        t.init_cache(2, 6)
        call = lambda x, first: t(x, decode=True)  # noqa: E731
    assert set(nnx.to_pure_dict(nnx.state(t, nnx.Cache))["cache"]) == {"decoder", "index", "positions"}
    steps = [call(tgt[:, :3], True)] + [call(tgt[:, i:i + 1], False) for i in range(3, 6)]
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=2e-5, rtol=2e-5)
    assert int(t.cache_dict()["index"]) == 6
    with pytest.raises(ValueError, match="overflows the cache of 6 slots"):
        call(tgt[:, :1], False)


PROMPTS = [[5, 6, 7], [9], [11, 12, 13, 14, 15]]


def test_greedy_generation_equals_argmax_of_the_transformer_forward():
    """The cached decode program on the NNX class vs re-running it on the whole prefix for every
    token (no cache)."""
    cfg = cfg_of("gpt_rope_gqa_gated_rms_nobias")
    t = Transformer(cfg, params=random_params(cfg))
    got = generate(t, PROMPTS[:1], max_new_tokens=6, eos_id=None).sequences()[0]
    seq = np.zeros((1, 9), np.int32)  # one shape for every step: causal, so the tail is unread
    n = len(PROMPTS[0])
    seq[0, :n] = PROMPTS[0]
    for i in range(n, 9):
        seq[0, i] = int(jnp.argmax(t(seq)[0, i - 1]))
    assert got == seq[0, n:].tolist()


def test_generate_text_with_a_transformer_equals_the_pure_model():
    from types import SimpleNamespace

    cfg = cfg_of("gpt", dropout_rate=0.0, attention_dropout_rate=0.0)
    params = random_params(cfg)
    tok = SimpleNamespace(encode=lambda s: [7 + ord(c) % 50 for c in s],
                          decode=lambda ids: ",".join(map(str, ids)),
                          special=SimpleNamespace(eos_id=1, pad_id=0, bos_id=2))
    got = generate_text(Transformer(cfg, params=params), tok, ["ab", "xyz"], max_new_tokens=4)
    want = generate_text(build_model(cfg), params, tok, ["ab", "xyz"], max_new_tokens=4)
    assert got == want and all(got)


@pytest.mark.parametrize("name", ["gpt2", "t5_v1_0"])
def test_from_hf_logits_equal_pytorch(name):
    """Golden tiny Hugging Face GPT-2 and T5 models (PyTorch logits, eager attention; `tests/golden.py`)."""
    from golden import golden_dir, reference, rel_err

    ref = reference(name)
    model = from_hf(golden_dir(name))
    assert isinstance(model, Transformer)
    if name == "gpt2":
        got = model(ref["input_ids"])
    else:
        got = model(ref["input_ids"], ref["decoder_input_ids"], inputs_segment_ids=ref["attention_mask"])
    assert rel_err(got, ref["logits"]) < 1e-4, name
