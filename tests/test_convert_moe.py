"""Hugging Face Switch Transformers ↔ jaxformer: logits and greedy generation against PyTorch, also
where both drop tokens past capacity, import → export byte for byte, export → ``from_pretrained``;
and for the Mixtral / Qwen2-MoE converters (`tests/test_convert_mixtral.py` has their parity
tests): HF's routing against a float64 NumPy reference, the capacity path and the scanned layout on
the imported weights, config refusals, a jaxformer MoE decoder through HF files and back.

The Switch reference is a small random transformers model built by `build_switch`;
`tests/make_golden.py` commits it and `switch_outputs` (`tests/golden.py`), so the CPU suite needs no
torch; the ``hf`` tests load exports back into live PyTorch. Nothing is downloaded.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from golden import golden_dir, reference, rel_err
from test_convert_llama import MASK, V, _our_logits
from test_convert_llama import _randomized as randomized

from jaxformer.config import ModelConfig
from jaxformer.convert import hf_mixtral, hf_qwen2_moe, hf_switch, load_hf, save_hf
from jaxformer.convert.mapping import flatten
from jaxformer.decode import generate
from jaxformer.models import build_model
from jaxformer.models.presets import preset
from jaxformer.ops.moe import router_logits, top_k_gates

RTOL = 1e-5
# Switch: sources [2, 12] (3 right-padding positions in row 0), decoder inputs [2, 7]
SOURCES = np.random.default_rng(2).integers(2, V, (2, 12)).astype(np.int32)
SOURCE_MASK = np.ones_like(SOURCES)
SOURCE_MASK[0, 9:] = 0
TARGETS = np.random.default_rng(3).integers(2, V, (2, 7)).astype(np.int32)
# capacity_factor giving HF's expert_capacity=2 at both lengths: ceil(0.6·12/4) = ceil(0.6·7/4) = 2
DROP_CAPACITY_FACTOR = 0.6


def build_switch():
    """Switch-T5: 2 layers per stack, experts in layer 1 (num_sparse_*_layers=1 → step 2), 4 ReLU
    experts, top-1; tied head with the d_model^-0.5 rescale; expert_capacity 64: nothing dropped
    at these lengths (`switch_outputs` also runs it with 2)."""
    import torch
    import transformers
    cfg = transformers.SwitchTransformersConfig(
        vocab_size=V, d_model=32, d_kv=8, d_ff=32, num_layers=2, num_decoder_layers=2, num_heads=4,
        num_experts=4, expert_capacity=64, num_sparse_encoder_layers=1,
        num_sparse_decoder_layers=1, relative_attention_num_buckets=16,
        relative_attention_max_distance=20, decoder_start_token_id=0)
    model = randomized(transformers.SwitchTransformersForConditionalGeneration(cfg), 12)
    with torch.no_grad():  # logits of std ~1 (the tied head rescales by d_model^-0.5), so that
        model.decoder.final_layer_norm.weight.mul_(10.0)  # greedy tokens vary
    return model


def _switch_run(model) -> dict[str, np.ndarray]:
    import torch

    src, mask = torch.tensor(SOURCES).long(), torch.tensor(SOURCE_MASK).long()
    with torch.no_grad():
        logits = model(input_ids=src, attention_mask=mask,
                       decoder_input_ids=torch.tensor(TARGETS).long()).logits
        out = model.generate(src, attention_mask=mask, max_new_tokens=6, do_sample=False,
                             num_beams=1, eos_token_id=None, decoder_start_token_id=0)
    return {"logits": logits.numpy(), "greedy": out[:, 1:].numpy().astype(np.int32)}


def switch_outputs(model) -> dict[str, np.ndarray]:
    """``logits`` `[2, 7, V]` on (`SOURCES`, `TARGETS`) and ``greedy`` `[2, 6]` (cached decoding
    from decoder start 0, no EOS); ``logits_drop`` / ``greedy_drop`` the same with every router's
    expert_capacity set to 2 (most experts drop tokens)."""
    import transformers

    out = _switch_run(model)
    routers = [m for m in model.modules()
               if isinstance(m, transformers.models.switch_transformers.modeling_switch_transformers
                             .SwitchTransformersTop1Router)]
    assert routers
    for r in routers:
        r.expert_capacity = 2
    out.update({f"{k}_drop": v for k, v in _switch_run(model).items()})
    for r in routers:
        r.expert_capacity = model.config.expert_capacity
    return out


def test_mixtral_scanned_layout_and_capacity_path_give_the_same_logits():
    """The scanned import computes the same logits; so does the capacity path with room for
    every assignment (capacity_factor = E / k: C = length), which HF's dropless routing equals."""
    cfg, params, _ = load_hf(golden_dir("mixtral"), scan_layers=True)
    ref, valid = reference("mixtral")["logits"], MASK == 1
    assert rel_err(_our_logits(cfg, params)[valid], ref[valid]) <= RTOL
    roomy = dict(cfg, moe_dropless=False, capacity_factor=cfg["num_experts"] / 2)
    assert rel_err(_our_logits(roomy, params)[valid], ref[valid]) <= RTOL


