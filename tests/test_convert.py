"""Hugging Face GPT-2 / BERT / T5 ↔ jaxformer: logit and greedy parity, export round trips.

The references are tiny random transformers models (PyTorch, CPU, float32, eager attention) saved
with ``save_pretrained`` and their outputs, committed as golden files (`tests/golden.py`, made by
`tests/make_golden.py`): these tests need no torch. The ``hf`` tests load exports back into live
PyTorch (`make test-hf`). Nothing is downloaded.
"""

from __future__ import annotations

import json
import logging
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from golden import golden_copy, golden_dir, reference, rel_err
from safetensors.numpy import load_file, save_file

from jaxformer.checkpoint import load_params, save_params
from jaxformer.cli.convert import main as convert_main
from jaxformer.config import ModelConfig
from jaxformer.convert import is_hf_directory, load_hf, save_hf
from jaxformer.models import build_model
from jaxformer.ops import weighted_cross_entropy

V = 128
RTOL = 1e-4
LOGIT_CASES = ("gpt2", "bert_mlm", "bert_cls", "t5_v1_0", "t5_v1_1", "t5_tied")
HF_CLASSES = {"gpt2": "GPT2LMHeadModel", "bert_mlm": "BertForMaskedLM",
              "bert_cls": "BertForSequenceClassification", "t5_v1_0": "T5ForConditionalGeneration",
              "t5_v1_1": "T5ForConditionalGeneration", "t5_tied": "T5ForConditionalGeneration"}
# config.json entries an export writes otherwise than transformers saved them, with the same meaning
# (HF reads None as the value on the right) or deliberately (reason).
SAME_MEANING = {"n_inner": "None = 4 * n_embd", "position_embedding_type": 'None = "absolute"',
                "decoder_start_token_id": "None = pad_token_id (0)",
                "n_positions": "T5: informational, relative positions"}
DELIBERATE = {"tie_word_embeddings": "transformers 5 saves True for T5 v1.1 with an untied lm_head; "
              "the export states what the weights are",
              "classifier_dropout_prob": "ALBERT: jaxformer's one dropout_rate"}


@pytest.fixture(scope="module")
def dirs():
    """The golden HF model directories: {name: directory} (read-only)."""
    return {name: golden_dir(name) for name in LOGIT_CASES}


def _ours(cfg_dict, params, name):
    """jaxformer logits on the inputs of golden case ``name``; BERT MLM: padded positions dropped."""
    ref = reference(name)
    apply = jax.jit(build_model(ModelConfig.from_dict(cfg_dict)).apply)
    if name.startswith("gpt2"):
        return np.asarray(apply(params, ref["input_ids"]))
    if name.startswith("bert"):
        mask = ref["attention_mask"]
        out = np.asarray(apply(params, ref["input_ids"], token_types=ref["token_type_ids"],
                               segment_ids=mask))
        return out[mask == 1] if out.ndim == 3 else out
    return np.asarray(apply(params, ref["input_ids"], ref["decoder_input_ids"],
                            inputs_segment_ids=ref["attention_mask"]))


def _theirs(name):
    """HF PyTorch's logits on those inputs (golden)."""
    ref = reference(name)
    out = ref["logits"]
    return out[ref["attention_mask"] == 1] if name.startswith("bert") and out.ndim == 3 else out


def assert_same_safetensors(src_dir, dst_dir, explicit_head=False):
    """Key for key and tensor for tensor (bit-exact). ``explicit_head``: a tied T5 saved without
    ``lm_head.weight`` exports it, equal to ``shared.weight`` (`test_t5_tied_without_rescale`)."""
    src = load_file(os.path.join(src_dir, "model.safetensors"))
    dst = load_file(os.path.join(dst_dir, "model.safetensors"))
    if explicit_head:
        src["lm_head.weight"] = src["shared.weight"]
    assert sorted(dst) == sorted(src)
    for k in src:
        assert dst[k].dtype == src[k].dtype, k
        np.testing.assert_array_equal(dst[k], src[k], err_msg=k)


def assert_same_config(src_dir, dst_dir):
    """The exported config.json has every entry transformers saved, with its value, but for the
    `SAME_MEANING` and `DELIBERATE` entries (and the version stamp)."""
    src = json.loads(open(os.path.join(src_dir, "config.json")).read())
    dst = json.loads(open(os.path.join(dst_dir, "config.json")).read())
    differ = {k: (src.get(k), dst.get(k)) for k in (set(src) | set(dst)) - {"jaxformer_config"}
              if src.get(k) != dst.get(k)}
    unexplained = {k: v for k, v in differ.items()
                   if k not in SAME_MEANING and k not in DELIBERATE and k != "transformers_version"}
    assert not unexplained, unexplained


