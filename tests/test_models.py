"""The three families end to end in tiny size: gradients, heads, packing, causality, scan/remat.

Compiles dominate the run time on CPU, so each model variant's forward is compiled once (cached)
and parameters are drawn from `jax.eval_shape(model.init)` shapes with NumPy (random scales and
biases too, so an ignored parameter would show).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.config import ModelConfig
from jaxformer.models import build_model
from jaxformer.models.presets import PRESETS, preset
from jaxformer.ops import cross_entropy_with_integer_labels

KEY = functools.partial(jax.random.key, impl="rbg")  # as threefry, but compiles fast on CPU
TINY = dict(vocab_size=64, d_model=32, num_heads=4, d_ff=64, num_layers=2, max_len=32,
            num_classes=3)
L = 8
VARIANTS = {
    "gpt_tiny": preset("gpt_tiny", **TINY),
    "bert_tiny": preset("bert_tiny", **TINY, nsp_head=True),
    "t5_tiny": preset("t5_tiny", **TINY),
    # one layer where the layer count does not matter to the test (compiles dominate run time)
    "transformer_tiny": preset("transformer_tiny", **dict(TINY, num_layers=1)),
    "gqa_rope_rms_swiglu": preset("gpt_tiny", **dict(TINY, num_layers=1), num_kv_heads=2,
                                  position="rope", norm="rms", gated_ffn=True, activation="silu",
                                  use_bias=False, tie_embeddings=False),
    "chunked": preset("gpt_tiny", **TINY, attention_impl="chunked", attention_chunk_size=4),
}


def cfg_of(name: str, **kw) -> ModelConfig:
    return ModelConfig.from_dict(dict(VARIANTS[name], **kw))


# ------------------------------------------------------------------------------------------------
# Batches: row 0 packs sequences A (5 tokens) and B (3 tokens); row 1 is A alone, row 2 B alone,
# both right-padded (segment id 0). Packing must not leak across segments.
def packed_rows(tokens_a, tokens_b):
    a, b = len(tokens_a), len(tokens_b)
    toks = np.zeros((3, L), np.int32)
    seg = np.zeros((3, L), np.int32)
    pos = np.zeros((3, L), np.int32)
    toks[0] = np.concatenate([tokens_a, tokens_b])
    seg[0] = [1] * a + [2] * b
    pos[0] = list(range(a)) + list(range(b))
    toks[1, :a], seg[1, :a], pos[1, :a] = tokens_a, 1, np.arange(a)
    toks[2, :b], seg[2, :b], pos[2, :b] = tokens_b, 1, np.arange(b)
    pos[1, a:] = np.arange(a, L)
    pos[2, b:] = np.arange(b, L)
    return toks, seg, pos


def make_batch(cfg: ModelConfig, seed: int = 0) -> dict:
    r = np.random.default_rng(seed)
    toks, seg, pos = packed_rows(r.integers(7, cfg.vocab_size, 5), r.integers(7, cfg.vocab_size, 3))
    if cfg.family == "encoder_decoder":
        tgt, tseg, tpos = packed_rows(r.integers(7, cfg.vocab_size, 4),
                                      r.integers(7, cfg.vocab_size, 4))
        return dict(inputs=toks, targets_in=tgt, inputs_segment_ids=seg, inputs_positions=pos,
                    targets_segment_ids=tseg, targets_positions=tpos)
    out = dict(tokens=toks, segment_ids=seg, positions=pos)
    if cfg.family == "encoder":
        out["token_types"] = (pos >= 2).astype(np.int32) * (seg > 0)
    return out


def call(model, variables, batch, **kw):
    b = dict(batch)
    if model.cfg.family == "encoder_decoder":
        return model.apply(variables, b.pop("inputs"), b.pop("targets_in"), **b, **kw)
    return model.apply(variables, b.pop("tokens"), **b, **kw)


def random_params(cfg: ModelConfig, seed: int = 0):
    """Parameters of the right tree and shapes (from eval_shape of init), drawn with NumPy."""
    model = build_model(cfg)
    make_batch(cfg)
    shapes = model.abstract()
    r = np.random.default_rng(seed)

    def draw(path, s):
        name = jax.tree_util.keystr(path)
        if "scale" in name:
            return (1.0 + 0.1 * r.normal(size=s.shape)).astype(s.dtype)
        return (0.1 * r.normal(size=s.shape)).astype(s.dtype)

    return jax.tree_util.tree_map_with_path(draw, shapes)


@functools.cache
def params_of(name: str):
    return random_params(cfg_of(name))


def loss_fn(cfg: ModelConfig, deterministic: bool = True):
    """(params, batch, key) → (scalar loss, outputs): cross-entropy of every head output against
    fixed labels, so that every parameter gets a gradient."""
    model = build_model(cfg)

    def loss(params, batch, key=None):
        out = call(model, params, batch, rng=None if deterministic else key)
        total = 0.0
        for logits in (out if isinstance(out, tuple) else (out,)):
            labels = jnp.arange(np.prod(logits.shape[:-1])).reshape(logits.shape[:-1])
            total += jnp.mean(cross_entropy_with_integer_labels(logits, labels % logits.shape[-1]))
        return total, out

    return loss


@functools.cache
def compiled(name: str, deterministic: bool = True, **kw):
    """(cfg, jitted (params, batch, key) → ((loss, outputs), grads)), compiled once per variant."""
    cfg = cfg_of(name, **kw)
    return cfg, jax.jit(jax.value_and_grad(loss_fn(cfg, deterministic), has_aux=True))


def forward(name: str):
    """(cfg, deterministic forward(params, batch)) sharing the compiled value-and-grad."""
    cfg, f = compiled(name)
    return cfg, lambda params, batch: f(params, batch)[0][1]


# ------------------------------------------------------------------------------------------------
def _parameter_count(cfg: ModelConfig) -> int:
    """Counted on the scanned stack: the same parameters, stacked on a 'layers' axis
    (`test_scanned_stack_equals_unrolled` restacks one into the other). Tracing one layer, not 48,
    makes a 1.5B model's count take 0.3 s, not 7 s."""
    shapes = build_model(cfg.replace(scan_layers=True)).abstract()
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))