def _numpy_routing(x, w_de, k, norm):
    """float64 HF routing (modeling_mixtral / modeling_qwen2_moe ``TopKRouter``): softmax over all
    E logits, the k largest, renormalised over them iff ``norm``."""
    logits = x.astype(np.float64) @ w_de.astype(np.float64)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    idx = np.argsort(-p, axis=-1, kind="stable")[..., :k]
    g = np.take_along_axis(p, idx, -1)
    return (g / g.sum(-1, keepdims=True) if norm else g), idx


@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe"])
def test_router_matches_hf_routing_in_float64(name):
    """Our router on the imported kernel picks HF's experts with HF's gates (float64 NumPy)."""
    cfg, params, _ = load_hf(golden_dir(name))
    c = ModelConfig.from_dict(cfg)
    kernel = np.asarray(flatten(params)[f"decoder/layer_{c.num_layers - 1}/ffn/router/kernel"])
    x = np.random.default_rng(0).normal(size=(2, 16, c.d_model)).astype(np.float32)
    gates, experts, _ = top_k_gates(router_logits(kernel, x), c.experts_per_token,
                                    norm_topk_prob=c.norm_topk_prob)
    want_g, want_i = _numpy_routing(x, kernel, c.experts_per_token, c.norm_topk_prob)
    np.testing.assert_array_equal(np.asarray(experts), want_i)
    np.testing.assert_allclose(np.asarray(gates), want_g, rtol=1e-5)
    assert np.allclose(want_g.sum(-1), 1.0) == c.norm_topk_prob


def _switch_logits(cfg: dict, params, **overrides) -> np.ndarray:
    model = build_model(ModelConfig.from_dict(dict(cfg, **overrides)))
    return np.asarray(jax.jit(model.apply)(params, SOURCES, TARGETS, inputs_segment_ids=SOURCE_MASK))


def _switch_greedy(cfg: dict, params, **overrides) -> np.ndarray:
    model = build_model(ModelConfig.from_dict(dict(cfg, **overrides)))
    prompts = [list(map(int, row[m == 1])) for row, m in zip(SOURCES, SOURCE_MASK)]
    return np.asarray(generate(model, params, prompts, max_new_tokens=6, eos_id=None).tokens)[:, :6]


@pytest.mark.parametrize("case,capacity_factor", [("", 4.0), ("_drop", DROP_CAPACITY_FACTOR)])
def test_switch_logits_greedy_and_round_trip(case, capacity_factor, tmp_path):
    """Capacity for every token (capacity_factor = E: C = length), and HF's capacity 2 where both
    drop tokens past it in sequence order (HF's cumsum priority = our positions_in_expert)."""
    path, ref = golden_dir("switch"), reference("switch")
    cfg, params, _ = load_hf(path)
    ours = _switch_logits(cfg, params, capacity_factor=capacity_factor)
    err = rel_err(ours, ref["logits" + case])
    print(f"switch{case}: max relative logit error {err:.2e}")
    assert err <= RTOL
    np.testing.assert_array_equal(_switch_greedy(cfg, params, capacity_factor=capacity_factor),
                                  ref["greedy" + case])
    dropless = _switch_logits(cfg, params, moe_dropless=True)
    assert (rel_err(dropless, ref["logits" + case]) > 1e-2) == (case == "_drop")  # drops matter
    out = tmp_path / "exported"
    save_hf(cfg, params, out)
    with open(f"{path}/model.safetensors", "rb") as a, open(out / "model.safetensors", "rb") as b:
        assert a.read() == b.read()
    assert load_hf(out)[0] == cfg


