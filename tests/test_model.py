"""The one model layer (`jaxformer.models.model.Model`, `jaxformer.models.module.Transformer`):
fresh parameters drawn leaf by leaf in the spec's order, the NNX class equal to the pure functions,
and — while the former implementation (`jaxformer.nnx`, `jaxformer.models.build_model`) is still
there — bitwise equal to it: initial values, forward outputs with dropout on, gradients, cached
decoding and the lowered programs.
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
from jaxformer.layers.params import ParamSpec
from jaxformer.models.model import Model, build_model, check_params, init_cache, param_shardings
from jaxformer.models.module import Transformer
from jaxformer.models.presets import preset
from jaxformer.nnx import FunctionalModel as old_build_model

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
    "albert_shared_scan": preset("albert_tiny", scan_layers=True, **dict(TINY, d_model=32), **DROP),
}


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


def flat(tree) -> dict:
    return {"/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in p): v
            for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def assert_bitwise(got, want):
    got, want = flat(got), flat(want)
    assert got.keys() == want.keys()
    for k in want:
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
    # and equal, leaf for leaf, to the former NNX model's init (raw key data as the trainer passes)
    assert_bitwise(Model(cfg).init(jax.random.key_data(key)),
                   nn.unbox(old_build_model(cfg).init(key)["params"]))


def test_abstract_logical_axes_and_shardings_follow_the_spec():
    cfg = cfg_of("bert_nsp_scan")
    model = build_model(cfg)
    params = jax.eval_shape(model.init, jax.random.key(0))
    assert jax.tree.map(lambda a: (a.shape, a.dtype), model.abstract()) == \
        jax.tree.map(lambda a: (a.shape, a.dtype), params)
    boxed = jax.eval_shape(lambda: old_build_model(cfg).init(jax.random.key(0)))["params"]
    old_axes = jax.tree.map(lambda b: tuple(b.names), boxed,
                            is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    assert model.logical_axes() == old_axes
    assert model.logical_axes()["encoder"]["layers"]["ffn"]["wi"]["kernel"] == ("layers", "embed", "mlp")
    from jaxformer.parallel.mesh import make_mesh
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    want = jnnx.param_shardings(jnnx.abstract_model(cfg), mesh)  # the former NNX model's
    assert flat(param_shardings(cfg, mesh)) == flat(want)
    assert any(s.spec != jax.sharding.PartitionSpec() for s in flat(want).values())
    assert model == build_model(cfg) and hash(model) == hash(build_model(cfg))


def test_check_params_names_the_missing_and_the_fix():
    cfg = cfg_of("gpt")
    params = build_model(cfg).init(jax.random.key(0))
    check_params(cfg, params)
    with pytest.raises(ValueError, match=r"stacks are unrolled .* set model.scan_layers=False"):
        check_params(cfg.replace(scan_layers=True), params)


# Executed (not only lowered, see the last test) for one config per family and stack layout; the
# others in the slow tier (~25 s each on a loaded 2-core box).
EXECUTED = ["gpt", "t5_scan", "albert_shared", *(pytest.param(n, marks=pytest.mark.slow) for n in (
    "gpt_scan", "bert_nsp", "bert_nsp_scan", "t5", "albert_shared_scan"))]
FAST_COMPILE = {"xla_backend_optimization_level": 0}  # test-local programs (as tests/test_nnx.py)


@pytest.mark.parametrize("name", EXECUTED)
def test_forward_and_gradients_equal_the_former_model_bitwise_with_dropout(name):
    """`Model.apply(p, ..., rng=k)` against the former ``apply({"params": p}, ...,
    deterministic=False, rngs={"dropout": k})`` (same key folding: part p draws
    fold_in(k, crc32(p))): outputs with and without dropout and parameter gradients, bitwise."""
    cfg = cfg_of(name)
    new, old = build_model(cfg), old_build_model(cfg)
    params = new.init(jax.random.key(1))
    args, kw = inputs(cfg)

    def run(apply):
        def loss(p, rng):
            return sum(jnp.sum(jnp.sin(o)) for o in jax.tree.leaves(apply(p, rng)))
        return jax.jit(lambda p, k: (apply(p, None), apply(p, k), jax.grad(loss)(p, k)),
                       compiler_options=FAST_COMPILE)(params, jax.random.key(5))

    got = run(lambda p, r: new.apply(p, *args, rng=r, **kw))
    assert_bitwise(got, run(lambda p, r: old.apply({"params": p}, *args, deterministic=r is None,
                                                   rngs=None if r is None else {"dropout": r}, **kw)))
    assert not np.allclose(jax.tree.leaves(got[0])[0], jax.tree.leaves(got[1])[0])  # dropout ran


@pytest.mark.parametrize("name", ["gpt", pytest.param("t5_scan", marks=pytest.mark.slow)])
def test_cached_decoding_equals_the_former_model_and_the_uncached_forward(name):
    """A 3-token prefill then one token per call: logits and caches bitwise equal to the former
    model's ``apply(..., decode=True, mutable=["cache"])``, logits close to the uncached forward."""
    cfg = cfg_of(name)
    new, old = build_model(cfg), old_build_model(cfg)
    params = new.init(jax.random.key(2))
    r = np.random.default_rng(1)
    tgt = jnp.asarray(r.integers(7, cfg.vocab_size, (2, 6)), jnp.int32)
    t5 = cfg.family == "encoder_decoder"
    src = jnp.asarray(r.integers(7, cfg.vocab_size, (2, 5)), jnp.int32)
    cache = init_cache(cfg, 2, 6, source_length=5 if t5 else None)
    assert_bitwise(cache, old.init_cache(2, 6, 5 if t5 else None))
    full = new.apply(params, src, tgt) if t5 else new.apply(params, tgt)
    enc = new.encode(params, src) if t5 else None
    if t5:
        assert_bitwise(enc, old.apply({"params": params}, src, method="encode"))
    old_cache, steps = cache, []
    for lo, hi in [(0, 3), (3, 4), (4, 5), (5, 6)]:
        t = tgt[:, lo:hi]
        if t5:
            e = enc if lo == 0 else None
            logits, cache = new.apply(params, None, t, encoder_out=e, cache=cache)
            want, mut = old.apply({"params": params, "cache": old_cache}, e, t, decode=True,
                                  mutable=["cache"], method="decode")
        else:
            logits, cache = new.apply(params, t, cache=cache)
            want, mut = old.apply({"params": params, "cache": old_cache}, t, decode=True,
                                  mutable=["cache"])
        old_cache = mut["cache"]
        assert_bitwise((logits, cache), (want, old_cache))
        steps.append(logits)
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=2e-5, rtol=2e-5)
    assert int(cache["index"]) == 6
    with pytest.raises(ValueError, match="overflows the cache of 6 slots"):
        new.apply(params, None, tgt[:, :1], cache=cache) if t5 else new.apply(params, tgt[:, :1],
                                                                             cache=cache)


