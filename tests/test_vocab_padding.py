"""Vocabulary padding (``model.vocab_pad_multiple``): the padded model is the unpadded one.

Each padded model here holds the unpadded model's weights in its first ``vocab_size`` rows and, in
its padding rows, values that would win if they were read (large output biases, large kernel
columns): the logits over the real vocabulary, the losses (label smoothing and z-loss included),
the gradients of the real rows, greedy and beam tokens must equal the unpadded model's, the padding
rows get zero gradient and are never sampled. Hugging Face import → export of padded golden models
is bit-exact; GPT-2's 50,257 tokens padded to 50,304 shard over ``tensor=2``, and the sharded step
equals the single-device one.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from golden import golden_dir, reference, rel_err
from safetensors.numpy import load_file

from jaxformer.checkpoint import load_params
from jaxformer.cli.convert import main as convert_main
from jaxformer.config import ModelConfig
from jaxformer.convert import load_hf, save_hf
from jaxformer.decode import generate
from jaxformer.models import build_model, check_params
from jaxformer.models.presets import preset
from jaxformer.models.vocab_padding import fit_vocab, vocab_axes
from jaxformer.objectives import bind_objective
from jaxformer.ops import cross_entropy_with_integer_labels, mask_padded_vocab
from jaxformer.parallel.mesh import make_mesh
from jaxformer.parallel.partition import sharded_jit
from jaxformer.parallel.rules import batch_sharding
from jaxformer.train.optim import make_optimizer, optimizer_settings
from jaxformer.train.state import create_train_state, state_shardings
from jaxformer.train.step import loss_and_metrics, make_train_step
from jaxformer.vocab import SpecialTokens

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(vocab_size=250, d_model=32, num_heads=4, d_ff=64, num_layers=1, max_len=32,
             dropout_rate=0.0, attention_dropout_rate=0.0, ffn_dropout_rate=0.0)
PAD = 64  # 250 → 256 rows
CASES = {  # every table on the vocab axis: tied table (+ bias), untied kernel (+ bias), MLM decoder
    "gpt_tied_bias": ("gpt_tiny", dict(lm_head_bias=True)),
    "gpt_untied_bias": ("gpt_tiny", dict(tie_embeddings=False, lm_head_bias=True)),
    "bert_mlm": ("bert_tiny", {}),
    "albert_untied": ("albert_tiny", dict(tie_embeddings=False)),
    "t5": ("t5_tiny", {}),
    "llama": ("llama_tiny", dict(num_kv_heads=2)),
}
TOL = dict(rtol=2e-6, atol=2e-6)  # the same sums; XLA may block a wider matmul differently


def _configs(name: str) -> tuple[ModelConfig, ModelConfig]:
    base, kw = CASES[name]
    cfg = ModelConfig.from_dict(preset(base, **{**SMALL, **kw}))
    return cfg, cfg.replace(vocab_pad_multiple=PAD)


def _params(cfg: ModelConfig, padded: ModelConfig, seed: int = 0):
    """(the unpadded model's params, the padded model's: the same real rows, padding rows filled
    with values that would win an argmax if they were read: +30 in biases, ±3 elsewhere)."""
    params = jax.tree.map(np.asarray, build_model(cfg).init(jax.random.key(seed)))
    out = fit_vocab(params, cfg, padded)
    rng = np.random.default_rng(seed)
    for path, axis in vocab_axes(padded).items():
        *parents, leaf = path.split("/")
        node = out
        for p in parents:
            node = node[p]
        x = node[leaf].copy()
        rows = [slice(None)] * x.ndim
        rows[axis] = slice(cfg.vocab_size, None)
        junk = 30.0 if x.ndim == 1 else 3.0 * rng.standard_normal(x[tuple(rows)].shape)
        x[tuple(rows)] = junk
        node[leaf] = x
    return params, out


def _inputs(cfg: ModelConfig) -> dict:
    tokens = np.random.default_rng(0).integers(3, cfg.vocab_size, (2, 12)).astype(np.int32)
    tokens[0, -1] = cfg.vocab_size - 1  # the last real id, next to the padding
    if cfg.family == "encoder_decoder":
        return {"inputs": tokens, "targets_in": tokens[:, :7]}
    return {"tokens": tokens}


def _prepared(cfg: ModelConfig) -> dict:
    inputs = _inputs(cfg)
    shape = (inputs["targets_in"] if "targets_in" in inputs else inputs["tokens"]).shape
    targets = np.random.default_rng(1).integers(0, cfg.vocab_size, shape).astype(np.int32)
    targets[0, 0] = cfg.vocab_size - 1
    weights = np.ones(shape, np.float32)
    weights[1, -2:] = 0
    return {"model_inputs": inputs, "targets": targets, "weights": weights}


# --------------------------------------------------------------------------------------------------
def test_config_field_defaults_to_no_padding_and_is_validated():
    saved = ModelConfig.from_dict(preset("gpt_tiny")).to_dict()
    del saved["vocab_pad_multiple"]  # a config.json written before the field existed
    cfg = ModelConfig.from_dict(saved)
    assert cfg.vocab_pad_multiple == 1 and cfg.padded_vocab_size == cfg.vocab_size == 512
    assert cfg.replace(vocab_size=50257, vocab_pad_multiple=128).padded_vocab_size == 50304
    assert cfg.replace(vocab_size=50304, vocab_pad_multiple=128).padded_vocab_size == 50304
    with pytest.raises(ValueError, match="model.vocab_pad_multiple=0 is invalid"):
        cfg.replace(vocab_pad_multiple=0)
    gpt2 = ModelConfig.from_dict(preset("gpt2_small"))
    assert (gpt2.vocab_size, gpt2.padded_vocab_size) == (50257, 50304)


@pytest.mark.parametrize("name", sorted(CASES))
def test_padded_model_computes_the_unpadded_function(name):
    """Logits over the real vocabulary, loss sums (label smoothing, z-loss), accuracy and the
    gradients of every real row equal the unpadded model's; padding columns sit at the dtype's
    lowest value and padding rows get exactly zero gradient."""
    cfg, padded = _configs(name)
    params, padded_params = _params(cfg, padded)
    inputs = _inputs(cfg)
    logits = build_model(cfg).apply(params, **inputs)
    got = build_model(padded).apply(padded_params, **inputs)
    assert got.shape == (*logits.shape[:-1], padded.padded_vocab_size)
    np.testing.assert_allclose(got[..., :cfg.vocab_size], logits, **TOL)
    assert np.all(np.asarray(got[..., cfg.vocab_size:]) == np.finfo(np.float32).min)

    prepared = _prepared(cfg)

    def loss(model, p):
        sums = loss_and_metrics(model, p, prepared, deterministic=True, dropout_rng=None,
                                label_smoothing=0.1, z_loss=1e-3)
        return sums["loss"], sums

    (ref_loss, ref_sums), ref_grads = jax.value_and_grad(
        lambda p: loss(build_model(cfg), p), has_aux=True)(params)
    (pad_loss, pad_sums), pad_grads = jax.value_and_grad(
        lambda p: loss(build_model(padded), p), has_aux=True)(padded_params)
    assert np.isfinite(ref_loss)
    np.testing.assert_allclose(pad_loss, ref_loss, rtol=2e-6)
    assert float(pad_sums["correct"]) == float(ref_sums["correct"])
    cut = fit_vocab(pad_grads, padded, cfg)
    scale = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(ref_grads))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(  # float32 sums in another order
        a, b, rtol=1e-5, atol=1e-6 * scale), cut, ref_grads)
    flat = {"/".join(str(k.key) for k in p): g
            for p, g in jax.tree_util.tree_flatten_with_path(pad_grads)[0]}
    for path, axis in vocab_axes(padded).items():
        pad_rows = np.take(np.asarray(flat[path]), np.arange(cfg.vocab_size, padded.padded_vocab_size),
                           axis=axis)
        assert np.all(pad_rows == 0), path


def test_smoothed_loss_over_the_real_classes_equals_a_float64_reference():
    """`cross_entropy_with_integer_labels(num_classes=C)` on masked padded logits is the smoothed
    cross-entropy over the C real classes (ε on the true class' complement, ε/(C−1) each)."""
    rng = np.random.default_rng(0)
    c, pad, eps, z = 37, 64, 0.2, 1e-2
    real = rng.standard_normal((3, 5, c)) * 3
    labels = rng.integers(0, c, (3, 5))
    padded = mask_padded_vocab(jnp.asarray(np.concatenate(
        [real, 50 + rng.standard_normal((3, 5, pad - c))], -1), jnp.float32), c)
    got = cross_entropy_with_integer_labels(padded, jnp.asarray(labels), label_smoothing=eps,
                                            z_loss=z, num_classes=c)
    log_z = np.log(np.sum(np.exp(real), -1))
    logp = real - log_z[..., None]
    q = np.full(real.shape, eps / (c - 1))
    np.put_along_axis(q, labels[..., None], 1 - eps, -1)
    want = -np.sum(q * logp, -1) + z * log_z ** 2
    np.testing.assert_allclose(got, want, rtol=1e-5)
    outside = cross_entropy_with_integer_labels(padded, jnp.full((3, 5), c), num_classes=c)
    assert np.all(np.isnan(outside))  # a padding id is no label


@pytest.mark.parametrize("name", ["gpt_tied_bias", "t5"])
def test_greedy_beam_and_sampled_tokens_never_use_the_padding(name):
    cfg, padded = _configs(name)
    params, padded_params = _params(cfg, padded)
    prompts = [[5, 17, 9], [cfg.vocab_size - 1, 3]]
    for kw in (dict(strategy="greedy"), dict(strategy="beam", beam_size=3)):
        ref = generate(build_model(cfg), params, prompts, max_new_tokens=6, eos_id=None, **kw)
        got = generate(build_model(padded), padded_params, prompts, max_new_tokens=6, eos_id=None,
                       **kw)
        np.testing.assert_array_equal(got.tokens, ref.tokens)
        np.testing.assert_allclose(got.scores, ref.scores, rtol=1e-5)
    # hot sampling: unmasked, the padding's +30 bias (or ±3 columns) would be drawn every time
    sampled = generate(build_model(padded), padded_params, prompts * 4, strategy="sample",
                       temperature=5.0, max_new_tokens=16, eos_id=None, rng=jax.random.key(0))
    tokens = np.asarray(sampled.tokens)
    assert tokens.max() < cfg.vocab_size and len(np.unique(tokens)) > 20


def test_fit_vocab_round_trips_between_paddings():
    cfg, padded = _configs("gpt_untied_bias")
    params, _ = _params(cfg, padded)
    c128, c100 = cfg.replace(vocab_pad_multiple=128), cfg.replace(vocab_pad_multiple=100)
    p128 = fit_vocab(params, cfg, c128)
    assert p128["lm_head"]["kernel"].shape == (32, 256)
    assert p128["token_embed"]["embedding"].shape == (256, 32)
    assert not np.any(p128["lm_head"]["bias"][250:])  # zero rows
    p100 = fit_vocab(jax.tree.map(jnp.asarray, p128), c128, c100)  # jax arrays too
    assert p100["lm_head"]["bias"].shape == (300,)
    back = fit_vocab(p100, c100, cfg)
    jax.tree.map(np.testing.assert_array_equal, back, params)
    untouched = zip(jax.tree.leaves(back["decoder"]), jax.tree.leaves(p100["decoder"]))
    assert all(a is b for a, b in untouched)  # only the vocabulary tables are touched
    flat = {"token_embed/embedding": params["token_embed"]["embedding"]}  # "a/b"-flat dicts too
    assert fit_vocab(flat, cfg, padded)["token_embed/embedding"].shape == (256, 32)
    # a table that is not the source config's is left for the shape check to name
    assert fit_vocab(p100, c128, cfg)["lm_head"]["bias"].shape == (300,)
    with pytest.raises(ValueError, match="cannot re-pad a vocabulary of 250 tokens"):
        fit_vocab(params, cfg, padded.replace(vocab_size=200))
    with pytest.raises(ValueError, match="re-pad the parameters with .*fit_vocab"):
        check_params(padded, params)


def _golden_logits(apply, params, name: str, ref: dict) -> tuple[np.ndarray, np.ndarray]:
    """(ours, PyTorch's) logits on golden case ``name``'s inputs, at its real (unmasked) tokens."""
    if name == "gpt2":
        return np.asarray(apply(params, ref["input_ids"])), ref["logits"]
    mask = ref["attention_mask"]
    kw = dict(token_types=ref["token_type_ids"]) if "token_type_ids" in ref else {}
    ours = np.asarray(apply(params, ref["input_ids"], segment_ids=mask, **kw))
    return ours[mask == 1], ref["logits"][mask == 1]


@pytest.mark.parametrize("name", ["gpt2", "bert_mlm", "llama"])
def test_hf_import_pads_and_export_is_bit_exact(name, tmp_path):
    """GPT-2 (tied), BERT (MLM decoder bias), Llama (untied head) imported with their 128 / 96
    ids padded to 160 rows: the golden PyTorch logits over the real vocabulary (and GPT-2's greedy
    tokens); exported: HF's own tensors bit for bit, ``vocab_size`` the real one; re-imported:
    the same padded parameters and config."""
    cfg_dict, params, _ = load_hf(golden_dir(name), vocab_pad_multiple=80)
    cfg = ModelConfig.from_dict(cfg_dict)
    assert (cfg.padded_vocab_size, cfg.vocab_pad_multiple) == (160, 80) and cfg.vocab_size < 160
    assert params["token_embed"]["embedding"].shape[0] == 160
    ref = reference(name)
    ours, theirs = _golden_logits(build_model(cfg).apply, params, name, ref)
    assert rel_err(ours[..., :cfg.vocab_size], theirs) <= 1e-4
    save_hf(cfg, params, tmp_path, extra_config=json.loads(
        open(os.path.join(golden_dir(name), "config.json")).read()))
    src = load_file(os.path.join(golden_dir(name), "model.safetensors"))
    dst = load_file(os.path.join(tmp_path, "model.safetensors"))
    assert sorted(dst) == sorted(src)
    for k in src:
        assert dst[k].dtype == src[k].dtype, k
        np.testing.assert_array_equal(dst[k], src[k], err_msg=k)
    assert json.loads((tmp_path / "config.json").read_text())["vocab_size"] == cfg.vocab_size
    again_cfg, again, _ = load_hf(tmp_path, vocab_pad_multiple=80)
    assert again_cfg == cfg_dict
    jax.tree.map(np.testing.assert_array_equal, again, params)
    if name == "gpt2":
        result = generate(build_model(cfg), params, [list(map(int, p)) for p in ref["prompt"]],
                          max_new_tokens=6, eos_id=None)
        np.testing.assert_array_equal(np.asarray(result.tokens)[:, -6:], ref["greedy"])


# --------------------------------------------------------------------------------------------------
# GPT-2's vocabulary on a tensor-parallel mesh.

GPT2_NARROW = dict(d_model=64, num_heads=4, d_ff=128, num_layers=1, max_len=16, dropout_rate=0.0,
                   attention_dropout_rate=0.0)  # the preset's 50,257 tokens, a CPU-sized body


def _gpt2_parts(**overrides):
    """(cfg, model, optimizer, schedule, clm objective) of the narrow GPT-2 preset."""
    cfg = ModelConfig.from_dict(preset("gpt2_small", **{**GPT2_NARROW, **overrides}))
    tx, schedule = make_optimizer(optimizer_settings("gpt3", peak_lr=1e-2, warmup_steps=1,
                                                           eps=1e-3), cfg.d_model, 10)
    prepare = bind_objective("clm", None, SpecialTokens(cfg.vocab_size))
    return cfg, build_model(cfg), tx, schedule, prepare


def _gpt2_step(mesh_sizes: dict, host_state=None, **overrides):
    """(state after one train step, its loss, the state's shardings) of the narrow GPT-2 preset
    on ``mesh_sizes``, from ``host_state`` (None: a fresh init on the mesh)."""
    cfg, model, tx, schedule, prepare = _gpt2_parts(**overrides)
    mesh = make_mesh(mesh_sizes, jax.devices()[:math.prod(mesh_sizes.values())])
    if host_state is None:
        state, shardings = create_train_state(model, tx, mesh, seed=0)
    else:
        shardings = state_shardings(model, tx, mesh)[1]
        state = jax.device_put(host_state, shardings)
    rows = np.random.default_rng(0).integers(3, cfg.vocab_size, (8, 16)).astype(np.int32)
    rows[:, -1] = cfg.vocab_size - 1
    batch = {"inputs": jax.make_array_from_process_local_data(batch_sharding(mesh, 2), rows)}
    step = sharded_jit(make_train_step(model, tx, prepare, schedule), mesh,
                       in_shardings=(shardings, None), out_shardings=(shardings, None))
    state, metrics = step(state, batch)
    return jax.device_get(state), float(metrics["loss"]), shardings


def test_gpt2_preset_shards_its_padded_vocabulary_over_tensor_and_matches_one_device():
    """data=2 × fsdp=2 × tensor=2 on 8 simulated devices: the 50,304-row table is split over
    ``tensor`` (refused unpadded, with the fix named), and one step equals the one-device step."""
    with pytest.raises(ValueError, match=r"size 50257\) is not divisible by mesh.tensor=2.*"
                                         r"model.vocab_pad_multiple=2"):
        _gpt2_step({"data": 4, "tensor": 2}, vocab_pad_multiple=1)
    cfg, model, tx, _, _ = _gpt2_parts()
    host0 = jax.device_get(create_train_state(model, tx, make_mesh(
        {"data": 1}, jax.devices()[:1]), seed=0)[0])
    single, single_loss, _ = _gpt2_step({"data": 1}, host0)
    sharded, sharded_loss, shardings = _gpt2_step({"data": 2, "fsdp": 2, "tensor": 2}, host0)
    table = shardings.params["token_embed"]["embedding"].spec
    assert table == jax.sharding.PartitionSpec("tensor", "fsdp")
    assert sharded.params["token_embed"]["embedding"].shape == (50304, 64)
    assert np.isfinite(single_loss)
    np.testing.assert_allclose(sharded_loss, single_loss, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-6),
                 sharded.params, single.params)