def test_switch_config_read():
    cfg, _, _ = load_hf(golden_dir("switch"))
    c = ModelConfig.from_dict(cfg)
    assert (c.num_experts, c.experts_per_token, c.norm_topk_prob, c.moe_every, c.moe_dropless,
            c.activation, c.gated_ffn, c.tie_embeddings, c.rescale_tied_logits) == (
        4, 1, False, 2, False, "relu", False, True, True)
    assert c.capacity_factor == 64 * 4 / c.max_len  # HF's count at max_len tokens
    assert (c.router_aux_loss_weight, c.router_z_loss_weight, c.router_jitter_noise) == (
        0.001, 0.001, 0.01)
    assert [i for i in range(2) if c.moe_layer(i)] == [1]


@pytest.mark.parametrize("layers,sparse", [(4, 2), (4, 4), (6, 3), (5, 2), (3, 1), (4, 1)])
def test_switch_sparse_layers_are_hf_s_or_refused(layers, sparse):
    """HF's rule (i % step == 1, or step 1) and ours ((i + 1) % moe_every == 0): imported when they
    name the same layers, refused naming the fields otherwise; exports write back HF's count."""
    want = hf_switch.hf_sparse_layers(layers, sparse)
    hf = {"num_layers": layers, "num_sparse_encoder_layers": sparse,
          "num_sparse_decoder_layers": sparse}
    ours = [[i for i in range(layers) if (i + 1) % m == 0] for m in range(1, layers + 1)]
    if want in ours:
        every = hf_switch._moe_every(hf)
        assert [i for i in range(layers) if (i + 1) % every == 0] == want
        assert hf_switch.hf_sparse_layers(layers, hf_switch._num_sparse(layers, every)) == want
    else:
        with pytest.raises(ValueError, match=f"num_sparse_encoder_layers={sparse}"):
            hf_switch._moe_every(hf)


def test_switch_refusals_name_the_field():
    cfg = ModelConfig.from_dict(load_hf(golden_dir("switch"))[0])
    with pytest.raises(ValueError, match="SwitchTransformers equivalent: experts_per_token=2"):
        hf_switch.config_to_hf(cfg.replace(experts_per_token=2))
    with pytest.raises(ValueError, match="router_bias=True"):
        hf_switch.config_from_hf({"router_bias": True}, {}, head=None, num_classes=None)
    hf, _ = hf_switch.config_to_hf(cfg.replace(capacity_factor=1.0, max_len=64))
    assert hf["expert_capacity"] == 16 and hf["num_sparse_encoder_layers"] == 1
    # switch_base_8: experts in 6 of its 12 layers per stack, written as that count
    hf, _ = hf_switch.config_to_hf(ModelConfig.from_dict(preset("switch_base_8")))
    assert (hf["num_sparse_encoder_layers"], hf["num_sparse_decoder_layers"], hf["num_experts"],
            hf["d_ff"], hf["num_layers"]) == (6, 6, 8, 3072, 12)


@pytest.mark.hf
def test_switch_export_loads_in_pytorch(tmp_path):
    """Import → export → ``from_pretrained``: the golden logits and greedy tokens (and the golden
    files are what this transformers computes)."""
    import transformers
    cfg, params, _ = load_hf(golden_dir("switch"))
    save_hf(cfg, params, tmp_path / "exported")
    ref = reference("switch")
    for path in (golden_dir("switch"), tmp_path / "exported"):
        model = transformers.SwitchTransformersForConditionalGeneration.from_pretrained(
            path, attn_implementation="eager").eval()
        got = switch_outputs(model)
        for case in ("", "_drop"):
            assert rel_err(got["logits" + case], ref["logits" + case]) <= RTOL
            np.testing.assert_array_equal(got["greedy" + case], ref["greedy" + case])


