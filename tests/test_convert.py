"""Hugging Face GPT-2 / BERT / T5 ↔ jaxformer: logit parity with PyTorch, export round trips.

The references are randomly initialised transformers models (PyTorch, CPU, float32, eager
attention) saved with ``save_pretrained``; nothing is downloaded.
"""

from __future__ import annotations

import json
import logging
import os
import shutil

import flax.core
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from jaxformer.config import ModelConfig
from jaxformer.convert import is_hf_directory, load_hf, load_params, save_hf, save_params
from jaxformer.convert.__main__ import main as convert_main
from jaxformer.models.transformer import build_model
from jaxformer.ops import weighted_cross_entropy

V, B, L = 128, 2, 12
RTOL = 1e-4
SMALL = dict(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=128, max_position_embeddings=64)


def rel_err(ours, ref) -> float:
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


def _save(model, path) -> str:
    model.eval().save_pretrained(path, safe_serialization=True)
    return str(path)


def _hf(cls, path):
    return cls.from_pretrained(path, attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """Tiny random HF models saved as safetensors: {name: directory}."""
    torch.manual_seed(0)
    tmp = tmp_path_factory.mktemp("hf")
    out = {
        "gpt2": _save(transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=2, n_embd=64, n_head=4, vocab_size=V, n_positions=64, bos_token_id=1,
            eos_token_id=1)), tmp / "gpt2"),
        "bert_mlm": _save(transformers.BertForMaskedLM(transformers.BertConfig(**SMALL)),
                          tmp / "bert_mlm"),
        "bert_cls": _save(transformers.BertForSequenceClassification(
            transformers.BertConfig(**SMALL, num_labels=3)), tmp / "bert_cls"),
    }
    t5 = dict(vocab_size=V, d_model=64, d_kv=8, d_ff=96, num_layers=2, num_decoder_layers=3,
              num_heads=4, relative_attention_num_buckets=16, relative_attention_max_distance=20)
    out["t5_v1_0"] = _save(transformers.T5ForConditionalGeneration(
        transformers.T5Config(**t5, feed_forward_proj="relu")), tmp / "t5_v1_0")
    v11 = transformers.T5ForConditionalGeneration(transformers.T5Config(
        **t5, feed_forward_proj="gated-gelu", tie_word_embeddings=False))
    # transformers 5 ties lm_head to `shared` regardless; give it its own weights like the
    # published v1.1 checkpoints (transformers 4 already made it untied).
    v11.lm_head.weight = torch.nn.Parameter(torch.randn(V, 64))
    out["t5_v1_1"] = _save(v11, tmp / "t5_v1_1")
    return out


def _tokens(seed, shape=(B, L)):
    return np.random.default_rng(seed).integers(0, V, shape).astype(np.int32)


def _bert_batch():
    x = _tokens(1)
    types = np.zeros_like(x)
    types[:, L // 2:] = 1
    mask = np.ones_like(x)
    mask[1, L - 4:] = 0  # padding in the second row
    return x, types, mask


def _ours(cfg_dict, params, name):
    """jaxformer logits on the batch used for ``name``; padded positions dropped for BERT MLM."""
    apply = jax.jit(build_model(ModelConfig.from_dict(cfg_dict)).apply)
    if name == "gpt2":
        return np.asarray(apply({"params": params}, _tokens(0)))
    if name.startswith("bert"):
        x, types, mask = _bert_batch()
        out = np.asarray(apply({"params": params}, x, token_types=types, segment_ids=mask))
        return out[mask == 1] if out.ndim == 3 else out
    x, y = _tokens(2), _tokens(3, (B, 7))
    mask = np.ones_like(x)
    mask[0, L - 3:] = 0
    return np.asarray(apply({"params": params}, x, y, inputs_segment_ids=mask))


HF_CLASSES = {"gpt2": "GPT2LMHeadModel", "bert_mlm": "BertForMaskedLM",
              "bert_cls": "BertForSequenceClassification", "t5_v1_0": "T5ForConditionalGeneration",
              "t5_v1_1": "T5ForConditionalGeneration", "t5_tied": "T5ForConditionalGeneration"}


def _theirs(name, path):
    model = _hf(getattr(transformers, HF_CLASSES[name]), path)
    with torch.no_grad():
        if name == "gpt2":
            return model(torch.tensor(_tokens(0))).logits.numpy()
        if name.startswith("bert"):
            x, types, mask = _bert_batch()
            out = model(torch.tensor(x), token_type_ids=torch.tensor(types),
                        attention_mask=torch.tensor(mask)).logits.numpy()
            return out[mask == 1] if out.ndim == 3 else out
        x, y = _tokens(2), _tokens(3, (B, 7))
        mask = np.ones_like(x)
        mask[0, L - 3:] = 0
        return model(input_ids=torch.tensor(x), attention_mask=torch.tensor(mask),
                     decoder_input_ids=torch.tensor(y)).logits.numpy()


# --------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name,scan", [("gpt2", False), ("bert_mlm", False), ("bert_cls", True),
                                       ("t5_v1_0", False), ("t5_v1_1", True)])
