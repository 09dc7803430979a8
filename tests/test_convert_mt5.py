"""mT5 (Xue et al. 2021) and Flan-T5 (Chung et al. 2022) are T5 v1.1 graphs (gated-GELU FFN, untied
LM head, no d_model^-0.5 rescale): their checkpoints import through `jaxformer.convert.hf_t5`
(mT5's ``model_type`` is "mt5") with PyTorch's logits, and export back to the same tensors, read by
``T5ForConditionalGeneration``. Models and references as in tests/test_convert_llama.py (golden
files, `tests/golden.py`; the ``hf`` test loads the export into live PyTorch)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from golden import golden_dir, reference, rel_err
from safetensors.numpy import load_file

from jaxformer.config import ModelConfig
from jaxformer.convert import load_hf, save_hf
from jaxformer.models import build_model

V = 96
INPUTS = np.random.default_rng(0).integers(2, V, (2, 11)).astype(np.int32)
TARGETS = np.random.default_rng(1).integers(2, V, (2, 7)).astype(np.int32)
SMALL = dict(vocab_size=V, d_model=64, d_kv=16, d_ff=96, num_layers=2, num_decoder_layers=2,
             num_heads=4, relative_attention_num_buckets=16, relative_attention_max_distance=32,
             feed_forward_proj="gated-gelu", tie_word_embeddings=False)


def _untied(model, seed: int):
    """transformers 5 ties ``lm_head`` to ``shared`` whatever the config says; the published mT5
    and Flan-T5 checkpoints store their own head, so give it its own weights."""
    import torch

    g = torch.Generator().manual_seed(seed)
    model.lm_head.weight = torch.nn.Parameter(torch.randn(model.lm_head.weight.shape, generator=g))
    return model.eval()


def build_mt5():
    import torch
    import transformers
    torch.manual_seed(0)
    return _untied(transformers.MT5ForConditionalGeneration(transformers.MT5Config(**SMALL)), 0)


def build_flan_t5():
    import torch
    import transformers
    torch.manual_seed(1)
    return _untied(transformers.T5ForConditionalGeneration(transformers.T5Config(**SMALL)), 1)


BUILDERS = {"mt5": build_mt5, "flan_t5": build_flan_t5}


def reference_outputs(model) -> dict[str, np.ndarray]:
    """``logits`` `[2, 7, V]` of `TARGETS` given `INPUTS` (teacher forcing)."""
    import torch
    with torch.no_grad():
        out = model(input_ids=torch.tensor(INPUTS).long(),
                    decoder_input_ids=torch.tensor(TARGETS).long())
    return {"logits": out.logits.numpy()}


def _load(path):
    import transformers
    return transformers.AutoModelForSeq2SeqLM.from_pretrained(
        path, attn_implementation="eager").eval()


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_t5_v1_1_variants_round_trip(name, tmp_path):
    path = golden_dir(name)
    ref = reference(name)["logits"]
    cfg, params, _ = load_hf(path)
    assert (cfg["gated_ffn"], cfg["activation"], cfg["tie_embeddings"],
            cfg["rescale_tied_logits"]) == (True, "gelu_tanh", False, False)
    ours = jax.jit(build_model(ModelConfig.from_dict(cfg)).apply)(params, INPUTS,
                                                                  TARGETS)
    assert rel_err(ours, ref) <= 1e-5
    save_hf(cfg, params, tmp_path / "out")
    src, dst = load_file(f"{path}/model.safetensors"), load_file(tmp_path / "out" /
                                                                 "model.safetensors")
    assert sorted(dst) == sorted(src)
    for k in src:
        np.testing.assert_array_equal(dst[k], src[k], err_msg=k)


@pytest.mark.hf
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_export_loads_in_pytorch_with_the_same_logits(name, tmp_path):
    cfg, params, _ = load_hf(golden_dir(name))
    save_hf(cfg, params, tmp_path / "out")
    assert rel_err(reference_outputs(_load(tmp_path / "out"))["logits"],
                   reference(name)["logits"]) <= 1e-5


def test_stack_tables_that_differ_from_shared_are_refused_and_copies_import(tmp_path):
    """transformers writes ``encoder.embed_tokens`` / ``decoder.embed_tokens`` as copies of
    ``shared``, which import; a file whose tables differ (once imported silently, logits off) is
    refused naming them."""
    from golden import golden_copy
    from safetensors.numpy import save_file

    src = tmp_path / "mt5"
    golden_copy("mt5", src)
    tensors = load_file(src / "model.safetensors")
    _, want, _ = load_hf(src)
    shared = tensors["shared.weight"]
    save_file({**tensors, "encoder.embed_tokens.weight": shared.copy(),
               "decoder.embed_tokens.weight": shared.copy()}, src / "model.safetensors",
              metadata={"format": "pt"})
    _, params, _ = load_hf(src)
    jax.tree.map(np.testing.assert_array_equal, params, want)
    save_file({**tensors, "encoder.embed_tokens.weight": shared.copy(),
               "decoder.embed_tokens.weight": shared + 1.0}, src / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"checkpoint's decoder\.embed_tokens\.weight differ from "
                                         r"shared\.weight"):
        load_hf(src)


def test_an_mt5_exports_as_mt5_and_a_t5_as_t5(tmp_path):
    """The model type survives a round trip through a jaxformer checkpoint (an mT5, never rescaled,
    is written as one); the same weights from a T5 source stay "t5"."""
    import json

    from jaxformer.convert.directory import export_hf_dir, import_hf_dir

    import_hf_dir(golden_dir("mt5"), str(tmp_path / "ckpt"))
    export_hf_dir(str(tmp_path / "ckpt"), str(tmp_path / "out"))
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("mt5", ["MT5ForConditionalGeneration"])
    cfg, params, _ = load_hf(tmp_path / "out")
    assert cfg == load_hf(golden_dir("mt5"))[0]
    save_hf(cfg, params, tmp_path / "t5")
    assert json.loads((tmp_path / "t5" / "config.json").read_text())["model_type"] == "t5"
