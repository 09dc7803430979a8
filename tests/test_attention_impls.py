"""Fused attention kernels (`jaxformer.ops.attention_kernels`) equal the plain ``xla`` path.

On any machine: the cuDNN adapter's argument mapping (segments + padding + causal + GQA → mask,
``is_causal``) is run through `jax.nn.dot_product_attention(implementation="xla")`, jax's own
reference of the same call, and a mapping that drops the segments is shown to fail; the TPU splash
kernel runs through the Pallas interpreter (``splash_interpret``). Both are checked against a
float64 NumPy brute force. The real kernels run only where their device is present (skipped
elsewhere). Settings a kernel or the backend cannot run fail at config time, naming the field.
"""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.config import ModelConfig
from jaxformer.models import build_model
from jaxformer.models.presets import PRESETS, preset
from jaxformer.ops import dot_product_attention
from jaxformer.ops.attention_kernels import cudnn_arguments, cudnn_attention
from jaxformer.ops.kernel_choice import backend_problem, check_backend, fastest_attention, target_platform
from jaxformer.train.config import check_config, load_config, validate_config

ROOT = Path(__file__).resolve().parents[1]
B, L, H, K, D = 2, 40, 4, 2, 16  # GQA: 2 query heads per kv head
TOL = {jnp.float32: 2e-5, jnp.bfloat16: 3e-2}
ON_CUDA = backend_problem("cudnn") is None
ON_TPU = backend_problem("splash") is None


def packed_segments(length: int = L) -> jnp.ndarray:
    """Row 0: two packed documents then padding (id 0); row 1: two documents, no padding."""
    seg = np.zeros((B, length), np.int32)
    seg[0, :15], seg[0, 15:30] = 1, 2
    seg[1, :22], seg[1, 22:] = 1, 2
    return jnp.asarray(seg)


def qkv(dtype=jnp.float32, lq: int = L, lk: int = L, seed: int = 0):
    r = np.random.default_rng(seed)
    make = lambda *s: jnp.asarray(r.normal(size=s), dtype)
    return make(B, lq, H, D), make(B, lk, K, D), make(B, lk, K, D)


def numpy_attention(q, k, v, allowed) -> np.ndarray:
    """float64 brute force: softmax over the allowed keys of each row, zeros where none is;
    ``allowed`` `[B, L, S]`."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    out = np.zeros(q.shape[:3] + (v.shape[-1],))
    for b in range(q.shape[0]):
        for h in range(q.shape[2]):
            kh = h // (q.shape[2] // k.shape[2])
            s = q[b, :, h] @ k[b, :, kh].T / np.sqrt(q.shape[-1])
            s = np.where(allowed[b], s, -np.inf)
            m = np.max(s, axis=-1, keepdims=True)
            p = np.exp(s - np.where(np.isfinite(m), m, 0.0))
            denom = p.sum(-1, keepdims=True)
            out[b, :, h] = (p @ v[b, :, kh]) / np.where(denom == 0, 1.0, denom)
    return out


def allowed_keys(q_seg, kv_seg, causal: bool) -> np.ndarray:
    q_seg, kv_seg = np.asarray(q_seg), np.asarray(kv_seg)
    ok = (q_seg[:, :, None] == kv_seg[:, None, :]) & (kv_seg[:, None, :] != 0)
    if causal:
        ok &= np.tril(np.ones((q_seg.shape[1], kv_seg.shape[1]), bool))[None]
    return ok


def via_cudnn_mapping(q, k, v, seg, causal, **kw):
    """Our cuDNN arguments, run by jax's reference implementation of the same call."""
    return cudnn_attention(q, k, v, bias=None, mask=kw.pop("mask", None), causal=causal,
                           q_segment_ids=seg, kv_segment_ids=kw.pop("kv_seg", seg),
                           scale=D ** -0.5, implementation="xla")


IMPLS = {
    "cudnn_mapping": via_cudnn_mapping,
    "splash_interpret": lambda q, k, v, seg, causal: dot_product_attention(
        q, k, v, causal=causal, q_segment_ids=seg, kv_segment_ids=seg,
        implementation="splash_interpret"),
}


