"""Hugging Face ViT (``ViTForImageClassification`` / ``ViTModel``) ↔ jaxformer: outputs against
PyTorch's at the model's resolution and at a larger one (positions resampled bicubically as HF's
``interpolate_pos_encoding``), export → the HF-saved tensors and config, and live PyTorch (``hf``).

The references are tiny random transformers models (every weight redrawn at std 0.1), saved with
their outputs as golden files by `tests/make_golden.py` (cases ``vit_cls``, ``vit_model``), so the
CPU tests need no torch. Nothing is downloaded.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from golden import golden_dir, reference, rel_err
from safetensors.numpy import load_file

from jaxformer.config import ModelConfig
from jaxformer.convert import hf_vit, load_hf, save_hf
from jaxformer.models import build_model
from jaxformer.ops.patches import resize_matrix

RTOL = 1e-5


def _images(nchw: np.ndarray) -> np.ndarray:
    """HF's ``pixel_values`` `[B, C, H, W]` → jaxformer's `[B, H, W, C]`."""
    return np.ascontiguousarray(nchw.transpose(0, 2, 3, 1))


def _run(directory, **kw):
    cfg, params, _ = load_hf(directory, **kw)
    model = build_model(ModelConfig.from_dict(cfg))
    return cfg, params, lambda x: model.apply(params, images=_images(x))


def test_classifier_logits_match_pytorch_at_both_resolutions():
    ref = reference("vit_cls")
    cfg, _, run = _run(golden_dir("vit_cls"))
    assert (cfg["image_size"], cfg["patch_size"], cfg["num_channels"], cfg["head"],
            cfg["num_classes"], cfg["pooler"]) == (8, 2, 3, "classify", 5, False)
    assert rel_err(run(ref["pixel_values"]), ref["logits"]) <= RTOL
    assert rel_err(run(ref["pixel_values_big"]), ref["logits_big"]) <= RTOL  # 6×6 grid, bicubic


def test_backbone_hidden_states_and_pooler_match_pytorch():
    ref = reference("vit_model")
    cfg, _, run = _run(golden_dir("vit_model"))
    assert (cfg["head"], cfg["pooler"], cfg["pooler_activation"]) == ("none", True, "tanh")
    for suffix in ("", "_big"):
        hidden, pooled = run(ref[f"pixel_values{suffix}"])
        assert rel_err(hidden, ref[f"last_hidden_state{suffix}"]) <= RTOL
        assert rel_err(pooled, ref[f"pooler_output{suffix}"]) <= RTOL


def test_a_classifier_head_on_the_backbone_checkpoint_starts_fresh():
    cfg, params, _ = load_hf(golden_dir("vit_model"), head="classify", num_classes=7)
    assert params["classifier"]["kernel"].shape == (32, 7) and not cfg["pooler"]
    assert "pooler" not in params  # ViTForImageClassification has none: the checkpoint's is dropped


@pytest.mark.parametrize("name", ["vit_cls", "vit_model"])
def test_export_gives_back_the_hf_saved_tensors_and_config(name, tmp_path):
    cfg, params, _ = load_hf(golden_dir(name))
    save_hf(cfg, params, tmp_path)
    ours, theirs = load_file(tmp_path / "model.safetensors"), load_file(
        f"{golden_dir(name)}/model.safetensors")
    assert sorted(ours) == sorted(theirs)
    for key, value in theirs.items():
        np.testing.assert_array_equal(ours[key], value, err_msg=key)
    exported = json.loads((tmp_path / "config.json").read_text())
    original = json.loads(open(f"{golden_dir(name)}/config.json").read())
    for key in ("architectures", "model_type", "hidden_size", "num_hidden_layers",
                "num_attention_heads", "intermediate_size", "hidden_act", "layer_norm_eps",
                "image_size", "patch_size", "num_channels", "qkv_bias", "pooler_act"):
        assert exported[key] == original[key], key
    assert load_hf(tmp_path)[0] == cfg


def test_configs_with_no_hf_equivalent_are_refused():
    base = dict(family="encoder", image_size=8, patch_size=2, d_model=16, num_heads=2, d_ff=32,
                num_layers=1, head="classify", norm_position="pre")
    with pytest.raises(ValueError, match="ViT equivalent: norm_position='post'"):
        hf_vit.config_to_hf(ModelConfig(**dict(base, norm_position="post")))
    with pytest.raises(ValueError, match="ViT equivalent: class_token=False"):
        hf_vit.config_to_hf(ModelConfig(**base, class_token=False, pooling="mean"))
    with pytest.raises(ValueError, match="qkv_bias=False is not supported"):
        hf_vit.config_from_hf({"qkv_bias": False}, {}, head=None, num_classes=None)


# --------------------------------------------------------------------------------------------------
# Live PyTorch (the `hf` tier): a fresh jaxformer ViT exported and run by transformers; the 1-D
# resampling weights against torch's own interpolate.


@pytest.mark.hf
def test_fresh_export_runs_in_pytorch_with_the_same_logits(tmp_path):
    import jax
    import torch
    import transformers

    cfg = ModelConfig(family="encoder", image_size=12, patch_size=4, num_channels=3, d_model=24,
                      num_heads=3, d_ff=40, num_layers=2, head="classify", num_classes=4,
                      norm_position="pre", norm_eps=1e-12, init_std=0.1, embed_init_std=0.1)
    params = build_model(cfg).init(jax.random.key(3))
    save_hf(cfg, params, tmp_path)
    hf = transformers.ViTForImageClassification.from_pretrained(tmp_path, attn_implementation="eager")
    x = np.random.default_rng(0).normal(size=(2, 3, 12, 12)).astype(np.float32)
    with torch.no_grad():
        want = hf.eval()(pixel_values=torch.tensor(x)).logits.numpy()
    assert rel_err(build_model(cfg).apply(params, images=_images(x)), want) <= RTOL


@pytest.mark.hf
@pytest.mark.parametrize("method", ["bicubic", "bilinear"])
def test_resize_matrix_is_torch_interpolate(method):
    import torch

    for n_in, n_out in [(4, 7), (7, 4), (14, 24), (3, 3)]:
        x = np.random.default_rng(n_in).normal(size=(n_in, n_in))
        want = torch.nn.functional.interpolate(torch.tensor(x)[None, None], size=(n_out, n_out),
                                               mode=method, align_corners=False)[0, 0].numpy()
        r = resize_matrix(n_in, n_out, method)
        np.testing.assert_allclose(r @ x @ r.T, want, rtol=1e-10, atol=1e-10)
