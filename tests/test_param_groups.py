"""Layer-wise learning-rate decay and embedding freezing (`jaxformer.train.param_groups`).

Depths: every parameter of tiny models of each family (plain and scanned, BERT with a classifier
and pooler, ALBERT's factorised embeddings, XLNet-style GPT, T5) against a rule written here from
the module names; LoRA adapters take their kernel's depth. Updates: two AdamW steps with per-depth
learning rates (and a head multiplier) against a float64 NumPy reference; scanned and unrolled
models get the same multipliers and updates; the defaults give the unchanged optimizer bit for bit;
freezing zeroes exactly the embeddings' updates for N steps and passes everything else through
unchanged. A tiny GPT training run (3 + 3 steps, resumed in between) keeps its embeddings
bit-identical for the first 3 steps and moves them afterwards. Invalid settings name the field.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from jaxformer.config import ModelConfig
from jaxformer.models import build_model
from jaxformer.models.head_parts import HEAD_MODULE_NAMES
from jaxformer.models.presets import preset
from jaxformer.train import config as train_config
from jaxformer.train.config import set_key
from jaxformer.train.loop import Trainer
from jaxformer.train.lora_run import trainable_abstract
from jaxformer.train.optim import decay_mask, make_optimizer, optimizer_settings
from jaxformer.train.param_groups import (
    depth_multipliers,
    is_embedding,
    layer_depths,
    map_params_by_path,
)

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(vocab_size=64, d_model=16, num_heads=2, d_ff=32, num_layers=3, max_len=16)
MODELS = {
    "bert_classify": ("bert_tiny", dict(head="classify", num_classes=2, pooler=True)),
    "bert_mlm": ("bert_tiny", {}),
    "albert": ("albert_tiny", dict(share_layers=False)),
    "gpt": ("gpt_tiny", {}),
    "gpt_plm": ("gpt_tiny", dict(permutation_lm=True)),
    "t5": ("t5_tiny", dict(num_encoder_layers=3, num_decoder_layers=2)),
}


def _model_cfg(name: str, **overrides) -> ModelConfig:
    base, extra = MODELS[name]
    return ModelConfig.from_dict(preset(base, **{**TINY, **extra, **overrides}))


@functools.cache
def _params(name: str):
    """Parameters of a tiny model's exact tree (`abstract_params`, unboxed), drawn N(0, 0.05²)
    (the values do not matter to the optimizer's algebra; ``model.init`` would cost seconds)."""
    cfg = _model_cfg(name)
    return jax.tree.map(lambda g: 0.05 * g, _grads(build_model(cfg).abstract(), 99))


def _flat(tree) -> dict[str, object]:
    out = {}
    map_params_by_path(lambda p, x: out.__setitem__(p, x) or x, tree)
    return out


def expected_depth(path: str, encoder_layers: int, decoder_layers: int, scanned: bool):
    """The documented rule, from module names: embeddings 0, encoder layer i → i + 1, decoder layer
    i → E + i + 1 (E = 0 without an encoder), the encoder's final norm in an encoder-decoder model
    → E, every other final norm and head → D = E + L_dec + 1."""
    top = path.split("/")[0]
    total = encoder_layers + decoder_layers + 1
    if top in ("token_embed", "embed", "encoder_embed", "decoder_embed", "jump_embed") \
            or top.endswith("_relative_bias"):
        return 0
    if top in HEAD_MODULE_NAMES or top == "decoder_norm":
        return total
    if top == "encoder_norm":
        return encoder_layers if decoder_layers else total
    offset = encoder_layers if top == "decoder" else 0
    n = decoder_layers if top == "decoder" else encoder_layers
    if scanned:
        assert path.split("/")[1] == "layers", path
        return offset + 1 + np.arange(n)
    return offset + 1 + int(re.match(r"(?:en|de)coder/layer_(\d+)/", path).group(1))


@pytest.mark.parametrize("scanned", [False, True], ids=["unrolled", "scanned"])
@pytest.mark.parametrize("name", list(MODELS))
def test_depth_of_every_parameter(name, scanned):
    cfg = _model_cfg(name, scan_layers=scanned)
    params = build_model(cfg).abstract()
    depths, total = layer_depths(params)
    enc = {"t5": 3, "bert_classify": 3, "bert_mlm": 3, "albert": 3}.get(name, 0)
    dec = {"t5": 2, "gpt": 3, "gpt_plm": 3}.get(name, 0)
    assert total == enc + dec + 1
    seen = set()
    for path, depth in _flat(depths).items():
        want = expected_depth(path, enc, dec, scanned)
        np.testing.assert_array_equal(np.asarray(depth), want, err_msg=path)
        seen.update(np.atleast_1d(want).tolist())
    assert seen == set(range(total + 1))  # every depth holds parameters, 0 … D
    mults = _flat(depth_multipliers(params, 0.5))
    for path, depth in _flat(depths).items():  # decay^(D − d), broadcastable to the parameter
        leaf = _flat(params)[path]
        assert mults[path].ndim in (0, len(leaf.shape))
        np.testing.assert_array_equal(mults[path].reshape(-1), 0.5 ** (total - np.asarray(depth)))


def test_lora_adapters_take_their_kernels_depth():
    cfg = _model_cfg("bert_classify")
    lora_cfg = ml_collections.ConfigDict(dict(rank=2, alpha=4.0, targets=("query", "ffn")))
    trained = trainable_abstract(build_model(cfg), lora_cfg)[0]
    depths, total = layer_depths(trained)
    flat = _flat(depths)
    assert total == 4 and flat["classifier/kernel"] == 4
    assert flat["lora/encoder/layer_0/self_attn/query/lora_a"] == 1
    assert flat["lora/encoder/layer_2/ffn/wo/lora_b"] == 3


def test_lora_updates_are_scaled_by_their_kernels_depth():
    cfg = _model_cfg("bert_classify")
    lora_opt = dict(OPT, lora=dict(rank=2, alpha=4.0, targets=("value",)))
    trained = _grads(trainable_abstract(build_model(cfg),
                                        ml_collections.ConfigDict(lora_opt["lora"]))[0], 5)
    plain, _ = make_optimizer(optimizer_settings(**lora_opt), cfg.d_model, 10)
    decayed, _ = make_optimizer(optimizer_settings(**lora_opt, layer_lr_decay=0.5),
                                cfg.d_model, 10)
    (u_plain,), (u_decayed,) = _run(plain, trained, 1), _run(decayed, trained, 1)
    for path, u in _flat(u_decayed).items():  # lora/encoder/layer_i/... at depth i + 1 of D = 4
        depth = 4 if path.startswith("classifier") else 1 + int(path.split("/")[2][len("layer_"):])
        np.testing.assert_allclose(u, _flat(u_plain)[path] * 0.5 ** (4 - depth), rtol=1e-6,
                                   err_msg=path)


def _grads(params, seed):
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(tree, [jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)])