# --------------------------------------------------------------------------------------------------
# Equality with xla and with a float64 brute force.


@pytest.mark.parametrize("impl,causal,dtype", [
    pytest.param(impl, causal, dtype, marks=() if (causal, dtype) == (True, jnp.float32)
                 else pytest.mark.slow)
    for impl in sorted(IMPLS) for causal in (True, False) for dtype in (jnp.float32, jnp.bfloat16)])
def test_packed_padded_gqa_equals_xla(impl, causal, dtype):
    q, k, v = qkv(dtype)
    seg = packed_segments()
    want = dot_product_attention(q, k, v, causal=causal, q_segment_ids=seg, kv_segment_ids=seg)
    got = IMPLS[impl](q, k, v, seg, causal)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               atol=TOL[dtype], rtol=TOL[dtype])
    brute = numpy_attention(q, k, v, allowed_keys(seg, seg, causal))
    np.testing.assert_allclose(np.asarray(got, np.float64), brute, atol=TOL[dtype] * 4)
    assert np.all(np.asarray(got)[0, 30:] == 0)  # padding queries: zeros, as in xla


@pytest.mark.slow
@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_gradients_equal_xla(impl):
    q, k, v = qkv()
    seg = packed_segments()
    w = jnp.asarray(np.random.default_rng(1).normal(size=(B, L, H, D)), jnp.float32)
    loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v) * w)
    want = jax.grad(loss(lambda q, k, v: dot_product_attention(
        q, k, v, causal=True, q_segment_ids=seg, kv_segment_ids=seg)), argnums=(0, 1, 2))(q, k, v)
    got = jax.grad(loss(lambda q, k, v: IMPLS[impl](q, k, v, seg, True)), argnums=(0, 1, 2))(q, k, v)
    for g, w_ in zip(got, want):
        np.testing.assert_allclose(g, w_, atol=5e-5, rtol=5e-5)


def test_dropping_the_segments_is_caught():
    """The MaxText failure: cuDNN given only ``is_causal`` attends across packed documents. That
    mapping differs from xla on the second document's rows (and padding), ours does not."""
    q, k, v = qkv()
    seg = packed_segments()
    want = np.asarray(dot_product_attention(q, k, v, causal=True, q_segment_ids=seg,
                                            kv_segment_ids=seg))
    segments_ignored = np.asarray(jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                                               implementation="xla"))
    err = np.abs(segments_ignored - want).max(axis=(2, 3))  # [B, L]
    assert err[0, :15].max() < 1e-5  # the first document sees only itself either way
    assert err[0, 15:30].min() > 1e-3 and err[1, 22:].min() > 1e-3  # document 2 sees document 1
    ours = np.asarray(via_cudnn_mapping(q, k, v, seg, True))
    np.testing.assert_allclose(ours, want, atol=2e-5)


def test_cudnn_mapping_puts_segments_in_the_mask_and_zeroes_blind_rows():
    q, k, v = qkv()
    seg = packed_segments()
    kwargs, visible = cudnn_arguments(q, k, v, bias=None, mask=None, causal=True,
                                      q_segment_ids=seg, kv_segment_ids=seg, scale=D ** -0.5)
    assert kwargs["is_causal"] and kwargs["mask"].shape == (B, 1, L, L)
    blind = np.asarray(seg) == 0  # padding queries: every key (cuDNN's backward NaNs otherwise)
    np.testing.assert_array_equal(kwargs["mask"][:, 0],
                                  allowed_keys(seg, seg, causal=False) | blind[:, :, None])
    np.testing.assert_array_equal(visible[:, 0], ~blind)
    # without the zeroing, padding queries would average values (cuDNN masks with a finite value)
    raw = np.asarray(jax.nn.dot_product_attention(**kwargs, implementation="xla"))
    assert np.abs(raw[0, 30:]).max() > 1e-2