@pytest.mark.parametrize("name,want", [
    ("gpt2_small", 124_439_808), ("bert_base", 109_482_240), ("t5_small", 60_506_624),
    ("llama2_7b", 6_738_415_616),
    # the "what fits where" presets (docs/scaling.md): HF gpt2-large / gpt2-xl /
    # bert-large-uncased BertModel / t5-large / t5-3b
    ("gpt2_large", 774_030_080), ("gpt2_xl", 1_557_611_200), ("bert_large", 335_141_888),
    ("t5_large", 737_668_096), ("t5_3b", 2_851_598_336)])
def test_parameter_counts_match_published_models(name, want):
    """At the published vocabulary (``vocab_pad_multiple=1``); as the presets store them, plus
    their vocabulary padding's rows (GPT-2: 47 rows of the tied table); a ``_bf16`` variant, where
    there is one, holds the same parameters."""
    overrides = dict(head="none") if name.startswith("bert") else {}
    stored = ModelConfig.from_dict(preset(name, **overrides))
    assert _parameter_count(stored.replace(vocab_pad_multiple=1)) == want
    padding = stored.padded_vocab_size - stored.vocab_size
    assert padding == (47 if name.startswith("gpt2") else 0)
    variants = [stored] + ([ModelConfig.from_dict(preset(f"{name}_bf16", **overrides))]
                           if f"{name}_bf16" in PRESETS else [])
    for cfg in variants:
        assert _parameter_count(cfg) == want + padding * stored.d_model


def assert_all_gradients_finite_and_used(grads):
    for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
        assert np.all(np.isfinite(g)), jax.tree_util.keystr(path)
        assert np.any(g != 0), f"zero gradient: {jax.tree_util.keystr(path)} is unused"


@pytest.mark.parametrize("name", list(VARIANTS))
def test_forward_backward_finite(name):
    cfg, f = compiled(name)
    (loss, _), grads = f(params_of(name), make_batch(cfg))
    assert np.isfinite(loss)
    assert_all_gradients_finite_and_used(grads)


