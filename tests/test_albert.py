"""ALBERT (Lan et al. 2019): the factorised embedding and cross-layer sharing, against hand
computations, the BERT layout they reduce to, the NNX twin, and Hugging Face PyTorch ALBERT.

The references are tiny random transformers models (PyTorch, CPU, float32, eager attention) and
their outputs, committed as golden files (`tests/golden.py`, made by `tests/make_golden.py`), so
these tests need no torch; nothing is downloaded.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx
from golden import golden_dir, reference, rel_err
from jax.sharding import PartitionSpec
from safetensors.numpy import load_file

from jaxformer.config import ModelConfig
from jaxformer.convert import load_hf, save_hf
from jaxformer.models import Transformer, build_model
from jaxformer.models.presets import preset
from jaxformer.models.spec import FACTORED_EMBED, block_spec, init_params
from jaxformer.ops.blocks import transformer_block
from jaxformer.ops.dense import dense
from jaxformer.ops.norms import normalize
from jaxformer.parallel.mesh import make_mesh
from jaxformer.parallel.partition import sharded_jit
from jaxformer.parallel.rules import batch_sharding, param_shardings

V, B, L = 64, 2, 10
TINY = dict(vocab_size=V, embedding_size=8, d_model=32, num_heads=4, d_ff=64, num_layers=3,
            max_len=16)


def tiny(**overrides) -> ModelConfig:
    return ModelConfig.from_dict(preset("albert_tiny", **dict(TINY, **overrides)))


def init(cfg: ModelConfig) -> dict:
    return build_model(cfg).init(jax.random.key(0))


def tokens(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, V, (B, L)).astype(np.int32)


def n_params(tree) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


# --------------------------------------------------------------------------------------------------
def test_parameter_count_equals_hf_albert_base_v2():
    """11,683,584: ``sum(p.numel() for p in transformers.AlbertModel(AlbertConfig(hidden_size=768,
    num_attention_heads=12, intermediate_size=3072)).parameters())`` (albert-base-v2's "11M")."""
    cfg = ModelConfig.from_dict(preset("albert_base_v2", head="none"))
    assert n_params(build_model(cfg).abstract()) == 11_683_584


def test_factorised_embedding_and_shared_block_by_hand():
    """hidden = block^N(proj(LN(E[x] + P + T))) with one block's parameters; logits through the
    transform's d_model → E dense and the tied `[V, E]` table."""
    cfg = tiny(head="mlm")
    p = init(cfg)
    assert p["token_embed"]["embedding"].shape == (V, 8)
    assert p["embed"]["projection"]["kernel"].shape == (8, 32)
    assert set(p["encoder"]) == {"shared"}
    x = tokens()
    e = p["embed"]
    h = (p["token_embed"]["embedding"][x] + e["pos_embedding"][np.arange(L)]
         + e["type_embedding"][0])
    h = dense(e["projection"], normalize("layer", h, e["norm"], eps=cfg.norm_eps))
    for _ in range(cfg.num_layers):
        h = transformer_block(p["encoder"]["shared"], h, cfg=cfg)[0]
    m = p["mlm_head"]
    t = normalize("layer", jax.nn.gelu(dense(m["dense"], h), approximate=True), m["norm"],
                  eps=cfg.norm_eps)
    want = t @ p["token_embed"]["embedding"].T + m["decoder"]["bias"]
    got = build_model(cfg).apply(p, x)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)