@pytest.mark.slow
def test_cudnn_mapping_user_mask_cross_attention_and_odd_lengths():
    """A user mask AND segments, queries and keys of different (odd) lengths, a query document
    with no key of its id (zeros): the cuDNN mapping, padded to even lengths, equals xla."""
    lq, lk = 37, 23
    q, k, v = qkv(lq=lq, lk=lk)
    q_seg = np.ones((B, lq), np.int32)
    q_seg[:, 20:], q_seg[1, 30:] = 2, 3  # id 3 has no key
    kv_seg = np.ones((B, lk), np.int32)
    kv_seg[:, 12:], kv_seg[0, 20:] = 2, 0
    q_seg, kv_seg = jnp.asarray(q_seg), jnp.asarray(kv_seg)
    mask = jnp.asarray(np.random.default_rng(2).random((B, H, lq, lk)) < 0.8)
    want = dot_product_attention(q, k, v, mask=mask, q_segment_ids=q_seg, kv_segment_ids=kv_seg)
    got = via_cudnn_mapping(q, k, v, q_seg, False, mask=mask, kv_seg=kv_seg)
    np.testing.assert_allclose(got, want, atol=2e-5)
    assert np.all(np.asarray(got)[1, 30:] == 0)


@pytest.mark.parametrize("per_row,causal,lq", [(False, False, L), (True, True, L - 1)])
def test_cudnn_mapping_with_t5s_relative_bias_and_its_gradient_equals_xla(per_row, causal, lq):
    """T5's bias through the cuDNN adapter, run by jax's reference of the same call: a bias shared
    by the batch `[1, H, L, S]` (unpacked positions) or per row (packed), with packed and padded
    segments, bidirectional, and causal at an odd length (padded to even, the bias with it). The
    output and the gradients of q, k, v and the bias equal the plain path's (float32)."""
    q, k, v = qkv(lq=lq, lk=lq)
    seg = packed_segments(lq)
    r = np.random.default_rng(4)
    bias = jnp.asarray(r.normal(size=(B if per_row else 1, H, lq, lq)), jnp.float32)
    w = jnp.asarray(r.normal(size=(B, lq, H, D)), jnp.float32)

    def loss(fn):
        return lambda q, k, v, bias: jnp.sum(fn(q, k, v, bias) * w)

    plain = lambda q, k, v, bias: dot_product_attention(
        q, k, v, bias=bias, causal=causal, q_segment_ids=seg, kv_segment_ids=seg)
    mapped = lambda q, k, v, bias: cudnn_attention(
        q, k, v, bias=bias, mask=None, causal=causal, q_segment_ids=seg, kv_segment_ids=seg,
        scale=D ** -0.5, implementation="xla")
    np.testing.assert_allclose(mapped(q, k, v, bias), plain(q, k, v, bias), atol=2e-5)
    want = jax.grad(loss(plain), argnums=(0, 1, 2, 3))(q, k, v, bias)
    got = jax.grad(loss(mapped), argnums=(0, 1, 2, 3))(q, k, v, bias)
    for name, g, w_ in zip(("q", "k", "v", "bias"), got, want):
        assert g.shape == w_.shape, name
        np.testing.assert_allclose(g, w_, atol=5e-5, rtol=5e-5, err_msg=name)
    assert np.abs(np.asarray(want[3])).max() > 1e-3  # the bias's gradient is not trivially zero
    kwargs, _ = cudnn_arguments(q, k, v, bias=bias.astype(jnp.bfloat16), mask=None, causal=causal,
                                q_segment_ids=seg, kv_segment_ids=seg, scale=1.0)
    assert kwargs["bias"].shape == bias.shape  # broadcast over the batch by cuDNN, not here


@pytest.mark.slow
def test_splash_cross_attention_with_a_document_missing_from_the_keys():
    lq, lk = 40, 56
    q, k, v = qkv(lq=lq, lk=lk)
    q_seg = np.ones((B, lq), np.int32)
    q_seg[:, 25:], q_seg[1, 35:] = 2, 3
    kv_seg = np.ones((B, lk), np.int32)
    kv_seg[:, 30:], kv_seg[0, 50:] = 2, 0
    q_seg, kv_seg = jnp.asarray(q_seg), jnp.asarray(kv_seg)
    want = dot_product_attention(q, k, v, q_segment_ids=q_seg, kv_segment_ids=kv_seg)
    got = dot_product_attention(q, k, v, q_segment_ids=q_seg, kv_segment_ids=kv_seg,
                                implementation="splash_interpret")
    np.testing.assert_allclose(got, want, atol=2e-5)
    assert np.all(np.asarray(got)[1, 35:] == 0)


