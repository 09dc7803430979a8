"""Hugging Face Mixtral ↔ jaxformer (MoE decoder): logits and greedy generation against PyTorch,
import → export byte for byte, export → ``from_pretrained`` (``hf`` tier).

The reference is a small random `MixtralForCausalLM` (4 experts, top-2, GQA, sliding window
shorter than the inputs) built by `build_mixtral`; `tests/make_golden.py` saves it and its outputs
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


def test_logits_greedy_and_byte_identical_round_trip(tmp_path):
    path, ref = golden_dir("mixtral"), reference("mixtral")
    cfg, params, _ = load_hf(path)
    model_cfg = ModelConfig.from_dict(cfg)
    assert (model_cfg.num_experts, model_cfg.experts_per_token, model_cfg.moe_dropless) == (4, 2, True)
    valid = llama.MASK == 1
    err = rel_err(llama._our_logits(cfg, params)[valid], ref["logits"][valid])
    print(f"mixtral: max relative logit error {err:.2e}")
    assert err <= llama.RTOL
    np.testing.assert_array_equal(llama._our_greedy(cfg, params), ref["greedy"])
    out = tmp_path / "exported"
    save_hf(cfg, params, out)
    with open(f"{path}/model.safetensors", "rb") as a, open(out / "model.safetensors", "rb") as b:
        assert a.read() == b.read()


@pytest.mark.hf
def test_export_loads_in_pytorch_with_the_same_logits(tmp_path):
    cfg, params, _ = load_hf(golden_dir("mixtral"))
    save_hf(cfg, params, tmp_path / "exported")
    valid = llama.MASK == 1
    got = llama.reference_outputs(llama._load_reference(tmp_path / "exported"))
    assert rel_err(got["logits"][valid], reference("mixtral")["logits"][valid]) <= llama.RTOL
    np.testing.assert_array_equal(got["greedy"], reference("mixtral")["greedy"])


def test_configs_with_no_mixtral_equivalent_are_refused_on_export(tmp_path):
    cfg, params, _ = load_hf(golden_dir("mixtral"))
    with pytest.raises(ValueError, match=r"no Hugging Face Mixtral equivalent: .*num_shared_experts"):
        save_hf(dict(cfg, num_shared_experts=1), params, tmp_path / "x")