def test_without_the_options_the_model_is_bert():
    """No factorisation, no sharing: the BERT tree; sharing alone = BERT with equal layers."""
    bert = init(tiny(embedding_size=None, share_layers=False))
    assert "projection" not in bert["embed"] and "layer_2" in bert["encoder"]
    shared = init(tiny(embedding_size=None))
    one = shared["encoder"]["shared"]
    unshared = dict(shared, encoder={f"layer_{i}": one for i in range(3)})
    x = tokens(1)
    np.testing.assert_allclose(
        build_model(tiny(embedding_size=None)).apply(shared, x),
        build_model(tiny(embedding_size=None, share_layers=False)).apply(unshared, x),
        atol=1e-6, rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("head", ["mlm", "classify", "none"])
def test_scan_loop_and_transformer_agree(head):
    cfg = tiny(head=head, pooler=True, dropout_rate=0.1, attention_dropout_rate=0.1)
    p = init(cfg)
    assert jax.tree.map(np.shape, p) == jax.tree.map(np.shape, init(cfg.replace(scan_layers=True)))
    x = tokens(2)
    loop = build_model(cfg).apply(p, x)
    scan = build_model(cfg.replace(scan_layers=True)).apply(p, x)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5), loop, scan)
    for scanned in (False, True):
        c = cfg.replace(scan_layers=scanned)
        model = Transformer(c, params=p)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5),
                     model(x), loop)
        if scanned:  # dropout: layer i draws split(key, num_layers)[i] in both layouts
            on = model(x, deterministic=False, rngs=jax.random.key(3))
            off = Transformer(cfg, params=p)(x, deterministic=False, rngs=jax.random.key(3))
            jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), on, off)


def test_logical_axes_keep_sharding_names():
    cfg = tiny(head="mlm")
    axes = build_model(cfg).logical_axes()
    assert axes["token_embed"]["embedding"] == ("vocab", FACTORED_EMBED)
    assert axes["embed"]["projection"]["kernel"] == (FACTORED_EMBED, "embed")
    assert axes["mlm_head"]["dense"]["kernel"] == ("embed", FACTORED_EMBED)
    want = jax.tree.map(lambda s: s.axes, block_spec(cfg), is_leaf=lambda s: hasattr(s, "axes"))
    assert axes["encoder"]["shared"] == want  # the shared block: a block's names, no 'layers'
    t = nnx.eval_shape(lambda: Transformer(cfg, 0))
    assert nnx.to_pure_dict(nnx.state(t, nnx.Param),
                            extract_fn=lambda v: tuple(v.get_metadata("out_sharding"))) == axes
    assert init_params(jax.random.key(0), block_spec(cfg))["ffn"]["wi"]["kernel"].shape == (32, 64)


@pytest.mark.slow
@pytest.mark.parametrize("scan", [False, True])
def test_sharded_on_an_fsdp_tensor_mesh_equals_unsharded(scan):
    """On a 2×2×2 (data, fsdp, tensor) mesh of 8 simulated devices the shared block's weights are
    split (fsdp on d_model, tensor on heads/mlp) and the output equals the single-device one."""
    cfg = tiny(head="mlm", scan_layers=scan)
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    model = build_model(cfg)
    shardings = param_shardings(model.logical_axes(), model.abstract(), mesh)
    assert shardings["encoder"]["shared"]["ffn"]["wi"]["kernel"].spec == PartitionSpec("fsdp", "tensor")
    assert shardings["embed"]["projection"]["kernel"].spec == PartitionSpec(None, "fsdp")
    params = init(cfg)
    x = np.concatenate([tokens(6), tokens(7)])  # batch 4: split over data × fsdp
    want = model.apply(params, x)
    fn = sharded_jit(lambda p, t: model.apply(p, t), mesh,
                     in_shardings=(shardings, batch_sharding(mesh)))
    got = fn(jax.device_put(params, shardings), x)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("overrides,match", [
    (dict(family="decoder", head="lm"), "embedding_size"),
    (dict(embedding_size=None, family="decoder", head="lm"), "share_layers"),
    (dict(embedding_size=0), "embedding_size"),
    (dict(head="mlm", mlm_transform=False), "mlm_transform"),
])
def test_invalid_settings_name_the_field(overrides, match):
    with pytest.raises(ValueError, match=f"model.{match}="):
        tiny(**overrides)


# --------------------------------------------------------------------------------------------------
# Hugging Face ALBERT: import parity with PyTorch (golden outputs), export of the same files.
RTOL = 1e-5
HF_OUTPUTS = {"albert_mlm": ("logits",), "albert_groups": ("last_hidden_state",),
              "albert_pretraining": ("prediction_logits", "sop_logits")}


