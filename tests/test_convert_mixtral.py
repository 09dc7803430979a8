"""Hugging Face Mixtral and Qwen2-MoE ↔ jaxformer (MoE decoders): logits and greedy generation
against PyTorch, import → export byte for byte, export → ``from_pretrained`` (``hf`` tier).

The references are a small random `MixtralForCausalLM` (4 experts, top-2, GQA, sliding window
shorter than the inputs) and `Qwen2MoeForCausalLM` (gated shared expert, MoE every other layer),
built by `build_mixtral` / `build_qwen2_moe`; `tests/make_golden.py` saves it and its outputs
on `tests/test_convert_llama.py`'s inputs as a committed golden file, read here without torch.
"""

from __future__ import annotations

import numpy as np
import pytest
import test_convert_llama as llama
from golden import golden_dir, reference, rel_err

from jaxformer.config import ModelConfig
from jaxformer.convert import load_hf, save_hf


def build_mixtral():
    """Mixtral-style: 4 experts of width 96, top-2 renormalised, sliding window 5."""
    import transformers
    cfg = transformers.MixtralConfig(**llama.SMALL, num_local_experts=4, num_experts_per_tok=2,
                                     sliding_window=5, rope_theta=1e6)
    return llama._randomized(transformers.MixtralForCausalLM(cfg), 7)


def build_qwen2_moe():
    """Qwen2-MoE: 4 experts of width 32, top-2 unnormalised, a gated shared expert 64 wide (2 × 32),
    MoE in every other layer (decoder_sparse_step 2: layer 1; layer 0 keeps the dense mlp)."""
    import transformers
    cfg = transformers.Qwen2MoeConfig(**llama.SMALL, num_experts=4, num_experts_per_tok=2,
                                      moe_intermediate_size=32, shared_expert_intermediate_size=64,
                                      decoder_sparse_step=2, norm_topk_prob=False)
    return llama._randomized(transformers.Qwen2MoeForCausalLM(cfg), 8)


CASES = {"mixtral": (4, 2, 1, 0), "qwen2_moe": (4, 2, 2, 2)}  # E, k, moe_every, shared experts


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_greedy_and_byte_identical_round_trip(name, tmp_path):
    path, ref = golden_dir(name), reference(name)
    cfg, params, _ = load_hf(path)
    m = ModelConfig.from_dict(cfg)
    assert (m.num_experts, m.experts_per_token, m.moe_every, m.num_shared_experts) == CASES[name]
    assert m.moe_dropless
    valid = llama.MASK == 1
    err = rel_err(llama._our_logits(cfg, params)[valid], ref["logits"][valid])
    print(f"{name}: max relative logit error {err:.2e}")
    assert err <= llama.RTOL
    np.testing.assert_array_equal(llama._our_greedy(cfg, params), ref["greedy"])
    out = tmp_path / "exported"
    save_hf(cfg, params, out)
    with open(f"{path}/model.safetensors", "rb") as a, open(out / "model.safetensors", "rb") as b:
        assert a.read() == b.read()


@pytest.mark.hf
@pytest.mark.parametrize("name", sorted(CASES))
def test_export_loads_in_pytorch_with_the_same_logits(name, tmp_path):
    cfg, params, _ = load_hf(golden_dir(name))
    save_hf(cfg, params, tmp_path / "exported")
    valid = llama.MASK == 1
    got = llama.reference_outputs(llama._load_reference(tmp_path / "exported"))
    assert rel_err(got["logits"][valid], reference(name)["logits"][valid]) <= llama.RTOL
    np.testing.assert_array_equal(got["greedy"], reference(name)["greedy"])


def test_configs_with_no_mixtral_equivalent_are_refused_on_export(tmp_path):
    cfg, params, _ = load_hf(golden_dir("mixtral"))
    with pytest.raises(ValueError, match=r"no Hugging Face Mixtral equivalent: .*num_shared_experts"):
        save_hf(dict(cfg, num_shared_experts=1), params, tmp_path / "x")