def _run(tx, params, steps=2):
    """Updates of ``steps`` optimizer steps on fixed random gradients (params advance)."""
    state, out, update = tx.init(params), [], jax.jit(tx.update)
    for t in range(steps):
        updates, state = update(_grads(params, t), state, params)
        out.append(updates)
        params = optax.apply_updates(params, updates)
    return out


OPT = dict(schedule="constant", peak_lr=1e-2, b1=0.9, b2=0.99, eps=1e-6, weight_decay=0.1)


@pytest.mark.parametrize("head_mult", [1.0, 3.0])
def test_two_adamw_steps_match_float64_reference(head_mult):
    cfg, params = _model_cfg("bert_classify"), _params("bert_classify")
    decay = 0.5
    opt = optimizer_settings(**OPT, layer_lr_decay=decay, head_lr_multiplier=head_mult)
    tx, _ = make_optimizer(opt, cfg.d_model, 10, params)
    got = _run(tx, params)
    p64 = {k: np.asarray(v, np.float64) for k, v in _flat(params).items()}
    mask = {k: k.endswith("/kernel") and p.ndim >= 2 for k, p in p64.items()}  # decay_mask
    m = {k: 0.0 for k in p64}
    v = {k: 0.0 for k in p64}
    for t in range(2):
        g = {k: np.asarray(x, np.float64) for k, x in _flat(_grads(params, t)).items()}
        want = {}
        for k, p in p64.items():  # Loshchilov & Hutter 2019 Alg. 2 with lr · decay^(D − depth)
            m[k] = OPT["b1"] * m[k] + (1 - OPT["b1"]) * g[k]
            v[k] = OPT["b2"] * v[k] + (1 - OPT["b2"]) * g[k] ** 2
            adam = (m[k] / (1 - OPT["b1"] ** (t + 1))) / (
                np.sqrt(v[k] / (1 - OPT["b2"] ** (t + 1))) + OPT["eps"])
            depth = expected_depth(k, 3, 0, False)
            lr = OPT["peak_lr"] * decay ** (4 - depth) * (head_mult if k.split("/")[0] in (
                "classifier", "pooler") else 1.0)
            want[k] = -lr * (adam + OPT["weight_decay"] * p * mask[k])
        for k, u in _flat(got[t]).items():
            np.testing.assert_allclose(np.asarray(u), want[k], rtol=2e-5, atol=1e-9, err_msg=k)
        p64 = {k: p + np.asarray(_flat(got[t])[k], np.float64) for k, p in p64.items()}


