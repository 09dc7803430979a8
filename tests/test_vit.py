"""The Vision Transformer (Dosovitskiy et al. 2021): patch extraction and projection, the resampled
position grid, the model's invariants, its config errors and fine-tuning at another resolution,
against float64 NumPy references written here from the paper's definitions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.config import ModelConfig
from jaxformer.models import build_model
from jaxformer.models.image_size import fit_image_size
from jaxformer.ops.patches import (
    embed_patches,
    patchify,
    resize_matrix,
    resize_positions,
)

TINY = dict(family="encoder", image_size=8, patch_size=2, num_channels=3, d_model=16, num_heads=2,
            d_ff=32, num_layers=2, head="classify", num_classes=5, norm_position="pre",
            dropout_rate=0.0, attention_dropout_rate=0.0)


def tiny(**kw) -> ModelConfig:
    return ModelConfig(**{**TINY, **kw})


def np_patches(images: np.ndarray, p: int) -> np.ndarray:
    """Patch ``(i, j)`` of the grid, row-major, by explicit slicing: `[B, N, P, P, C]`."""
    b, h, w, c = images.shape
    return np.stack([np.stack([images[k, i:i + p, j:j + p] for i in range(0, h, p)
                               for j in range(0, w, p)]) for k in range(b)])


def test_patchify_is_row_major_slicing():
    x = np.random.default_rng(0).normal(size=(2, 8, 12, 3)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(patchify(jnp.asarray(x), 4)), np_patches(x, 4))


def test_patchify_rejects_a_size_that_is_not_whole_patches():
    with pytest.raises(ValueError, match="do not divide into 3x3 patches"):
        patchify(jnp.zeros((1, 8, 9, 3)), 3)


def test_embed_patches_is_a_strided_convolution():
    """Eq. 1's x_p E: each flattened patch times the projection, = a P×P convolution of stride P."""
    rng = np.random.default_rng(1)
    x, k, bias = rng.normal(size=(2, 8, 8, 3)), rng.normal(size=(4, 4, 3, 5)), rng.normal(size=5)
    want = np_patches(x, 4).reshape(2, 4, -1) @ k.reshape(-1, 5) + bias
    got = embed_patches({"kernel": jnp.asarray(k, jnp.float32), "bias": jnp.asarray(bias, jnp.float32)},
                        jnp.asarray(x, jnp.float32))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    conv = jax.lax.conv_general_dilated(jnp.asarray(x, jnp.float32), jnp.asarray(k, jnp.float32),
                                        (4, 4), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    np.testing.assert_allclose(np.asarray(got), np.asarray(conv).reshape(2, 4, 5) + bias, rtol=1e-5,
                               atol=1e-5)


def np_interpolate(signal: np.ndarray, n_out: int, method: str) -> np.ndarray:
    """PyTorch's ``interpolate(align_corners=False)`` in 1-D, sample by sample, float64 (the
    formulas of aten/src/ATen/native/UpSample.h: source index, clamping, Keys' a = -0.75)."""
    n_in, out = len(signal), []

    def at(i):
        return signal[min(max(i, 0), n_in - 1)]

    for o in range(n_out):
        s = (o + 0.5) * n_in / n_out - 0.5
        if method == "bilinear":
            s = max(s, 0.0)
            i = int(np.floor(s))
            t = s - i
            out.append((1 - t) * at(i) + t * at(i + 1))
            continue
        i = int(np.floor(s))
        t = s - i
        a = -0.75
        w = [((a * x - 5 * a) * x + 8 * a) * x - 4 * a if x > 1 else ((a + 2) * x - (a + 3)) * x * x + 1
             for x in (t + 1, t, 1 - t, 2 - t)]
        out.append(sum(wk * at(i - 1 + k) for k, wk in enumerate(w)))
    return np.array(out)


@pytest.mark.parametrize("method", ["bicubic", "bilinear"])
@pytest.mark.parametrize("n_in,n_out", [(4, 7), (7, 4), (5, 5), (3, 12)])
def test_resize_matrix_matches_sample_by_sample_interpolation(method, n_in, n_out):
    signal = np.random.default_rng(n_in * 13 + n_out).normal(size=n_in)
    np.testing.assert_allclose(resize_matrix(n_in, n_out, method) @ signal,
                               np_interpolate(signal, n_out, method), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(resize_matrix(n_in, n_out, method).sum(1), 1.0, atol=1e-12)


def test_resize_matrix_same_size_is_identity_and_reproduces_a_ramp():
    np.testing.assert_allclose(resize_matrix(6, 6, "bicubic"), np.eye(6), atol=1e-12)
    ramp = np.arange(6.0)  # a linear signal, resampled at interior points, stays linear
    out = resize_matrix(6, 12, "bilinear") @ ramp
    src = (np.arange(12) + 0.5) / 2 - 0.5
    inside = (src >= 0) & (src <= 5)
    np.testing.assert_allclose(out[inside], src[inside], atol=1e-12)


def test_resize_positions_is_2d_interpolation_keeping_the_class_row():
    rng = np.random.default_rng(2)
    table = rng.normal(size=(1 + 3 * 4, 2))
    got = np.asarray(resize_positions(jnp.asarray(table, jnp.float32), (3, 4), (5, 2), leading=1,
                                      method="bicubic"))
    grid = table[1:].reshape(3, 4, 2)
    rows = np.stack([np.stack([np_interpolate(grid[i, :, d], 2, "bicubic") for i in range(3)])
                     for d in range(2)], -1)  # [3, 2, D]: along the width first
    want = np.stack([np.stack([np_interpolate(rows[:, j, d], 5, "bicubic") for j in range(2)], 0)
                     for d in range(2)], -1).transpose(1, 0, 2)  # then the height: [5, 2, D]
    np.testing.assert_allclose(got[0], table[0], rtol=1e-6)
    np.testing.assert_allclose(got[1:], want.reshape(10, 2), rtol=1e-5, atol=1e-5)


def _init(cfg, seed=0):
    return build_model(cfg).init(jax.random.key(seed))


def _permute_patches(images: np.ndarray, p: int, perm: np.ndarray) -> np.ndarray:
    """``images`` whose patch ``n`` is the original's patch ``perm[n]``."""
    b, h, w, c = images.shape
    g = w // p
    patches = np_patches(images, p)[:, perm]
    return patches.reshape(b, h // p, g, p, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)


def test_patch_permutation_with_its_positions_leaves_the_logits_unchanged():
    """Attention is permutation-equivariant: shuffling the patches and their position rows together
    changes nothing (class-token pooling); without positions, shuffling patches alone does not
    either (mean pooling) — positions are the model's only sense of where a patch is."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 8, 8, 3)).astype(np.float32)
    perm = rng.permutation(16)
    cfg = tiny()
    params = _init(cfg)
    model = build_model(cfg)
    shuffled = jax.tree.map(lambda a: a, params)
    pos = np.asarray(params["embed"]["pos_embedding"])
    shuffled["embed"]["pos_embedding"] = jnp.asarray(np.concatenate([pos[:1], pos[1:][perm]]))
    y = model.apply(params, images=jnp.asarray(x))
    y_perm = model.apply(shuffled, images=jnp.asarray(_permute_patches(x, 2, perm)))
    np.testing.assert_allclose(np.asarray(y_perm), np.asarray(y), rtol=1e-4, atol=1e-5)
    assert not np.allclose(np.asarray(model.apply(params, images=jnp.asarray(_permute_patches(x, 2, perm)))),
                           np.asarray(y), atol=1e-4)  # positions matter when they are not permuted
    bag = tiny(position="none", class_token=False, pooling="mean")
    p2 = _init(bag)
    a = build_model(bag).apply(p2, images=jnp.asarray(x))
    b = build_model(bag).apply(p2, images=jnp.asarray(_permute_patches(x, 2, perm)))
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5)


def test_class_token_and_mean_pooling_read_what_they_say():
    x = jnp.asarray(np.random.default_rng(4).normal(size=(2, 8, 8, 3)), jnp.float32)
    for pooling in ("first", "mean"):
        cfg = tiny(pooling=pooling)
        params = _init(cfg)
        hidden = build_model(cfg.replace(head="none")).apply(
            {k: v for k, v in params.items() if k != "classifier"}, images=x)
        assert hidden.shape == (2, 17, 16)
        pooled = hidden[:, 0] if pooling == "first" else hidden[:, 1:].mean(1)
        want = pooled @ params["classifier"]["kernel"] + params["classifier"]["bias"]
        np.testing.assert_allclose(np.asarray(build_model(cfg).apply(params, images=x)),
                                   np.asarray(want), rtol=1e-5, atol=1e-5)


def test_another_resolution_reads_the_resampled_grid_as_fine_tuning_stores_it():
    """The model applied to 12×12 images (a 6×6 grid) computes what the 12×12 model does with the
    parameters `fit_image_size` gives (what ``init_from`` at a new image_size loads)."""
    cfg, big = tiny(), tiny(image_size=12)
    params = _init(cfg)
    x = jnp.asarray(np.random.default_rng(5).normal(size=(2, 12, 12, 3)), jnp.float32)
    fitted = fit_image_size(params, cfg, big)
    assert fitted["embed"]["pos_embedding"].shape == (37, 16)
    np.testing.assert_allclose(np.asarray(build_model(big).apply(fitted, images=x)),
                               np.asarray(build_model(cfg).apply(params, images=x)), rtol=1e-5,
                               atol=1e-5)
    assert fit_image_size(params, cfg, cfg) is params


@pytest.mark.parametrize("kw,message", [
    (dict(image_size=9), "model.image_size=9 is invalid: must be a multiple of patch_size=2"),
    (dict(family="decoder", pooling="last"), "model.family='decoder' is invalid"),
    (dict(head="mlm"), "model.head='mlm' is invalid: an image model has no vocabulary"),
    (dict(class_token=False), "model.pooling='first' is invalid: reads the class token"),
    (dict(pooling="max"), "model.pooling='max' is invalid"),
    (dict(position="rope"), "model.position='rope' is invalid"),
    (dict(type_vocab_size=2), "model.type_vocab_size=2 is invalid: is a text model's option"),
    (dict(position_interpolation="nearest"), "model.position_interpolation='nearest' is invalid"),
    (dict(patch_size=0), "model.patch_size=0 is invalid: must be a positive integer"),
])
def test_bad_image_configs_name_the_field(kw, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        tiny(**kw)


def test_images_of_the_wrong_shape_are_refused_before_compiling():
    cfg = tiny()
    params = _init(cfg)
    with pytest.raises(ValueError, match="num_channels=3"):
        build_model(cfg).apply(params, images=jnp.zeros((1, 8, 8, 1)))
    with pytest.raises(ValueError, match="do not divide into model.patch_size=2"):
        build_model(cfg).apply(params, images=jnp.zeros((1, 9, 9, 3)))
    with pytest.raises(ValueError, match="reads images"):
        build_model(cfg).apply(params, jnp.zeros((1, 4), jnp.int32))


@pytest.mark.parametrize("name,want,backbone", [("vit_base_16", 86_567_656, 85_798_656),
                                                ("vit_large_16", 304_326_632, 303_301_632)])
def test_presets_have_the_published_parameter_counts(name, want, backbone):
    """HF ``ViTForImageClassification`` (224 px, 1000 classes) and ``ViTModel`` without its pooler,
    counted by transformers 5.24 (the paper rounds: 86M, 307M)."""
    from jaxformer.models.presets import preset

    cfg = ModelConfig.from_dict(preset(name))
    count = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(build_model(cfg).abstract()))
    assert count == want
    assert count - cfg.d_model * cfg.num_classes - cfg.num_classes == backbone


def test_scanned_layers_and_the_nnx_module_compute_the_same():
    from jaxformer.convert.mapping import stack_layers
    from jaxformer.models import Transformer

    cfg = tiny()
    params = _init(cfg)
    x = jnp.asarray(np.random.default_rng(6).normal(size=(2, 8, 8, 3)), jnp.float32)
    want = np.asarray(build_model(cfg).apply(params, images=x))
    scanned = build_model(cfg.replace(scan_layers=True)).apply(stack_layers(params), images=x)
    np.testing.assert_allclose(np.asarray(scanned), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(Transformer(cfg, params=params)(images=x)), want)