@pytest.mark.slow
def test_splash_without_segments_and_with_several_blocks():
    """No segment ids (padding to the block made internally) and a length over two 128-blocks."""
    q, k, v = qkv(lq=300, lk=300)
    for causal in (True, False):
        want = dot_product_attention(q, k, v, causal=causal)
        got = dot_product_attention(q, k, v, causal=causal, implementation="splash_interpret",
                                    kv_chunk_size=128)
        np.testing.assert_allclose(got, want, atol=2e-5)


@pytest.mark.slow
def test_model_forward_with_splash_equals_xla():
    """Through the blocks: gpt_tiny and bert_tiny on packed rows, splash interpreted vs xla."""
    seg = packed_segments()
    tokens = jnp.asarray(np.random.default_rng(3).integers(1, 100, (B, L)), jnp.int32) * (seg != 0)
    for name in ("gpt_tiny", "bert_tiny"):
        cfg = ModelConfig.from_dict(preset(name, attention_dropout_rate=0.0, dropout_rate=0.0))
        model = build_model(cfg)
        params = model.init(jax.random.key(0))
        want = model.apply(params, tokens, segment_ids=seg)
        fused = build_model(cfg.replace(attention_impl="splash_interpret"))
        got = fused.apply(params, tokens, segment_ids=seg)
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------------------------------------
# What cannot run is refused before compiling, naming the field.


@pytest.mark.parametrize("kw,field", [
    (dict(attention_impl="cudnn", dtype="float32", attention_dropout_rate=0.0), "model.dtype"),
    (dict(attention_impl="cudnn", dtype="bfloat16"), "model.attention_dropout_rate=0.1"),
    (dict(attention_impl="cudnn", dtype="bfloat16", attention_dropout_rate=0.0, d_model=96,
          num_heads=8), "model.head_dim=12"),
    (dict(attention_impl="splash", attention_dropout_rate=0.0, attention_chunk_size=100),
     "model.attention_chunk_size=100"),
    (dict(attention_impl="splash_interpret", attention_dropout_rate=0.0, position="relative"),
     "model.position='relative'"),
])
def test_config_refuses_what_a_kernel_cannot_compute(kw, field):
    with pytest.raises(ValueError, match=field.replace("(", r"\(")) as e:
        ModelConfig(**kw)
    assert f"attention_impl={kw['attention_impl']!r}" in str(e.value)


def test_t5_bf16_preset_refuses_splash_and_takes_cudnn():
    with pytest.raises(ValueError, match="relative-position bias"):
        ModelConfig.from_dict(preset("t5_base_bf16", attention_impl="splash"))
    ModelConfig.from_dict(preset("t5_base_bf16", attention_impl="cudnn"))  # the bias and its grad
    for name in ("gpt2_small_bf16", "gpt2_medium_bf16", "bert_base_bf16"):
        for impl in ("cudnn", "splash"):
            ModelConfig.from_dict(preset(name, attention_impl=impl))  # a kernel can run these


@pytest.mark.skipif(ON_CUDA or ON_TPU, reason="refusal of a missing device")
def test_backend_without_the_device_is_refused_at_config_time():
    for impl, device in (("cudnn", "CUDA GPU"), ("splash", "TPU")):
        with pytest.raises(ValueError, match=f"model.attention_impl='{impl}' needs a {device}"):
            check_backend(impl)
        with pytest.raises(ValueError, match=f"attention_impl='{impl}'"):  # ops: at trace time
            dot_product_attention(*qkv(), implementation=impl)
    config = load_config(ROOT / "configs" / "gpt_pretrain_tiny.py", {
        "model.attention_impl": "cudnn", "model.dtype": "bfloat16",
        "model.attention_dropout_rate": 0.0})
    with pytest.raises(ValueError, match="model.attention_impl='cudnn' needs a CUDA GPU"):
        check_config(config, validate_config(config))
    check_backend("splash_interpret")  # the interpreter runs anywhere