def test_import_matches_pytorch_logits(dirs, name, scan, tmp_path):
    cfg, params, tok = load_hf(dirs[name], scan_layers=scan)
    assert cfg["scan_layers"] is scan
    ref = _theirs(name, dirs[name])
    ours = _ours(cfg, params, name)
    assert ours.shape == ref.shape
    err = rel_err(ours, ref)
    print(f"{name}: max relative logit error {err:.2e}")
    assert err <= RTOL
    # Export → from_pretrained gives the same logits, and import → export the same tensors.
    out = tmp_path / "exported"
    save_hf(cfg, params, out)
    assert rel_err(_theirs(name, out), ref) <= RTOL
    src, dst = load_file(os.path.join(dirs[name], "model.safetensors")), load_file(
        out / "model.safetensors")
    assert sorted(dst) == sorted(src)
    for k in src:
        np.testing.assert_array_equal(dst[k], src[k], err_msg=k)


def test_configs_and_layouts(dirs):
    gpt, _, _ = load_hf(dirs["gpt2"])
    assert (gpt["activation"], gpt["norm_position"], gpt["tie_embeddings"]) == (
        "gelu_tanh", "pre", True)
    bert, _, _ = load_hf(dirs["bert_cls"])
    assert (bert["head"], bert["num_classes"], bert["pooler"], bert["activation"]) == (
        "classify", 3, True, "gelu")
    v10, _, tok = load_hf(dirs["t5_v1_0"])
    assert (v10["activation"], v10["gated_ffn"], v10["tie_embeddings"],
            v10["rescale_tied_logits"], v10["attention_scale"], v10["head_dim"]) == (
        "relu", False, True, True, 1.0, 8)
    assert tok is None
    v11, unrolled, _ = load_hf(dirs["t5_v1_1"])
    assert (v11["activation"], v11["gated_ffn"], v11["tie_embeddings"]) == (
        "gelu_tanh", True, False)
    assert (v11["num_encoder_layers"], v11["num_decoder_layers"]) == (2, 3)
    # Scanned layout = unrolled layers stacked on a leading axis, same tree as init builds.
    _, scanned, _ = load_hf(dirs["t5_v1_1"], scan_layers=True)
    k = "decoder", "layer_2", "cross_attn", "query", "kernel"
    np.testing.assert_array_equal(scanned["decoder"]["layers"]["cross_attn"]["query"]["kernel"][2],
                                  unrolled[k[0]][k[1]][k[2]][k[3]][k[4]])
    for cfg_dict, params in [(v11, unrolled), (dict(v11, scan_layers=True), scanned)]:
        cfg = ModelConfig.from_dict(cfg_dict)
        t = jnp.zeros((1, 1), jnp.int32)
        init = jax.eval_shape(build_model(cfg).init, jax.random.key(0), t, t)["params"]
        want = jax.tree.map(lambda s: s.shape, flax.core.meta.unbox(init))
        assert jax.tree.map(np.shape, params) == want