def _stack_layers(unrolled: dict, stacks=("encoder", "decoder")) -> dict:
    """The scanned layout of an unrolled tree: ``S/layer_i/...`` → ``S/layers/...`` stacked on a
    leading axis."""
    out = dict(unrolled)
    for s in stacks:
        if s in out:
            layers = [out[s][f"layer_{i}"] for i in range(len(out[s]))]
            out[s] = {"layers": jax.tree.map(lambda *xs: jnp.stack(xs), *layers)}
    return out


def test_scanned_and_unrolled_get_equal_multipliers_and_updates():
    cfg, unrolled = _model_cfg("t5"), _params("t5")
    scanned = _stack_layers(unrolled)
    scan_cfg = _model_cfg("t5", scan_layers=True)
    assert jax.tree.structure(scanned) == jax.tree.structure(
        build_model(scan_cfg).abstract())
    m_unrolled = jax.tree.map(np.broadcast_to, depth_multipliers(unrolled, 0.7),
                              jax.tree.map(np.shape, unrolled))
    m_scanned = jax.tree.map(np.broadcast_to, depth_multipliers(scanned, 0.7),
                             jax.tree.map(np.shape, scanned))
    jax.tree.map(np.testing.assert_array_equal, _stack_layers(m_unrolled), m_scanned)
    opt = optimizer_settings(**OPT, layer_lr_decay=0.7, freeze_embeddings_steps=1)
    tx, _ = make_optimizer(opt, cfg.d_model, 10)
    grads_like = [_stack_layers(g) for g in [_grads(unrolled, t) for t in range(2)]]
    state, u_scanned, update = tx.init(scanned), [], jax.jit(tx.update)
    p = scanned
    for g in grads_like:  # the scanned model sees the unrolled model's gradients, stacked
        updates, state = update(g, state, p)
        u_scanned.append(updates)
        p = optax.apply_updates(p, updates)
    for a, b in zip(_run(tx, unrolled), u_scanned):
        jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-12),
                     _stack_layers(a), b)



def test_defaults_give_the_unchanged_optimizer_bit_for_bit():
    cfg, params = _model_cfg("bert_classify"), _params("bert_classify")
    opt = optimizer_settings("bert", warmup_steps=2, head_lr_multiplier=2.0)
    tx, schedule = make_optimizer(opt, cfg.d_model, 10, params)
    explicit, _ = make_optimizer(dataclasses.replace(opt, layer_lr_decay=1.0, freeze_embeddings_steps=0),
                                 cfg.d_model, 10, params)

    def adamw(lr):
        return optax.adamw(lr, b1=opt.b1, b2=opt.b2, eps=opt.eps, weight_decay=opt.weight_decay,
                           mask=decay_mask)

    head = ("classifier", "pooler")
    reference = optax.chain(optax.clip_by_global_norm(opt.clip_norm), optax.multi_transform(
        {"head": adamw(lambda s: 2.0 * schedule(s)), "backbone": adamw(schedule)},
        lambda p: map_params_by_path(
            lambda path, _: "head" if path.split("/")[0] in head else "backbone", p)))
    assert jax.tree.structure(tx.init(params)) == jax.tree.structure(reference.init(params))
    for a, b, c in zip(_run(tx, params, 3), _run(explicit, params, 3), _run(reference, params, 3)):
        jax.tree.map(np.testing.assert_array_equal, a, c)
        jax.tree.map(np.testing.assert_array_equal, b, c)


