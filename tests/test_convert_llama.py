"""Hugging Face Llama / Mistral / Qwen2 ↔ jaxformer: logits and greedy generation against PyTorch,
export → ``from_pretrained``, import → export byte for byte; RoPE scalings against float64 NumPy.

The references are small random transformers models (PyTorch, CPU, float32, eager attention) built
from a fixed seed by the ``build_*`` functions below; `reference_outputs` computes what the tests
compare with (logits on `TOKENS`, greedy continuations of `PROMPTS`). `tests/make_golden.py` saves
both as committed golden files (`tests/golden.py`), which the tests read without torch; the ``hf``
tests load exports back into live PyTorch. Nothing is downloaded.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from golden import golden_dir, reference, rel_err

from jaxformer.cli.convert import main as convert_main
from jaxformer.config import ModelConfig
from jaxformer.convert import from_hf, hf_llama, load_hf, save_hf
from jaxformer.data.tokenizer import Tokenizer
from jaxformer.decode import generate
from jaxformer.models import build_model
from jaxformer.models.presets import preset
from jaxformer.ops.positions import RopeScaling, rope_frequencies

V = 96
TOKENS = np.random.default_rng(0).integers(3, V, (2, 20)).astype(np.int32)
MASK = np.ones_like(TOKENS)
MASK[1, 15:] = 0  # right padding in the second row
PROMPTS = np.random.default_rng(1).integers(3, V, (2, 6)).astype(np.int32)
NEW_TOKENS = 10
RTOL = 1e-5
SMALL = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             bos_token_id=None, eos_token_id=None, pad_token_id=None)


# --------------------------------------------------------------------------------------------------
# The reference models (one function per model) and their outputs.

def _randomized(model, seed: int):
    """``model`` with every weight redrawn from ``seed`` at std 0.1 (norm scales 1 ± 0.1), so that
    a swapped norm or a mis-mapped bias changes the logits."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = 0.1 * torch.randn(p.shape, generator=g)
            p.copy_(1 + noise if name.endswith("norm.weight") else noise)
    return model.eval()


def build_llama():
    """Llama 3.1-style: "llama3" RoPE scaling, GQA, untied head."""
    import transformers
    cfg = transformers.LlamaConfig(**SMALL, rope_theta=500.0, rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=16))
    return _randomized(transformers.LlamaForCausalLM(cfg), 0)


def build_llama_tied_bias():
    """Llama with every option the other models lack: tied embeddings, attention and MLP biases,
    "linear" RoPE scaling, one KV head (MQA), head_dim 32 ≠ hidden/heads."""
    import transformers
    cfg = transformers.LlamaConfig(**dict(SMALL, num_key_value_heads=1), head_dim=32,
                                   tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
                                   rope_scaling=dict(rope_type="linear", factor=2.0))
    return _randomized(transformers.LlamaForCausalLM(cfg), 1)


def build_mistral():
    """Mistral 7B v0.1-style sliding window, shorter than the inputs and the generations."""
    import transformers
    cfg = transformers.MistralConfig(**SMALL, sliding_window=5)
    return _randomized(transformers.MistralForCausalLM(cfg), 2)


def build_qwen2():
    """Qwen2: q/k/v biases only; Qwen2.5's long-context "yarn" RoPE scaling."""
    import transformers
    cfg = transformers.Qwen2Config(**SMALL, rope_scaling=dict(
        rope_type="yarn", factor=4.0, original_max_position_embeddings=16))
    return _randomized(transformers.Qwen2ForCausalLM(cfg), 3)


def build_llama_classifier():
    """LlamaForSequenceClassification (3 classes; HF reads the last token that is not pad)."""
    import transformers
    cfg = transformers.LlamaConfig(**dict(SMALL, pad_token_id=0), num_labels=3)
    return _randomized(transformers.LlamaForSequenceClassification(cfg), 4)


def build_llama_dynamic():
    """Dynamic NTK RoPE scaling, active: `TOKENS` (20) are longer than max_position_embeddings."""
    import transformers
    cfg = transformers.LlamaConfig(**dict(SMALL, max_position_embeddings=16), rope_scaling=dict(
        rope_type="dynamic", factor=2.0))
    return _randomized(transformers.LlamaForCausalLM(cfg), 5)


BUILDERS = {"llama": build_llama, "llama_dynamic": build_llama_dynamic,
            "llama_tied_bias": build_llama_tied_bias, "mistral": build_mistral, "qwen2": build_qwen2}