@pytest.mark.parametrize("name", ["bert_nsp", pytest.param("t5_scan", marks=pytest.mark.slow)])
def test_transformer_module_equals_the_pure_model(name):
    """``Transformer(cfg, params=p)(x)`` is ``Model.apply(p, x)`` (dropout on, same key, too);
    its `nnx.Param` state is ``p`` path for path with the spec's logical axes; seeded like the
    former NNX model (``nnx.Rngs(0)``: same parameters)."""
    cfg = cfg_of(name)
    model = build_model(cfg)
    params = model.init(jax.random.key(3))
    args, kw = inputs(cfg)
    t = Transformer(cfg, params=params)
    assert_bitwise(t(*args, **kw), model.apply(params, *args, **kw))
    key = jax.random.key(4)
    assert_bitwise(t(*args, **kw, deterministic=False, rngs=key), model.apply(params, *args, rng=key, **kw))
    t.train()
    assert_bitwise(t(*args, **kw, rngs=key), model.apply(params, *args, rng=key, **kw))
    t.eval()
    assert_bitwise(nnx.to_pure_dict(nnx.state(t, nnx.Param)), params)
    axes = nnx.to_pure_dict(nnx.state(t, nnx.Param),
                            extract_fn=lambda v: tuple(v.get_metadata("out_sharding", None)))
    assert axes == model.logical_axes()
    keyless = Transformer(cfg, nnx.Rngs(params=0), params=params)  # no dropout stream
    with pytest.raises(ValueError, match="dropout is on .* but no key: pass rngs="):
        keyless(*args, **kw, deterministic=False)
    assert_bitwise(Transformer(cfg, nnx.Rngs(0)).param_dict(),
                   jnnx.param_dict(jnnx.build_model(cfg, nnx.Rngs(0))))


def test_transformer_kv_cache_as_nnx_cache_state():
    cfg = cfg_of("gpt", dropout_rate=0.0, attention_dropout_rate=0.0)
    t = Transformer(cfg, 0)
    tgt = jnp.asarray(np.random.default_rng(1).integers(7, cfg.vocab_size, (2, 4)), jnp.int32)
    full = t(tgt)
    with pytest.raises(ValueError, match=r"needs the model's KV cache: call model.init_cache"):
        t(tgt[:, :1], decode=True)
    t.init_cache(2, 4)
    assert set(nnx.to_pure_dict(nnx.state(t, nnx.Cache))["cache"]) == {"decoder", "index", "positions"}
    steps = [t(tgt[:, :2], decode=True), t(tgt[:, 2:3], decode=True), t(tgt[:, 3:], decode=True)]
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=2e-5, rtol=2e-5)
    assert int(t.cache_dict()["index"]) == 4


@pytest.mark.parametrize("name", list(CONFIGS))
def test_lowered_train_program_equals_the_former_models(name):
    """The jitted loss-and-gradient program of the new model lowers to the same StableHLO as the
    former model's (debug locations stripped; dropout on), for every family and stack layout
    (lowering only: no compile): the refactor moved code, not arithmetic."""
    cfg = cfg_of(name)
    new, old = build_model(cfg), old_build_model(cfg)
    params = jax.eval_shape(new.init, jax.random.key(0))
    args, kw = inputs(cfg)

    def text(apply):
        def loss(p, rng):
            return sum(jnp.sum(o) for o in jax.tree.leaves(apply(p, rng)))
        lowered = jax.jit(jax.value_and_grad(loss)).lower(params, jax.random.key(0))
        return lowered.as_text(debug_info=False)

    assert text(lambda p, r: new.apply(p, *args, rng=r, **kw)) == text(
        lambda p, r: old.apply({"params": p}, *args, deterministic=False, rngs={"dropout": r}, **kw))