def test_forward_backward_with_dropout_is_deterministic_given_the_key():
    """Scanned stack with dropout: layers get their own rngs (split_rngs), key fixes the result."""
    cfg, f = compiled("gpt_tiny", deterministic=False, scan_layers=True)
    params, batch = params_of("gpt_tiny"), make_batch(cfg)
    params = _restack(params, "decoder", cfg.num_layers)
    (loss, out), grads = f(params, batch, KEY(1))
    (loss_again, _), _ = f(params, batch, KEY(1))
    (loss_other, _), _ = f(params, batch, KEY(2))
    assert_all_gradients_finite_and_used(grads)
    assert loss == loss_again and loss != loss_other
    assert not np.allclose(out, forward("gpt_tiny")[1](params_of("gpt_tiny"), batch))


@pytest.mark.parametrize("name", ["gpt_tiny", "bert_tiny", "t5_tiny", "gqa_rope_rms_swiglu"])
def test_packed_segments_equal_separate_sequences(name):
    cfg, fwd = forward(name)
    out = fwd(params_of(name), make_batch(cfg))
    logits = np.asarray(out[0] if isinstance(out, tuple) else out)
    n_a = 4 if cfg.family == "encoder_decoder" else 5  # length of sequence A (targets for T5)
    np.testing.assert_allclose(logits[0, :n_a], logits[1, :n_a], atol=2e-5)
    np.testing.assert_allclose(logits[0, n_a:], logits[2, : L - n_a], atol=2e-5)


def test_chunked_attention_model_equals_plain():
    cfg, f = compiled("gpt_tiny")
    _, f_chunked = compiled("chunked")
    params, batch = params_of("gpt_tiny"), make_batch(cfg)
    (loss, logits), grads = f(params, batch)
    (loss_c, logits_c), grads_c = f_chunked(params, batch)
    np.testing.assert_allclose(logits_c, logits, atol=2e-5)
    for g, w in zip(jax.tree.leaves(grads_c), jax.tree.leaves(grads)):
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", ["gpt_tiny", "t5_tiny"])
def test_decoder_is_causal(name):
    cfg, fwd = forward(name)
    params, batch = params_of(name), make_batch(cfg)
    key = "targets_in" if cfg.family == "encoder_decoder" else "tokens"
    changed = dict(batch)
    changed[key] = batch[key].copy()
    i = 3
    changed[key][1, i + 1:] = (batch[key][1, i + 1:] + 1) % cfg.vocab_size
    a, b = np.asarray(fwd(params, batch)), np.asarray(fwd(params, changed))
    np.testing.assert_allclose(b[1, : i + 1], a[1, : i + 1], atol=1e-6)
    assert not np.allclose(b[1, i + 1:], a[1, i + 1:])


def test_jit_equals_eager():
    cfg, fwd = forward("gpt_tiny")
    model, batch, params = build_model(cfg), make_batch(cfg), params_of("gpt_tiny")
    np.testing.assert_allclose(fwd(params, batch), call(model, params, batch), atol=1e-5)


def _restack(params: dict, stack: str, n: int) -> dict:
    """Unrolled ``stack/layer_i`` params → scanned ``stack/layers`` (layers on axis 0)."""
    out = dict(params)
    layers = [params[stack][f"layer_{i}"] for i in range(n)]
    out[stack] = {"layers": jax.tree.map(lambda *xs: jnp.stack(xs), *layers)}
    return out


@pytest.mark.parametrize("name,stacks", [("gpt_tiny", ["decoder"]), ("bert_tiny", ["encoder"]),
                                         ("t5_tiny", ["encoder", "decoder"])])
def test_scanned_stack_equals_unrolled(name, stacks):
    cfg, fwd = forward(name)
    model_scan = build_model(cfg.replace(scan_layers=True))
    fwd_scan = jax.jit(lambda params, batch: call(model_scan, params, batch))
    params, batch = params_of(name), make_batch(cfg)
    scanned = params
    for s in stacks:
        scanned = _restack(scanned, s, cfg.num_layers)
    assert jax.tree.structure(scanned) == jax.tree.structure(
        random_params(cfg.replace(scan_layers=True)))
    want, got = fwd(params, batch), fwd_scan(scanned, batch)
    for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_allclose(g, w, atol=2e-5)