def test_freeze_zeroes_only_the_embeddings_and_only_for_n_steps():
    cfg, params = _model_cfg("gpt"), _params("gpt")
    opt = optimizer_settings(**OPT)
    plain, _ = make_optimizer(opt, cfg.d_model, 10)
    frozen, _ = make_optimizer(dataclasses.replace(opt, freeze_embeddings_steps=2), cfg.d_model, 10)
    plain_updates = _run(plain, params, 4)  # the same gradients; params differ after step 0
    state, p, update = frozen.init(params), params, jax.jit(frozen.update)
    for t in range(4):
        updates, state = update(_grads(params, t), state, p)
        p = optax.apply_updates(p, updates)
        for path, u in _flat(updates).items():
            if is_embedding(path) and t < 2:
                assert not np.any(np.asarray(u)), path
            elif t == 0 or not is_embedding(path):
                np.testing.assert_array_equal(u, _flat(plain_updates[t])[path], err_msg=path)
    assert {path.split("/")[0] for path in _flat(params) if is_embedding(path)} == {
        "token_embed", "embed"}
    # Adam's moments kept accumulating during the freeze: the same moments as the plain run
    moments = [s for s in jax.tree.leaves(state, is_leaf=lambda x: hasattr(x, "mu"))
               if hasattr(s, "mu")][0]
    emb = moments.mu["token_embed"]["embedding"]
    plain_state, plain_update = plain.init(params), jax.jit(plain.update)
    for t in range(4):
        _, plain_state = plain_update(_grads(params, t), plain_state, params)
    plain_mu = [s for s in jax.tree.leaves(plain_state, is_leaf=lambda x: hasattr(x, "mu"))
                if hasattr(s, "mu")][0].mu["token_embed"]["embedding"]
    np.testing.assert_array_equal(emb, plain_mu)


@pytest.mark.parametrize("key, value, message", [
    ("layer_lr_decay", 0.0, "optimizer.layer_lr_decay=0.0"),
    ("layer_lr_decay", 1.5, "optimizer.layer_lr_decay=1.5"),
    ("layer_lr_decay", -0.5, "optimizer.layer_lr_decay=-0.5"),
    ("freeze_embeddings_steps", -1, "optimizer.freeze_embeddings_steps=-1"),
])
def test_invalid_values_name_the_field(key, value, message):
    config = train_config.load_config(ROOT / "configs" / "bert_finetune_tiny.py")
    set_key(config, f"optimizer.{key}", value)
    with pytest.raises(ValueError, match=re.escape(message)):
        train_config.validate_config(config)  # each key alone: its setting's check


def test_settings_without_effect_or_depths_are_refused():
    lora_opt = dict(lora=dict(rank=2, alpha=4.0, targets=("query",)))
    with pytest.raises(ValueError, match="optimizer.freeze_embeddings_steps=3"):
        make_optimizer(optimizer_settings(freeze_embeddings_steps=3, **lora_opt), 16, 10)
    with pytest.raises(ValueError, match="optimizer.freeze_embeddings_steps=3"):
        make_optimizer(optimizer_settings(freeze_embeddings_steps=3, freeze_backbone=True),
                       16, 10)
    cfg = _model_cfg("albert", share_layers=True)  # one block for every layer: no depth
    params = build_model(cfg).abstract()
    tx, _ = make_optimizer(optimizer_settings(layer_lr_decay=0.8), cfg.d_model, 10)
    with pytest.raises(ValueError, match="model.share_layers=True"):
        jax.eval_shape(tx.init, params)


FREEZE_STEPS = 3


def _gpt_run_config(total_steps: int):
    c = train_config.load_config(ROOT / "configs" / "gpt_pretrain_tiny.py")
    c.model.update(dict(d_model=32, num_heads=2, d_ff=64, num_layers=2, max_len=32,
                        vocab_size=512))
    for key, value in {"data.tokenizer.vocab_size": 512, "data.tokenizer.max_train_texts": 300,
                       "data.seq_len": 32, "data.batch_size": 8, "num_train_steps": total_steps,
                       "log_every_steps": 1, "eval.num_batches": 0, "progress_bar": False,
                       "checkpoint.every_steps": FREEZE_STEPS, "optimizer.warmup_steps": 1,
                       "optimizer.peak_lr": 3e-3, "optimizer.layer_lr_decay": 0.8,
                       "optimizer.freeze_embeddings_steps": FREEZE_STEPS}.items():
        set_key(c, key, value)
    return c


@pytest.mark.slow
def test_a_training_run_keeps_embeddings_frozen_then_trains_them(tmp_path):
    """3 steps, then a resumed run to step 6 (the freeze count is in the checkpointed state)."""
    first = Trainer(_gpt_run_config(FREEZE_STEPS), tmp_path)
    init = jax.device_get(first.state.params)
    first.run()
    at_3 = jax.device_get(first.state.params)
    second = Trainer(_gpt_run_config(2 * FREEZE_STEPS), tmp_path)
    assert second.start_step == FREEZE_STEPS
    second.run()
    at_6 = jax.device_get(second.state.params)
    for path, x in _flat(init).items():
        if is_embedding(path):
            np.testing.assert_array_equal(_flat(at_3)[path], x, err_msg=path)
            assert np.any(_flat(at_6)[path] != x), path
        else:
            assert np.any(_flat(at_3)[path] != x), path