def export_like_the_cli(cfg, params, src_dir, out):
    """`save_hf` with the source's config.json entries carried over, as ``--to-hf`` does."""
    save_hf(cfg, params, out, extra_config=json.loads(open(os.path.join(src_dir, "config.json")).read()))


# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,scan", [("gpt2", False), ("bert_mlm", False), ("bert_cls", True),
                                       ("t5_v1_0", False), ("t5_v1_1", True), ("t5_tied", False)])
def test_import_matches_pytorch_logits_and_exports_the_same_files(dirs, name, scan, tmp_path):
    cfg, params, tok = load_hf(dirs[name], scan_layers=scan)
    assert cfg["scan_layers"] is scan
    ref = _theirs(name)
    ours = _ours(cfg, params, name)
    assert ours.shape == ref.shape
    err = rel_err(ours, ref)
    print(f"{name}: max relative logit error {err:.2e}")
    assert err <= RTOL
    # import → export: the same tensors and config; read back, the same model
    out = tmp_path / "exported"
    export_like_the_cli(cfg, params, dirs[name], out)
    assert_same_safetensors(dirs[name], out, explicit_head=name == "t5_tied")
    assert_same_config(dirs[name], out)
    back, again, _ = load_hf(out, scan_layers=scan)
    assert back == cfg
    jax.tree.map(np.testing.assert_array_equal, again, params)


@pytest.mark.parametrize("name", ["gpt2", "t5_v1_0", "t5_v1_1"])
def test_greedy_generation_equals_pytorch(name):
    """Cached greedy decoding of the imported model gives HF ``generate``'s tokens (6 new tokens,
    no EOS stop; T5 from decoder start 0, GPT-2 continuing the prompt)."""
    from jaxformer.decode import generate

    ref = reference(name)
    cfg, params, _ = load_hf(golden_dir(name))
    model = build_model(ModelConfig.from_dict(cfg))
    prompts = ref["prompt" if name == "gpt2" else "input_ids"]
    if name != "gpt2":  # the sources without their padding
        prompts = [row[mask == 1] for row, mask in zip(prompts, ref["attention_mask"])]
    result = generate(model, params, [list(map(int, p)) for p in prompts], max_new_tokens=6,
                      eos_id=None)
    np.testing.assert_array_equal(np.asarray(result.tokens)[:, -6:] if name == "gpt2"
                                  else np.asarray(result.tokens)[:, :6], ref["greedy"])


@pytest.mark.hf
@pytest.mark.slow
@pytest.mark.parametrize("name", LOGIT_CASES)
def test_export_loads_in_pytorch_with_the_same_logits(dirs, name, tmp_path):
    """Live: export → transformers ``from_pretrained`` → the golden logits."""
    import torch
    import transformers

    cfg, params, _ = load_hf(dirs[name])
    save_hf(cfg, params, tmp_path)
    model = getattr(transformers, HF_CLASSES[name]).from_pretrained(
        tmp_path, attn_implementation="eager").eval()
    ref = reference(name)
    keys = {"gpt2": ("input_ids",), "bert": ("input_ids", "token_type_ids", "attention_mask")}.get(
        name.split("_")[0], ("input_ids", "attention_mask", "decoder_input_ids"))
    with torch.no_grad():
        out = model(**{k: torch.tensor(ref[k].astype(np.int64)) for k in keys}).logits.numpy()
    assert rel_err(out, ref["logits"]) <= RTOL


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
        want = jax.tree.map(lambda s: s.shape, build_model(cfg).abstract())
        assert jax.tree.map(np.shape, params) == want


def test_t5_tied_without_rescale(dirs):
    """transformers 5's default v1.1 (tied lm_head, no d_model^-0.5): the export writes an explicit
    ``lm_head.weight`` so every transformers version reads it the same (logits and files: above)."""
    cfg, _, _ = load_hf(dirs["t5_tied"])
    assert (cfg["tie_embeddings"], cfg["rescale_tied_logits"]) == (True, False)


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
    jnp.ones((1, 4), jnp.int32)
    params = build_model(cfg).init(jax.random.key(0))
    save_hf(cfg, params, tmp_path / "out")
    back, _, _ = load_hf(tmp_path / "out")
    for key in (*settings, "dropout_rate", "ffn_dropout_rate", "init_std", "embed_init_std"):
        assert back[key] == getattr(cfg, key), key
    hf_cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert hf_cfg["jaxformer_config"]["init_std"] == cfg.init_std


@pytest.mark.hf
def test_pytorch_bin_and_legacy_names_match_safetensors(dirs, tmp_path):
    """Reading ``pytorch_model.bin`` needs torch (as it does for users)."""
    import torch
    import transformers

    model = transformers.BertForMaskedLM.from_pretrained(dirs["bert_mlm"]).eval()
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