def test_t5_tied_without_rescale_round_trip(tmp_path):
    """transformers 5's default v1.1 (tied lm_head, no d_model^-0.5): exported with an explicit
    ``lm_head.weight`` so every transformers version reads it the same. The head is set equal to
    the shared table by hand, as transformers 4 does not tie it when ``tie_word_embeddings=False``."""
    torch.manual_seed(1)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4,
        feed_forward_proj="gated-gelu", tie_word_embeddings=False))
    with torch.no_grad():
        model.lm_head.weight.copy_(model.shared.weight)
    path = _save(model, tmp_path / "t5")
    cfg, params, _ = load_hf(path)
    assert (cfg["tie_embeddings"], cfg["rescale_tied_logits"]) == (True, False)
    ref = _theirs("t5_tied", path)
    assert rel_err(_ours(cfg, params, "t5_tied"), ref) <= RTOL
    save_hf(cfg, params, tmp_path / "out")
    assert rel_err(_theirs("t5_tied", tmp_path / "out"), ref) <= RTOL


@pytest.mark.slow
@pytest.mark.parametrize("name,settings", [
    ("t5_tiny", dict(dropout_rate=0.1, attention_dropout_rate=0.0, ffn_dropout_rate=0.0,
                     init_std=0.05)),
    ("gpt_tiny", dict(dropout_rate=0.0, attention_dropout_rate=0.05, attention_impl="chunked"))])
def test_export_import_keeps_settings_hf_configs_lack(name, settings, tmp_path):
    """HF T5 has one dropout rate and neither config has our init scale or attention path: they
    travel under config.json's "jaxformer_config", so export → import gives back the config
    (before, a T5 export came back with every dropout 0.1 and init_std 0.02)."""
    from jaxformer.models.presets import preset

    cfg = ModelConfig.from_dict(preset(name, vocab_size=V, d_model=16, num_heads=2, d_ff=32,
                                       num_layers=1, max_len=16, **settings))
    t = jnp.ones((1, 4), jnp.int32)
    args = (t, t) if cfg.family == "encoder_decoder" else (t,)
    params = flax.core.meta.unbox(build_model(cfg).init(jax.random.key(0), *args)["params"])
    save_hf(cfg, params, tmp_path / "out")
    back, _, _ = load_hf(tmp_path / "out")
    for key in (*settings, "dropout_rate", "ffn_dropout_rate", "init_std", "embed_init_std"):
        assert back[key] == getattr(cfg, key), key
    hf_cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert hf_cfg["jaxformer_config"]["init_std"] == cfg.init_std


def test_pytorch_bin_and_legacy_names_match_safetensors(dirs, tmp_path):
    model = _hf(transformers.BertForMaskedLM, dirs["bert_mlm"])
    state = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias",
                                                                      "LayerNorm.beta"): v
             for k, v in model.state_dict().items()}
    os.makedirs(tmp_path / "bin")
    torch.save(state, tmp_path / "bin" / "pytorch_model.bin")
    with open(tmp_path / "bin" / "config.json", "w") as f:
        json.dump(model.config.to_dict(), f)
    cfg_a, a, _ = load_hf(dirs["bert_mlm"])
    cfg_b, b, _ = load_hf(tmp_path / "bin")
    assert cfg_a == cfg_b
    jax.tree.map(np.testing.assert_array_equal, a, b)


def test_sharded_bfloat16_checkpoint(dirs, tmp_path):
    """bfloat16 tensors (which safetensors.numpy cannot hold) in an indexed, sharded checkpoint."""
    model = _hf(transformers.GPT2LMHeadModel, dirs["gpt2"]).to(torch.bfloat16)
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    assert os.path.isfile(tmp_path / "model.safetensors.index.json")
    _, params, _ = load_hf(tmp_path)
    _, ref, _ = load_hf(dirs["gpt2"])
    rounded = jax.tree.map(lambda x: np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32), ref)
    jax.tree.map(np.testing.assert_array_equal, params, rounded)