def ours(name: str, cfg: dict, params) -> list[np.ndarray]:
    """Our outputs on the golden case's inputs, as `HF_OUTPUTS` names them (per-token outputs at the
    unpadded positions; the encoder-only head gives the hidden states, not the pooled vector)."""
    ref = reference(name)
    mask = ref["attention_mask"]
    model = build_model(ModelConfig.from_dict(cfg))
    out = model.apply(params, ref["input_ids"], token_types=ref["token_type_ids"],
                      segment_ids=mask)
    if name == "albert_groups":
        out = out[:1]
    out = out if isinstance(out, tuple) else (out,)
    return [np.asarray(o)[mask == 1] if o.ndim == 3 else np.asarray(o) for o in out]


def theirs(name: str) -> list[np.ndarray]:
    ref = reference(name)
    mask = ref["attention_mask"]
    return [ref[k][mask == 1] if ref[k].ndim == 3 else ref[k] for k in HF_OUTPUTS[name]]


@pytest.mark.parametrize("name,scan", [("albert_mlm", False), ("albert_mlm", True),
                                       ("albert_groups", False), ("albert_pretraining", True)])
def test_import_matches_pytorch(name, scan):
    cfg, params, _ = load_hf(golden_dir(name), scan_layers=scan)
    assert (cfg["embedding_size"], cfg["share_layers"], cfg["activation"]) == (
        8, name != "albert_groups", "gelu_tanh")
    if name == "albert_pretraining":  # the sentence-order head and an untied E-wide decoder
        assert cfg["nsp_head"] and not cfg["tie_embeddings"]
    for a, b in zip(ours(name, cfg, params), theirs(name), strict=True):
        assert a.shape == b.shape
        err = rel_err(a, b)
        print(f"{name}: max relative error {err:.2e}")
        assert err <= RTOL


@pytest.mark.parametrize("name", sorted(HF_OUTPUTS))
def test_export_writes_the_same_tensors(name, tmp_path):
    """import → export: the same tensors; read back, the same config and parameters."""
    path = golden_dir(name)
    cfg, params, _ = load_hf(path)
    save_hf(cfg, params, tmp_path)
    src = load_file(f"{path}/model.safetensors")
    dst = load_file(tmp_path / "model.safetensors")
    assert sorted(dst) == sorted(src)
    for k in src:
        np.testing.assert_array_equal(dst[k], src[k], err_msg=k)
    back, again, _ = load_hf(tmp_path)
    assert back == cfg
    jax.tree.map(np.testing.assert_array_equal, again, params)


def test_export_of_a_model_without_a_factorised_embedding_is_refused(tmp_path):
    with pytest.raises(ValueError, match="embedding_size"):
        save_hf(tiny(embedding_size=None), init(tiny(embedding_size=None)), tmp_path / "no")


@pytest.mark.hf
@pytest.mark.slow
def test_export_of_a_jaxformer_model_with_sop_and_untied_decoder(tmp_path):
    """Live: our own ALBERT (scanned, sentence-order head, untied E-wide decoder) →
    AlbertForPreTraining with logits equal to ours."""
    import torch
    import transformers

    cfg = tiny(head="mlm", nsp_head=True, tie_embeddings=False, scan_layers=True)
    params = init(cfg)
    params["mlm_head"]["decoder"]["bias"] = np.random.default_rng(5).normal(size=V).astype(np.float32)
    save_hf(cfg, params, tmp_path)
    ref = reference("albert_mlm")
    x, types, mask = ref["input_ids"], ref["token_type_ids"], ref["attention_mask"]
    model = transformers.AlbertForPreTraining.from_pretrained(tmp_path, attn_implementation="eager")
    with torch.no_grad():
        out = model.eval()(**{k: torch.tensor(v.astype(np.int64)) for k, v in (
            ("input_ids", x), ("token_type_ids", types), ("attention_mask", mask))})
    mlm, sop = build_model(cfg).apply(params, x, token_types=types, segment_ids=mask)
    assert rel_err(np.asarray(mlm)[mask == 1], out.prediction_logits.numpy()[mask == 1]) <= RTOL
    assert rel_err(sop, out.sop_logits.numpy()) <= RTOL