def test_sharded_bfloat16_checkpoint(dirs):
    """bfloat16 tensors (which safetensors.numpy cannot hold) in an indexed, sharded checkpoint
    (the golden gpt2 model saved by transformers in bfloat16, 40 KB shards)."""
    shards = golden_dir("gpt2_bf16_shards")
    assert os.path.isfile(os.path.join(shards, "model.safetensors.index.json"))
    _, params, _ = load_hf(shards)
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
    x = jnp.asarray(np.random.default_rng(7).integers(0, V, (4, 16)), jnp.int32)

    def loss_fn(p):
        logits = model.apply(p, x[:, :-1])
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
    save_hf(cfg, params, tmp_path / "tuned")  # read back: the tuned model, tensor for tensor
    _, back, _ = load_hf(tmp_path / "tuned")
    jax.tree.map(np.testing.assert_array_equal, back, jax.device_get(params))


def test_cli_round_trip(dirs, tmp_path):
    src = tmp_path / "src"
    golden_copy("t5_v1_0", src)
    (src / "spiece.model").write_bytes(b"not a real model")  # copied as is
    hf_cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps(dict(hf_cfg, finetuning_task="translation")))
    assert is_hf_directory(src) and not is_hf_directory(tmp_path)
    ckpt, back = tmp_path / "ckpt", tmp_path / "back"
    assert convert_main(["--from-hf", str(src), "--to", str(ckpt), "--scan-layers"]) == 0
    cfg, params = load_params(ckpt)
    assert cfg["scan_layers"] and "layers" in params["encoder"]
    assert convert_main(["--from", str(ckpt), "--to-hf", str(back)]) == 0
    assert_same_safetensors(src, back)
    assert (back / "spiece.model").read_bytes() == b"not a real model"
    assert load_hf(back)[2] == str(back / "spiece.model")
    assert json.loads((back / "config.json").read_text())["finetuning_task"] == "translation"
    with pytest.raises(ValueError, match="already exists"):
        save_params(ckpt, cfg, params)
    assert convert_main(["--from-hf", str(src), "--to", str(ckpt)]) == 2  # the same, via the CLI
    assert convert_main(["--from", str(ckpt), "--to-hf", str(back)]) == 2  # never overwrites
    assert convert_main(["--from", str(tmp_path / "nope"), "--to-hf", str(tmp_path / "x")]) == 2


VARIANTS = {  # architectures whose shared parts the logit tests cover: tensors and loading only
    "GPT2Model": ("none", True), "GPT2LMHeadModel-untied": ("lm", False),
    "BertForPreTraining": ("mlm", True), "BertForTokenClassification": ("token_classify", True),
    "BertModel": ("none", True)}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variants_round_trip(name, tmp_path):
    src = golden_dir(name)
    cfg, params, _ = load_hf(src)
    assert (cfg["head"], cfg["tie_embeddings"]) == VARIANTS[name]
    export_like_the_cli(cfg, params, src, tmp_path)
    assert_same_safetensors(src, tmp_path)
    assert_same_config(src, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [name.split("-")[0]]


@pytest.mark.hf
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variants_load_in_pytorch_without_missing_keys(name, tmp_path):
    import transformers

    cfg, params, _ = load_hf(golden_dir(name))
    save_hf(cfg, params, tmp_path)
    cls = getattr(transformers, name.split("-")[0])
    back, info = cls.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info.values()), info
    assert type(back) is cls


# --------------------------------------------------------------------------------------------------
def test_errors(dirs, tmp_path):
    with pytest.raises(ValueError, match="config.json is missing"):
        load_hf(tmp_path)
    bad = tmp_path / "falcon"
    os.makedirs(bad)
    (bad / "config.json").write_text(json.dumps({"model_type": "falcon"}))
    with pytest.raises(ValueError, match=r"model_type='falcon'.*supported: \['albert', 'bart', "
                                         r"'bert', 'distilbert', 'gpt2'"):
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
    with pytest.raises(ValueError, match="GPT-2 equivalent: position='sinusoidal'"):
        save_hf(dict(cfg, position="sinusoidal"), params, tmp_path / "x")
    with pytest.raises(ValueError, match="Llama equivalent: norm='layer'"):  # RoPE: Llama's
        save_hf(dict(cfg, position="rope"), params, tmp_path / "x")
    with pytest.raises(ValueError, match="T5 equivalent:.*use_bias=True"):
        save_hf(dict(cfg, family="encoder_decoder", position="relative", norm="rms"), params,
                tmp_path / "x")
    with pytest.raises(ValueError, match="'token_embed/embedding' has shape \\(128, 64\\) but "
                                         "\\(100, 64\\)"):
        save_hf(dict(cfg, vocab_size=100), params, tmp_path / "x")
    with pytest.raises(ValueError, match="head='mlm' is not available for GPT-2"):
        load_hf(src, head="mlm")