def reference_outputs(model) -> dict[str, np.ndarray]:
    """``logits`` `[2, 20, V]` on `TOKENS` (with `MASK`) and ``greedy`` `[2, NEW_TOKENS]`, the
    greedy continuations of `PROMPTS` (no EOS: every row runs to the end)."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor(TOKENS).long(), attention_mask=torch.tensor(MASK)).logits
        out = model.generate(torch.tensor(PROMPTS).long(), attention_mask=torch.ones(
            PROMPTS.shape, dtype=torch.long), do_sample=False, max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS, pad_token_id=0)
    return {"logits": logits.numpy(), "greedy": out[:, PROMPTS.shape[1]:].numpy()}


def _load_reference(path):
    import transformers
    return transformers.AutoModelForCausalLM.from_pretrained(
        path, attn_implementation="eager").eval()


# --------------------------------------------------------------------------------------------------
def _our_logits(cfg: dict, params) -> np.ndarray:
    model = build_model(ModelConfig.from_dict(cfg))
    return np.asarray(jax.jit(model.apply)(params, TOKENS, segment_ids=MASK))


def _our_greedy(cfg: dict, params) -> np.ndarray:
    model = build_model(ModelConfig.from_dict(cfg))
    return np.asarray(generate(model, params, PROMPTS, max_new_tokens=NEW_TOKENS,
                               eos_id=None).tokens)


@pytest.mark.parametrize("name,scan", [("llama", False), ("llama_dynamic", False),
                                       ("llama_tied_bias", False),
                                       ("mistral", False), ("qwen2", True)])
def test_logits_greedy_and_byte_identical_round_trip(name, scan, tmp_path):
    path, ref = golden_dir(name), reference(name)
    cfg, params, _ = load_hf(path, scan_layers=scan)
    valid = MASK == 1
    err = rel_err(_our_logits(cfg, params)[valid], ref["logits"][valid])
    print(f"{name}: max relative logit error {err:.2e}")
    assert err <= RTOL
    np.testing.assert_array_equal(_our_greedy(cfg, params), ref["greedy"])
    if name == "llama":  # the NNX front end reads the same directory
        nnx_logits = np.asarray(from_hf(path)(TOKENS, segment_ids=MASK))
        assert rel_err(nnx_logits[valid], ref["logits"][valid]) <= RTOL
    # import → export: the same file, byte for byte
    out = tmp_path / "exported"
    save_hf(cfg, params, out)
    with open(f"{path}/model.safetensors", "rb") as a, open(out / "model.safetensors", "rb") as b:
        assert a.read() == b.read()


@pytest.mark.hf
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_export_loads_in_pytorch_with_the_same_logits(name, tmp_path):
    cfg, params, _ = load_hf(golden_dir(name))
    save_hf(cfg, params, tmp_path / "exported")
    valid = MASK == 1
    assert rel_err(reference_outputs(_load_reference(tmp_path / "exported"))["logits"][valid],
                   reference(name)["logits"][valid]) <= RTOL


def test_configs_read_from_each_variant():
    want = {
        "llama": dict(rope_scaling="llama3", rope_theta=500.0, rope_scaling_factor=8.0,
                      rope_original_max_len=16, num_kv_heads=2, tie_embeddings=False,
                      use_bias=False, qkv_bias=False, sliding_window=None),
        "llama_tied_bias": dict(rope_scaling="linear", rope_scaling_factor=2.0, num_kv_heads=1,
                                head_dim=32, tie_embeddings=True, use_bias=True),
        "mistral": dict(sliding_window=5, rope_scaling="none", use_bias=False),
        "qwen2": dict(rope_scaling="yarn", rope_scaling_factor=4.0, qkv_bias=True,
                      use_bias=False, rope_beta_fast=32.0, rope_attention_factor=None),
    }
    for name, fields in want.items():
        cfg, _, _ = load_hf(golden_dir(name))
        assert {k: cfg[k] for k in fields} == fields, name
        assert (cfg["position"], cfg["norm"], cfg["gated_ffn"], cfg["activation"]) == (
            "rope", "rms", True, "silu")
        assert hf_llama.model_type_of(ModelConfig.from_dict(cfg)) == (
            "llama" if name.startswith("llama") else name)


def test_cli_round_trip_with_a_tokenizer_json(tmp_path):
    """``--from-hf`` → a jaxformer directory holding the weights and the checkpoint's
    tokenizer.json; ``--to-hf`` → the same model.safetensors, byte for byte, and the tokenizer."""
    from test_fast_tokenizer import SAMPLE, build_llama3_tokenizer

    cfg = ModelConfig.from_dict(preset("llama_tiny", vocab_size=V, rope_scaling="llama3",
                                       rope_scaling_factor=8.0, rope_original_max_len=32))
    params = jax.jit(lambda k: build_model(cfg).init(k))(jax.random.key(0))
    src, ckpt, back = tmp_path / "src", tmp_path / "ckpt", tmp_path / "back"
    save_hf(cfg, params, src)
    tok_dir = build_llama3_tokenizer(src)
    assert convert_main(["--from-hf", str(src), "--to", str(ckpt)]) == 0
    assert Tokenizer.load(ckpt / "tokenizer.model").encode(SAMPLE) == Tokenizer.load(
        f"{tok_dir}/tokenizer.json").encode(SAMPLE)
    assert convert_main(["--from", str(ckpt), "--to-hf", str(back)]) == 0
    assert (back / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    assert (back / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()
    assert load_hf(back)[0] == load_hf(src)[0]


def test_sequence_classifier_imports_with_pytorch_logits(tmp_path):
    """LlamaForSequenceClassification: no pad id in TOKENS (ids >= 3), so HF pools the last token."""
    cfg, params, _ = load_hf(golden_dir("llama_classifier"))
    assert (cfg["head"], cfg["num_classes"], cfg["pooling"]) == ("classify", 3, "last")
    ours = jax.jit(build_model(ModelConfig.from_dict(cfg)).apply)(params, TOKENS)
    assert ours.shape == (2, 3) and rel_err(ours, reference("llama_classifier")["logits"]) <= RTOL
    assert not params["classifier"]["bias"].any()  # HF's score has no bias
    with pytest.raises(ValueError, match="Llama equivalent: head='classify'"):
        save_hf(cfg, params, tmp_path / "out")


# --------------------------------------------------------------------------------------------------
# Torch-free: refusals name the HF field; the scalings against an independent float64 reference.

BASE = {"model_type": "llama", "vocab_size": V, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 64}


@pytest.mark.parametrize("extra,field", [
    (dict(rope_scaling={"rope_type": "su", "factor": 2.0}), "rope_scaling type 'su'"),
    (dict(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4}), "'longrope'"),
    (dict(partial_rotary_factor=0.5), "partial_rotary_factor=0.5"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 2.0, "truncate": False}), "truncate=False"),
    (dict(attention_bias=True), "attention_bias=True with mlp_bias=False"),
    (dict(model_type="qwen2", use_sliding_window=True, sliding_window=8), "use_sliding_window"),
    (dict(hidden_act="quick_gelu"), "hidden_act='quick_gelu'"),
])
def test_unsupported_variants_are_refused_naming_the_field(extra, field):
    with pytest.raises(ValueError, match=field.replace("(", r"\(")):
        hf_llama.config_from_hf({**BASE, **extra}, {}, head=None, num_classes=None)


def test_configs_with_no_hf_equivalent_are_refused_on_export():
    base = dict(family="decoder", position="rope", norm="rms", gated_ffn=True, activation="silu",
                use_bias=False, vocab_size=V, d_model=32, num_heads=4, d_ff=64, num_layers=1)
    with pytest.raises(ValueError, match="Qwen2 equivalent: sliding_window=4"):
        hf_llama.config_to_hf(ModelConfig(**base, qkv_bias=True, sliding_window=4))
    with pytest.raises(ValueError, match="Llama equivalent: norm='layer'"):
        hf_llama.config_to_hf(ModelConfig(**dict(base, norm="layer")))
    hf, prefix = hf_llama.config_to_hf(ModelConfig(**base, rope_scaling="yarn",
                                                   rope_scaling_factor=4.0,
                                                   rope_original_max_len=16))
    assert hf["rope_parameters"] == {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                                     "original_max_position_embeddings": 16, "beta_fast": 32.0,
                                     "beta_slow": 1.0}
    assert hf["rope_scaling"]["rope_type"] == "yarn" and prefix == "model."
    # imported back: the same fields
    fields, _ = hf_llama.config_from_hf(hf, {}, head=None, num_classes=None)
    assert (fields["rope_scaling"], fields["rope_scaling_factor"], fields["rope_original_max_len"]
            ) == ("yarn", 4.0, 16)


def _reference_frequencies(dim: int, theta: float, s: RopeScaling) -> np.ndarray:
    """float64, element by element: Meta's Llama 3.1 ``apply_scaling`` and the YaRN paper's
    ramp (Peng et al. 2023, eq. 18–20, the bounds floored/ceiled as its reference code does)."""
    out = []
    for i in range(dim // 2):
        f = theta ** (-2 * i / dim)
        if s.kind == "linear":
            f /= s.factor
        elif s.kind == "llama3":
            wavelen = 2 * math.pi / f
            if wavelen > s.original_max_len / s.low_freq_factor:
                f /= s.factor
            elif wavelen >= s.original_max_len / s.high_freq_factor:
                t = (s.original_max_len / wavelen - s.low_freq_factor) / (
                    s.high_freq_factor - s.low_freq_factor)
                f = (1 - t) * f / s.factor + t * f
        elif s.kind == "yarn":
            def dim_of(r):
                return dim * math.log(s.original_max_len / (2 * math.pi * r)) / (2 * math.log(theta))
            lo, hi = max(math.floor(dim_of(s.beta_fast)), 0), min(math.ceil(dim_of(s.beta_slow)),
                                                                   dim - 1)
            ramp = min(max((i - lo) / (hi - lo), 0.0), 1.0)
            f = f / s.factor * ramp + f * (1 - ramp)
        out.append(f)
    return np.array(out)


@pytest.mark.parametrize("scaling", [
    RopeScaling("linear", 4.0),
    RopeScaling("llama3", 8.0, 128, 1.0, 4.0),
    RopeScaling("yarn", 4.0, 128),
    RopeScaling("yarn", 16.0, 256, beta_fast=16.0, beta_slow=2.0),
])
def test_rope_scaling_frequencies_match_float64_reference(scaling):
    with jax.enable_x64(True):
        got = np.asarray(rope_frequencies(64, theta=10_000.0, scaling=scaling, dtype=np.float64))
    want = _reference_frequencies(64, 10_000.0, scaling)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    unscaled = _reference_frequencies(64, 10_000.0, RopeScaling())
    assert np.any(np.abs(want / unscaled - 1) > 0.5)  # the scaling changes some frequencies
    if scaling.kind != "linear":  # and keeps the fastest ones
        assert want[0] == unscaled[0]


def test_sliding_window_invariants_and_chunked_attention():
    """A window as long as the rows is the plain causal model; a shorter one changes only the
    positions past it; the chunked kernel computes the same windowed attention as XLA."""
    cfg = ModelConfig.from_dict(preset("llama_tiny", vocab_size=V, attention_chunk_size=4))
    params = jax.jit(lambda k: build_model(cfg).init(k))(jax.random.key(1))

    def logits(**kw):
        c = cfg.replace(**kw)
        return np.asarray(jax.jit(build_model(c).apply)(params, TOKENS,
                                                        segment_ids=MASK))

    full = logits()
    np.testing.assert_array_equal(logits(sliding_window=TOKENS.shape[1]), full)
    windowed = logits(sliding_window=5)
    np.testing.assert_allclose(windowed[:, :5], full[:, :5], rtol=1e-6, atol=1e-6)
    assert rel_err(windowed[:, 5:], full[:, 5:]) > 1e-3
    chunked = logits(sliding_window=5, attention_impl="chunked")
    assert rel_err(chunked[MASK == 1], windowed[MASK == 1]) <= 1e-6


def test_dynamic_ntk_scales_the_base_beyond_the_context_only():
    s, dim = RopeScaling("dynamic", 2.0, 16), 32
    plain = np.asarray(rope_frequencies(dim, theta=1e4))
    for n in (None, 5, 16):
        np.testing.assert_array_equal(rope_frequencies(dim, theta=1e4, scaling=s, seq_len=n), plain)
    base = 1e4 * (2.0 * 40 / 16 - 1.0) ** (dim / (dim - 2))  # n = 40
    want = base ** (-2.0 * np.arange(dim // 2) / dim)
    np.testing.assert_allclose(rope_frequencies(dim, theta=1e4, scaling=s, seq_len=40), want,
                               rtol=2e-6)


def test_yarn_scales_cos_and_sin_by_its_attention_factor():
    assert RopeScaling("yarn", 4.0, 128).cos_sin_scale == pytest.approx(0.1 * math.log(4) + 1)
    assert RopeScaling("yarn", 4.0, 128, attention_factor=1.5).cos_sin_scale == 1.5
    assert RopeScaling("llama3", 8.0, 128).cos_sin_scale == 1.0