def test_backend_problem_and_fastest_attention_by_platform():
    assert backend_problem("cudnn", "gpu", "cuda 12.8") is None
    assert "CUDA GPU" in backend_problem("cudnn", "gpu", "rocm 6.2")
    assert backend_problem("splash", "tpu", "") is None
    assert "TPU" in backend_problem("splash", "gpu", "cuda 12.8")
    bf16 = dict(dtype="bfloat16", head_dim=64, relative_bias=False, causal=True,
                attention_dropout_rate=0.0, chunk_size=512)
    assert fastest_attention(**bf16, platform="gpu", version="cuda 12.8") == "cudnn"
    assert fastest_attention(**bf16, platform="gpu", version="rocm 6.2") == "xla"
    assert fastest_attention(**bf16, platform="tpu", version="") == "splash"
    assert fastest_attention(**bf16, platform="cpu", version="") == "xla"
    # What a kernel refuses (`unsupported`) falls to the next one, then to xla.
    assert fastest_attention(**dict(bf16, dtype="float32"), platform="cuda") == "xla"
    assert fastest_attention(**dict(bf16, dtype="float32"), platform="tpu") == "splash"
    assert fastest_attention(**dict(bf16, attention_dropout_rate=0.1), platform="tpu") == "xla"
    assert fastest_attention(**dict(bf16, chunk_size=100), platform="tpu") == "xla"
    assert fastest_attention(**dict(bf16, head_dim=260), platform="cuda") == "xla"
    # Bidirectional attention on a TPU: the flash kernel first (`BIDIRECTIONAL_FIRST`), splash
    # after it; GPUs keep cuDNN.
    encoder = dict(bf16, causal=False)
    assert fastest_attention(**encoder, platform="tpu") == "flash"
    assert fastest_attention(**encoder, platform="gpu", version="cuda 12.8") == "cudnn"
    assert fastest_attention(**encoder, platform="cpu") == "xla"


# "auto" on the three families' bf16 presets, for each platform: T5's relative bias takes the Pallas
# flash kernel on a TPU (splash has no bias operand), cuDNN on a GPU.
T5_ON_TPU = "flash"
AUTO = {"tpu": {"gpt2_small_bf16": "splash", "bert_base_bf16": "flash", "t5_base_bf16": T5_ON_TPU},
        "cuda": {"gpt2_small_bf16": "cudnn", "bert_base_bf16": "cudnn", "t5_base_bf16": "cudnn"},
        "cpu": {"gpt2_small_bf16": "xla", "bert_base_bf16": "xla", "t5_base_bf16": "xla"}}


@pytest.mark.parametrize("platform", sorted(AUTO))
def test_auto_is_the_presets_default_and_picks_the_platforms_fastest_kernel(platform):
    for name, want in AUTO[platform].items():
        cfg = ModelConfig.from_dict(preset(name))
        assert cfg.attention_impl == "auto"
        with target_platform(platform):
            assert cfg.attention_kernel == want, name
            assert cfg.attention_summary() == f"{want} (auto)"
            check_backend(cfg.attention_kernel)  # what auto picks, the platform runs
            # Dropout (the float32 presets) or an additive bias no kernel takes: xla.
            assert ModelConfig.from_dict(preset(name.removesuffix("_bf16"))).attention_kernel == "xla"
    with target_platform("tpu"):
        gpt = preset("gpt2_small_bf16")
        assert ModelConfig.from_dict(dict(gpt, position="alibi")).attention_kernel == "xla"
        assert ModelConfig.from_dict(dict(gpt, sliding_window=64)).attention_kernel == "xla"
        assert ModelConfig.from_dict(dict(gpt, attention_impl="chunked")).attention_kernel == "chunked"


def test_auto_trains_on_this_host_and_under_context_parallelism():
    """On a CPU host "auto" is "xla" (the host's backend, no `target_platform`), so the default
    config checks pass; ring attention (``mesh.context``) accepts "auto" and says it runs."""
    if ON_CUDA or ON_TPU:
        pytest.skip("checks a CPU host's choice (xla); on a GPU or TPU auto picks that platform's kernel")
    config = load_config(ROOT / "configs" / "gpt_pretrain_tiny.py",
                         {"model.attention_impl": "auto", "mesh.context": 2, "mesh.data": 1})
    model_cfg = validate_config(config)
    check_config(config, model_cfg)
    assert model_cfg.attention_kernel == "xla"
    assert model_cfg.attention_summary(2) == "ring (mesh.context=2)"