def test_new_head_is_initialised_and_old_head_dropped(dirs, caplog):
    with caplog.at_level(logging.WARNING):
        cfg, params, _ = load_hf(dirs["bert_mlm"], head="classify", num_classes=5, seed=3)
    assert "cls.predictions.bias" in caplog.text
    assert (cfg["head"], cfg["num_classes"]) == ("classify", 5)
    assert "mlm_head" not in params
    # Fresh parameters follow the config's init_scheme (BERT's: kernels truncated at ±2 init_std,
    # std 0.88 init_std; zero biases).
    assert not np.any(params["classifier"]["bias"]) and not np.any(params["pooler"]["bias"])
    assert cfg["init_scheme"] == "bert"
    assert abs(np.std(params["pooler"]["kernel"]) / (0.8796 * cfg["init_std"]) - 1) < 0.1
    assert params["classifier"]["kernel"].shape == (64, 5)
    _, mlm, _ = load_hf(dirs["bert_mlm"])
    np.testing.assert_array_equal(params["token_embed"]["embedding"],
                                  mlm["token_embed"]["embedding"])


@pytest.mark.slow
def test_finetune_imported_gpt2_then_export(dirs, tmp_path):
    cfg_dict, params, _ = load_hf(dirs["gpt2"])
    cfg = ModelConfig.from_dict(cfg_dict)
    model = build_model(cfg)
    x = jnp.asarray(_tokens(7, (4, 16)))

    def loss_fn(p):
        logits = model.apply({"params": p}, x[:, :-1])
        total, weight = weighted_cross_entropy(logits, x[:, 1:])
        return total / weight

    opt = optax.adam(1e-2)
    state = opt.init(params)

    @jax.jit
    def step(p, s):
        loss, g = jax.value_and_grad(loss_fn)(p)
        updates, s = opt.update(g, s, p)
        return optax.apply_updates(p, updates), s, loss

    losses = []
    for _ in range(5):
        params, state, loss = step(params, state)
        losses.append(float(loss))
    assert losses[-1] < losses[0] - 0.5, losses
    save_hf(cfg, params, tmp_path / "tuned")
    ref = _theirs("gpt2", tmp_path / "tuned")
    assert rel_err(_ours(cfg_dict, jax.device_get(params), "gpt2"), ref) <= RTOL


def test_cli_round_trip(dirs, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(dirs["t5_v1_0"], src)
    (src / "spiece.model").write_bytes(b"not a real model")  # copied as is
    hf_cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps(dict(hf_cfg, finetuning_task="translation")))
    assert is_hf_directory(src) and not is_hf_directory(tmp_path)
    ckpt, back = tmp_path / "ckpt", tmp_path / "back"
    assert convert_main(["--from-hf", str(src), "--to", str(ckpt), "--scan-layers"]) == 0
    cfg, params = load_params(ckpt)
    assert cfg["scan_layers"] and "layers" in params["encoder"]
    assert convert_main(["--from", str(ckpt), "--to-hf", str(back)]) == 0
    a, b = load_file(src / "model.safetensors"), load_file(back / "model.safetensors")
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert (back / "spiece.model").read_bytes() == b"not a real model"
    assert load_hf(back)[2] == str(back / "spiece.model")
    assert json.loads((back / "config.json").read_text())["finetuning_task"] == "translation"
    with pytest.raises(ValueError, match="already exists"):
        save_params(ckpt, cfg, params)
    assert convert_main(["--from-hf", str(src), "--to", str(ckpt)]) == 2  # the same, via the CLI
    assert convert_main(["--from", str(ckpt), "--to-hf", str(back)]) == 2  # never overwrites
    assert convert_main(["--from", str(tmp_path / "nope"), "--to-hf", str(tmp_path / "x")]) == 2