@pytest.mark.slow
def test_remat_policies_give_equal_outputs_and_gradients():
    base, f = compiled("gpt_tiny")
    params, batch = params_of("gpt_tiny"), make_batch(base)
    scanned = _restack(params, "decoder", base.num_layers)
    (want_loss, want_out), want_grads = f(params, batch)
    # unrolled (prevent_cse=True) and scanned (prevent_cse=False) stacks; scan compiles 1 layer
    for policy, scan in [("full", False), ("dots", True), ("dots_with_no_batch_dims", True)]:
        p = scanned if scan else params
        _, f_remat = compiled("gpt_tiny", remat_policy=policy, scan_layers=scan)
        (loss, out), grads = f_remat(p, batch)
        np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
        np.testing.assert_allclose(out, want_out, atol=1e-5)
        if scan:
            grads = dict(grads, decoder=dict(grads["decoder"]))
            layers = grads["decoder"].pop("layers")
            for i in range(base.num_layers):
                grads["decoder"][f"layer_{i}"] = jax.tree.map(lambda x, i=i: x[i], layers)
        for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
            np.testing.assert_allclose(g, w, atol=1e-6, rtol=1e-5, err_msg=policy)


V, D, C = TINY["vocab_size"], TINY["d_model"], TINY["num_classes"]


@pytest.mark.parametrize("family,head,extra,want", [
    ("encoder", "mlm", {}, (3, L, V)),
    ("encoder", "mlm", dict(nsp_head=True), ((3, L, V), (3, 2))),
    ("encoder", "classify", dict(pooler=True), (3, C)),
    ("encoder", "classify", dict(pooling="max"), (3, C)),
    ("encoder", "token_classify", {}, (3, L, C)),
    ("encoder", "none", dict(pooler=False), (3, L, D)),
    ("encoder", "none", dict(pooler=True), ((3, L, D), (3, D))),
    ("decoder", "lm", {}, (3, L, V)),
    ("decoder", "classify", dict(pooling="last"), (3, C)),
    ("decoder", "token_classify", {}, (3, L, C)),
    ("decoder", "none", {}, (3, L, D)),
    ("encoder_decoder", "lm", {}, (3, L, V)),
])
def test_head_output_shapes(family, head, extra, want):
    base = {"encoder": "bert_tiny", "decoder": "gpt_tiny", "encoder_decoder": "t5_tiny"}[family]
    cfg = cfg_of(base, head=head, **dict(dict(nsp_head=False), **extra))
    model, batch = build_model(cfg), make_batch(cfg)
    out = jax.eval_shape(lambda: call(model, model.init(KEY(0)), batch))
    shapes = tuple(o.shape for o in out) if isinstance(out, tuple) else out.shape
    assert shapes == want


@pytest.mark.parametrize("name", ["gpt_tiny", "bert_tiny", "t5_tiny", "transformer_tiny"])
def test_param_dtype_applies_to_every_parameter(name):
    cfg = cfg_of(name, param_dtype="bfloat16")
    model, _batch = build_model(cfg), make_batch(cfg)
    shapes = model.abstract()
    for path, x in jax.tree_util.tree_flatten_with_path(shapes)[0]:
        assert x.dtype == jnp.bfloat16, jax.tree_util.keystr(path)


def test_encoder_decoder_encode_and_decode_methods():
    cfg, fwd = forward("t5_tiny")
    params, batch = params_of("t5_tiny"), make_batch(cfg)
    model = build_model(cfg)

    def encode_then_decode(p, b):
        enc = model.encode(p, b["inputs"], inputs_segment_ids=b["inputs_segment_ids"],
                           inputs_positions=b["inputs_positions"])
        return enc, model.apply(
            p, None, b["targets_in"], encoder_out=enc, inputs_segment_ids=b["inputs_segment_ids"],
            targets_segment_ids=b["targets_segment_ids"], targets_positions=b["targets_positions"])

    enc, dec = jax.jit(encode_then_decode)(params, batch)
    assert enc.shape == (3, L, cfg.d_model)
    np.testing.assert_allclose(dec, fwd(params, batch), atol=1e-5)


def test_bfloat16_compute_with_float32_params():
    cfg32, fwd32 = forward("gpt_tiny")
    cfg, f = compiled("gpt_tiny", dtype="bfloat16")
    params, batch = params_of("gpt_tiny"), make_batch(cfg)
    (loss, logits), grads = f(params, batch)
    assert logits.dtype == jnp.bfloat16
    assert all(g.dtype == jnp.float32 and np.isfinite(g).all() for g in jax.tree.leaves(grads))
    np.testing.assert_allclose(np.asarray(logits, np.float32), fwd32(params, batch), atol=0.1)
    assert np.isfinite(loss)