def test_kernels_refuse_what_they_cannot_express_at_trace_time():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="dense mask"):
        dot_product_attention(q, k, v, mask=jnp.ones((1, 1, L, L), bool),
                              implementation="splash_interpret")
    with pytest.raises(ValueError, match="no additive bias"):
        dot_product_attention(q, k, v, bias=jnp.zeros((1, H, L, L)),
                              implementation="splash_interpret")
    with pytest.raises(ValueError, match="no attention dropout"):
        dot_product_attention(q, k, v, dropout_rate=0.1, dropout_rng=jax.random.key(0),
                              implementation="splash_interpret")


# --------------------------------------------------------------------------------------------------
# Presets.


def test_bf16_presets_are_their_base_in_bfloat16():
    for name in ("gpt2_small", "gpt2_medium", "bert_base", "t5_base"):
        base = ModelConfig.from_dict(PRESETS[name]).to_dict()
        fast = ModelConfig.from_dict(PRESETS[f"{name}_bf16"]).to_dict()
        changed = {key: fast[key] for key in fast if fast[key] != base[key]}
        assert changed == {"dtype": "bfloat16", "attention_dropout_rate": 0.0}, changed
        assert fast["param_dtype"] == "float32" and fast["attention_impl"] == "auto"


@pytest.mark.parametrize("name,want", [("gpt2_medium", 354_823_168), ("t5_base", 222_903_552)])
def test_new_presets_match_published_parameter_counts(name, want):
    """At the published vocabulary; the gpt2 presets store 47 padding rows more (vocab_pad_multiple)."""
    cfg = ModelConfig.from_dict(preset(name, vocab_pad_multiple=1))
    shapes = build_model(cfg).abstract()
    assert sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes)) == want


# --------------------------------------------------------------------------------------------------
# The real kernels, where their device is present.


def assert_cudnn_gradients_equal_xla(f, q, k, v):
    """``f(impl)`` an attention of (q, k, v): its bf16 gradients with cuDNN equal xla's."""
    grad = lambda impl: jax.grad(lambda q, k, v: f(impl)(q, k, v).astype(jnp.float32).sum(),
                                 argnums=(0, 1, 2))(q, k, v)
    for g, w in zip(grad("cudnn"), grad("xla")):
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32),
                                   atol=6e-2, rtol=6e-2)


@pytest.mark.skipif(not ON_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("causal", [True, False])
def test_real_cudnn_equals_xla_on_packed_rows(causal):
    q, k, v = qkv(jnp.bfloat16, lq=64, lk=64)
    seg = packed_segments(64)
    f = lambda impl: lambda q, k, v: dot_product_attention(
        q, k, v, causal=causal, q_segment_ids=seg, kv_segment_ids=seg, implementation=impl)
    np.testing.assert_allclose(np.asarray(f("cudnn")(q, k, v), np.float32),
                               np.asarray(f("xla")(q, k, v), np.float32), atol=3e-2, rtol=3e-2)
    assert_cudnn_gradients_equal_xla(f, q, k, v)


@pytest.mark.skipif(not ON_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("per_row", [False, True])
def test_real_cudnn_with_t5s_relative_bias_equals_xla(per_row):
    """T5's bias `[1|B, H, L, S]` on cuDNN, packed rows: the output and the gradients of q, k, v
    and the bias (cuDNN's dbias) equal xla's, in bfloat16. Not run by this project: no GPU."""
    q, k, v = qkv(jnp.bfloat16, lq=64, lk=64)
    seg = packed_segments(64)
    bias = jnp.asarray(np.random.default_rng(4).normal(size=(B if per_row else 1, H, 64, 64)),
                       jnp.float32)
    f = lambda impl: lambda q, k, v, bias: dot_product_attention(
        q, k, v, bias=bias, q_segment_ids=seg, kv_segment_ids=seg, implementation=impl)
    np.testing.assert_allclose(np.asarray(f("cudnn")(q, k, v, bias), np.float32),
                               np.asarray(f("xla")(q, k, v, bias), np.float32), atol=3e-2, rtol=3e-2)
    grad = lambda impl: jax.grad(lambda *a: f(impl)(*a).astype(jnp.float32).sum(),
                                 argnums=(0, 1, 2, 3))(q, k, v, bias)
    for g, w in zip(grad("cudnn"), grad("xla")):
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32),
                                   atol=6e-2, rtol=6e-2)