def test_convert_cli_pads_on_import_and_writes_the_real_vocabulary_on_export(tmp_path):
    """``--vocab-pad-multiple``: the checkpoint holds the padded tables; ``--to-hf`` from it writes
    the golden GPT-2's tensors bit for bit."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "hf"
    assert convert_main(["--from-hf", golden_dir("gpt2"), "--to", str(ckpt),
                         "--vocab-pad-multiple", "80"]) == 0
    cfg, params = load_params(str(ckpt))
    assert cfg["vocab_pad_multiple"] == 80 and params["token_embed"]["embedding"].shape == (160, 64)
    assert convert_main(["--from", str(ckpt), "--to-hf", str(out)]) == 0
    src = load_file(os.path.join(golden_dir("gpt2"), "model.safetensors"))
    dst = load_file(os.path.join(out, "model.safetensors"))
    assert sorted(dst) == sorted(src)
    for k in src:
        np.testing.assert_array_equal(dst[k], src[k], err_msg=k)


def test_init_from_a_checkpoint_of_another_padding_repads_its_tables(tmp_path):
    """A trainer whose model pads to 400 rows (``model.vocab_pad_multiple``, a layout field) starts
    from an unpadded checkpoint: its first 320 rows are the checkpoint's, the padding zeros."""
    from jaxformer.checkpoint import save_params
    from jaxformer.train.config import load_config
    from jaxformer.train.loop import Trainer

    corpus = tmp_path / "corpus.txt"
    rng = np.random.default_rng(0)
    words = "the cat dog sat ran on a mat log big small red blue".split()
    corpus.write_text("\n".join(" ".join(rng.choice(words, 8)) for _ in range(200)))
    settings = {"num_train_steps": 1, "data.source": f"files:{corpus}", "model.d_model": 32,
                "model.num_heads": 2, "model.d_ff": 64, "model.num_layers": 1, "model.max_len": 64,
                "model.vocab_size": 320, "data.tokenizer.vocab_size": 320, "data.seq_len": 32,
                "data.batch_size": 8, "progress_bar": False}
    config = load_config(ROOT / "configs" / "gpt_pretrain_tiny.py", settings)
    unpadded = ModelConfig.from_dict(config.model.to_dict())
    params = jax.tree.map(np.asarray, build_model(unpadded).init(jax.random.key(3)))
    save_params(tmp_path / "pretrained", unpadded, params)
    config = load_config(ROOT / "configs" / "gpt_pretrain_tiny.py", {
        **settings, "model.vocab_pad_multiple": 100, "init_from": str(tmp_path / "pretrained")})
    trainer = Trainer(config, tmp_path / "run")
    got = jax.device_get(trainer.state.params)
    assert trainer.model_cfg.padded_vocab_size == 400
    np.testing.assert_array_equal(got["token_embed"]["embedding"][:320],
                                  params["token_embed"]["embedding"])
    assert not np.any(got["token_embed"]["embedding"][320:])
    jax.tree.map(np.testing.assert_array_equal, fit_vocab(got, trainer.model_cfg, unpadded), params)