def test_out_of_vocabulary_ids():
    cfg, fwd = forward("gpt_tiny")
    params, batch = params_of("gpt_tiny"), make_batch(cfg)
    for bad in (cfg.vocab_size, -1):
        tokens = batch["tokens"].copy()
        tokens[0, 3] = bad
        with pytest.raises(ValueError, match=rf"outside the vocabulary \[0, {cfg.vocab_size}\)"):
            build_model(cfg).apply(params, tokens)
        logits = np.asarray(fwd(params, dict(batch, tokens=tokens)))  # traced: no check possible
        assert np.isnan(logits[0, 3]).all(), f"id {bad} was silently clamped or wrapped"
        # other rows are unaffected (within row 0 the NaN reaches every query: 0 weight · NaN)
        assert np.isfinite(logits[1:]).all()
    ecfg = cfg_of("bert_tiny")
    with pytest.raises(ValueError, match="tokens contain ids outside"):
        build_model(ecfg).apply(params_of("bert_tiny"), np.full((1, 4), 99))
    tcfg = cfg_of("t5_tiny")
    ok, bad = np.ones((1, 4), np.int32), np.full((1, 4), 64, np.int32)
    for args, what in [((bad, ok), "inputs"), ((ok, bad), "targets_in")]:
        with pytest.raises(ValueError, match=f"{what} contain ids outside"):
            build_model(tcfg).apply(params_of("t5_tiny"), *args)


def test_positions_types_shapes_and_cache_outside_their_tables_are_errors():
    """Each used to give NaN logits (or, past the KV cache, silently wrong ones) with no error."""
    cfg = cfg_of("gpt_tiny")
    params, model = params_of("gpt_tiny"), build_model(cfg)
    with pytest.raises(ValueError, match=r"tokens of length 34 exceed model.max_len=32"):
        model.apply(params, np.ones((1, 34), np.int32))
    with pytest.raises(ValueError, match=r"tokens of length 34 exceed"):  # static: also under jit
        jax.jit(model.apply)(params, np.ones((1, 34), np.int32))
    with pytest.raises(ValueError, match=r"positions contain ids outside the learned table "
                                         r"\[0, model.max_len=32\): e.g. \[40\]"):
        model.apply(params, np.ones((1, 4), np.int32), positions=np.array([[0, 1, 40, 3]]))
    with pytest.raises(ValueError, match=r"tokens must be \[batch, length\] token ids, got "
                                         r"shape \(4,\)"):
        model.apply(params, np.ones((4,), np.int32))
    ecfg = cfg_of("bert_tiny")
    with pytest.raises(ValueError, match=r"token_types contain ids outside \[0, "
                                         r"model.type_vocab_size=2\)"):
        build_model(ecfg).apply(params_of("bert_tiny"), np.ones((1, 4), np.int32),
                                token_types=np.array([[0, 1, 2, 1]]))
    cache = model.init_cache(1, 4)
    _, cache = model.apply(params, np.ones((1, 4), np.int32), cache=cache)
    with pytest.raises(ValueError, match=r"decoding 1 more token\(s\) at cache index 4 "
                                         r"overflows the cache of 4 slots"):
        model.apply(params, np.ones((1, 1), np.int32), cache=cache)


@pytest.mark.parametrize("how", ["first", "last", "mean", "max"])
def test_pooling_matches_numpy(how):
    """Each pooling against NumPy on rows of 7, 3, 1 and 0 non-padding tokens."""
    from jaxformer.ops.heads import pool

    x = np.random.default_rng(0).normal(size=(4, 7, 5)).astype(np.float32)
    lengths = (7, 3, 1, 0)
    seg = np.array([[1] * n + [0] * (7 - n) for n in lengths], np.int32)
    got = np.asarray(pool(jnp.asarray(x), jnp.asarray(seg), how))
    for b, n in enumerate(lengths):
        v, zeros = x[b, :n].astype(np.float64), np.zeros(5)
        want = {"first": x[b, 0], "last": x[b, max(n - 1, 0)],
                "mean": v.mean(0) if n else zeros, "max": v.max(0) if n else zeros}[how]
        np.testing.assert_allclose(got[b], want, rtol=1e-6, atol=1e-6)