@pytest.mark.skipif(not ON_TPU, reason="needs a TPU")
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_real_splash_equals_xla_on_packed_rows(dtype):
    q, k, v = qkv(dtype, lq=256, lk=256)
    seg = packed_segments(256)
    f = lambda impl: dot_product_attention(q, k, v, causal=True, q_segment_ids=seg,
                                           kv_segment_ids=seg, implementation=impl)
    np.testing.assert_allclose(np.asarray(f("splash"), np.float32),
                               np.asarray(f("xla"), np.float32), atol=3e-2, rtol=3e-2)  # TPU: bf16 passes


@pytest.mark.skipif(not ON_CUDA, reason="needs a CUDA GPU")
def test_real_cudnn_cross_attention_odd_lengths_and_user_mask():
    """Queries and keys of different odd lengths (padded to even inside the adapter), a user mask
    AND segments, a query document with no key of its id (zeros): forward and gradients."""
    lq, lk = 37, 23
    q, k, v = qkv(jnp.bfloat16, lq=lq, lk=lk)
    q_seg = np.ones((B, lq), np.int32)
    q_seg[:, 20:], q_seg[1, 30:] = 2, 3
    kv_seg = np.ones((B, lk), np.int32)
    kv_seg[:, 12:], kv_seg[0, 20:] = 2, 0
    q_seg, kv_seg = jnp.asarray(q_seg), jnp.asarray(kv_seg)
    mask = jnp.asarray(np.random.default_rng(2).random((B, H, lq, lk)) < 0.8)
    f = lambda impl: lambda q, k, v: dot_product_attention(
        q, k, v, mask=mask, q_segment_ids=q_seg, kv_segment_ids=kv_seg, implementation=impl)
    got = np.asarray(f("cudnn")(q, k, v), np.float32)
    np.testing.assert_allclose(got, np.asarray(f("xla")(q, k, v), np.float32), atol=3e-2, rtol=3e-2)
    assert np.all(got[1, 30:] == 0)
    assert_cudnn_gradients_equal_xla(f, q, k, v)


@pytest.mark.skipif(not ON_CUDA, reason="needs a CUDA GPU")
def test_real_cudnn_model_loss_and_gradients_equal_xla():
    """Through the blocks, in bfloat16 on packed rows: gpt_tiny (causal) and bert_tiny
    (bidirectional) with cuDNN attention give xla's outputs and parameter gradients."""
    seg = packed_segments(64)
    tokens = jnp.asarray(np.random.default_rng(3).integers(1, 100, (B, 64)), jnp.int32) * (seg != 0)
    for name in ("gpt_tiny", "bert_tiny"):
        cfg = ModelConfig.from_dict(preset(name, dtype="bfloat16", attention_dropout_rate=0.0,
                                           dropout_rate=0.0))
        params = build_model(cfg).init(jax.random.key(0))

        def loss(params, impl, cfg=cfg):
            out = build_model(cfg.replace(attention_impl=impl)).apply(params, tokens, segment_ids=seg)
            return jnp.mean(out.astype(jnp.float32) ** 2), out

        (lx, ox), gx = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)(params, "xla")
        (lc, oc), gc = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)(params,
                                                                                         "cudnn")
        np.testing.assert_allclose(np.asarray(oc, np.float32), np.asarray(ox, np.float32),
                                   atol=5e-2, rtol=5e-2)
        np.testing.assert_allclose(float(lc), float(lx), rtol=2e-2)
        for a, b in zip(jax.tree.leaves(gc), jax.tree.leaves(gx)):
            a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
            assert np.linalg.norm(a - b) <= 5e-2 * np.linalg.norm(b) + 1e-6, name