VARIANTS = {  # architectures whose shared parts the logit tests cover: tensors and loading only
    "GPT2Model": lambda: transformers.GPT2Model(transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=V, n_positions=16)),
    "GPT2LMHeadModel-untied": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=V, n_positions=16, tie_word_embeddings=False)),
    "BertForPreTraining": lambda: transformers.BertForPreTraining(transformers.BertConfig(
        **dict(SMALL, num_hidden_layers=1))),
    "BertForTokenClassification": lambda: transformers.BertForTokenClassification(
        transformers.BertConfig(**dict(SMALL, num_hidden_layers=1), num_labels=4)),
    "BertModel": lambda: transformers.BertModel(transformers.BertConfig(
        **dict(SMALL, num_hidden_layers=1))),
}
EXPECTED = {"GPT2Model": ("none", True), "GPT2LMHeadModel-untied": ("lm", False),
            "BertForPreTraining": ("mlm", True),
            "BertForTokenClassification": ("token_classify", True), "BertModel": ("none", True)}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variants_round_trip(name, tmp_path):
    torch.manual_seed(2)
    model = VARIANTS[name]()
    path = _save(model, tmp_path / "src")
    cfg, params, _ = load_hf(path)
    assert (cfg["head"], cfg["tie_embeddings"]) == EXPECTED[name]
    save_hf(cfg, params, tmp_path / "out")
    src, dst = load_file(tmp_path / "src" / "model.safetensors"), load_file(
        tmp_path / "out" / "model.safetensors")
    assert sorted(dst) == sorted(src)
    for k in src:
        np.testing.assert_array_equal(dst[k], src[k], err_msg=k)
    back, info = type(model).from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not any(info.values()), info
    assert type(back) is type(model)


# --------------------------------------------------------------------------------------------------
def test_errors(dirs, tmp_path):
    with pytest.raises(ValueError, match="config.json is missing"):
        load_hf(tmp_path)
    bad = tmp_path / "llama"
    os.makedirs(bad)
    (bad / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match=r"model_type='llama'.*supported: \['albert', 'bart', "
                                         r"'bert', 'distilbert'"):
        load_hf(bad)
    (bad / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="no weights"):
        load_hf(bad)
    src = dirs["gpt2"]

    def edited(name, edit):
        tensors = load_file(os.path.join(src, "model.safetensors"))
        edit(tensors)
        os.makedirs(tmp_path / name)
        save_file(tensors, tmp_path / name / "model.safetensors", metadata={"format": "pt"})
        shutil.copyfile(os.path.join(src, "config.json"), tmp_path / name / "config.json")
        return tmp_path / name

    # A tensor whose shape disagrees with config.json: named, with both shapes.
    shaped = edited("shaped", lambda t: t.update(
        {"transformer.h.1.mlp.c_fc.weight": np.zeros((64, 200), np.float32)}))
    with pytest.raises(ValueError, match=r"'transformer\.h\.1\.mlp\.c_fc\.weight' has shape "
                                         r"\(64, 200\) but \(64, 256\).*decoder/layer_1/ffn/wi"):
        load_hf(shaped)
    with pytest.raises(ValueError, match=r"'transformer\.ln_f\.bias' .* is missing"):
        load_hf(edited("missing", lambda t: t.pop("transformer.ln_f.bias")))
    with pytest.raises(ValueError, match=r"no place .*\['transformer\.h\.0\.attn\.rotary'\]"):
        load_hf(edited("extra", lambda t: t.update(
            {"transformer.h.0.attn.rotary": np.zeros(3, np.float32)})))
    # Exports without a Hugging Face equivalent, and params that do not fit the config.
    cfg, params, _ = load_hf(src)
    with pytest.raises(ValueError, match="GPT-2 equivalent: position='rope'"):
        save_hf(dict(cfg, position="rope"), params, tmp_path / "x")
    with pytest.raises(ValueError, match="T5 equivalent:.*use_bias=True"):
        save_hf(dict(cfg, family="encoder_decoder", position="relative", norm="rms"), params,
                tmp_path / "x")
    with pytest.raises(ValueError, match="'token_embed/embedding' has shape \\(128, 64\\) but "
                                         "\\(100, 64\\)"):
        save_hf(dict(cfg, vocab_size=100), params, tmp_path / "x")
    with pytest.raises(ValueError, match="head='mlm' is not available for GPT-2"):
        load_hf(src, head="mlm")