# --------------------------------------------------------------------------------------------------
# Torch-free: refusals name the HF field or ours.

QWEN = {"model_type": "qwen2_moe", "vocab_size": 96, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 64,
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
        "shared_expert_intermediate_size": 48, "mlp_only_layers": []}


@pytest.mark.parametrize("extra,field", [
    (dict(mlp_only_layers=[0]), "mlp_only_layers=[0]"),
    (dict(shared_expert_intermediate_size=36), "shared_expert_intermediate_size=36"),
    (dict(use_sliding_window=True, sliding_window=8), "use_sliding_window"),
])
def test_unsupported_qwen2_moe_variants_are_refused_naming_the_field(extra, field):
    with pytest.raises(ValueError, match=field.replace("[", r"\[")):
        hf_qwen2_moe.config_from_hf({**QWEN, **extra}, {}, head=None, num_classes=None)


def test_configs_with_no_hf_equivalent_are_refused_on_export():
    base = dict(family="decoder", position="rope", norm="rms", gated_ffn=True, activation="silu",
                use_bias=False, vocab_size=96, d_model=32, num_heads=4, d_ff=64, num_layers=2,
                num_experts=4)
    with pytest.raises(ValueError, match="Mixtral equivalent: moe_every=2"):
        hf_mixtral.config_to_hf(ModelConfig(**base, moe_every=2))
    with pytest.raises(ValueError, match="Mixtral equivalent: norm_topk_prob=False"):
        hf_mixtral.config_to_hf(ModelConfig(**base, norm_topk_prob=False))
    with pytest.raises(ValueError, match="Qwen2Moe equivalent: qkv_bias=False"):
        hf_qwen2_moe.config_to_hf(ModelConfig(**base, num_shared_experts=1, shared_expert_gate=True))
    hf, _ = hf_qwen2_moe.config_to_hf(ModelConfig(**base, num_shared_experts=2, moe_d_ff=16,
                                                  shared_expert_gate=True, moe_every=2,
                                                  qkv_bias=True))
    assert (hf["model_type"], hf["shared_expert_intermediate_size"], hf["decoder_sparse_step"],
            hf["architectures"]) == ("qwen2_moe", 32, 2, ["Qwen2MoeForCausalLM"])
    fields, _ = hf_qwen2_moe.config_from_hf(hf, {}, head=None, num_classes=None)
    assert (fields["num_shared_experts"], fields["moe_d_ff"], fields["moe_every"]) == (2, 16, 2)


def test_a_jaxformer_mixtral_round_trips_through_hf_files(tmp_path):
    """A fresh jaxformer MoE decoder (capacity path, its own aux-loss weight) → save_hf → load_hf:
    the same parameters and config (the compute / regularisation fields ride in jaxformer_config)."""
    cfg = ModelConfig(family="decoder", position="rope", norm="rms", gated_ffn=True,
                      activation="silu", use_bias=False, vocab_size=96, d_model=32, num_heads=4,
                      num_kv_heads=2, d_ff=48, num_layers=2, num_experts=4, capacity_factor=1.5,
                      router_aux_loss_weight=0.02, pooling="last")
    params = jax.jit(lambda k: build_model(cfg).init(k))(jax.random.key(0))
    save_hf(cfg, params, tmp_path / "out")
    back_cfg, back, _ = load_hf(tmp_path / "out")
    assert ModelConfig.from_dict(back_cfg) == cfg
    ours, theirs = flatten(jax.device_get(params)), flatten(back)
    assert sorted(ours) == sorted(theirs)
    for k in ours:
        np.testing.assert_array_equal(np.asarray(ours[k]), theirs[k])

