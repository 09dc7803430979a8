"""LoRA (`jaxformer.models.lora`): adapters, merging, sharding, the trainer and the export.

Unit level (tiny models of every family): at initialisation the adapted model's logits equal the
base model's bit for bit (B = 0); the merged kernel equals W + (alpha/r)·A B computed by hand in
NumPy; a model applied to merged parameters equals one whose kernels are patched by hand; adapters
shard like their kernels on FSDP/tensor meshes of 8 simulated devices; the optimizer state of a
LoRA run is the adapters' size (compiled ``memory_analysis``: rank 4 < rank 8 < full fine-tuning).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxformer.checkpoint import load_checkpoint_params, load_for_inference, read_metrics
from jaxformer.cli.convert import main as convert_main
from jaxformer.cli.generate import main as generate_main
from jaxformer.cli.predict import main as predict_main
from jaxformer.config import ModelConfig
from jaxformer.convert import load_hf
from jaxformer.decode import generate_text
from jaxformer.evaluate_run import evaluate_run
from jaxformer.models import build_model, lora
from jaxformer.models.presets import preset
from jaxformer.parallel.mesh import make_mesh
from jaxformer.parallel.rules import param_shardings
from jaxformer.predict import classify
from jaxformer.train import config as train_config
from jaxformer.train.config import set_key
from jaxformer.train.loop import Trainer, train_and_evaluate
from jaxformer.train.lora_run import trainable_abstract
from jaxformer.train.optim import make_optimizer, optimizer_settings
from jaxformer.train.state import dummy_model_inputs

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(vocab_size=128, d_model=32, num_heads=4, d_ff=64, num_layers=2, max_len=16)
FAMILIES = {"gpt": "gpt_tiny", "bert": "bert_tiny", "t5": "t5_tiny"}
ALL_TARGETS = ("query", "key", "value", "out", "ffn")


def _lora_cfg(rank=4, alpha=8.0, targets=ALL_TARGETS):
    return ml_collections.ConfigDict(dict(rank=rank, alpha=alpha, targets=targets))


def _model(family, **overrides):
    cfg = ModelConfig.from_dict(preset(FAMILIES[family], **{**TINY, **overrides}))
    return cfg, build_model(cfg)


FAST_COMPILE = {"xla_backend_optimization_level": 0}  # as tests/test_parallel.py


@functools.cache
def _forward(model, cfg):
    """The jitted forward of ``model``: one compiled program (eagerly each of its ~170 operations
    compiles alone, ~3x slower for these tiny models); ``params`` stay arguments, never constants."""
    def logits(params):
        out = model.apply(params, **dummy_model_inputs(cfg, 2, 8))
        return out[0] if isinstance(out, tuple) else out

    return jax.jit(logits, compiler_options=FAST_COMPILE)


def _logits(model, cfg, params):
    return _forward(model, cfg)(params)


def _init(model, cfg, seed: int = 0):
    """``model.init`` as one compiled program."""
    return jax.jit(lambda key: model.init(key),
                   compiler_options=FAST_COMPILE)(jax.random.key(seed))


@pytest.mark.parametrize("family,scan", [("gpt", False)] + [
    pytest.param(f, s, marks=pytest.mark.slow) for f in FAMILIES for s in (False, True)
    if (f, s) != ("gpt", False)])
def test_adapted_model_equals_base_at_init(family, scan):
    cfg, model = _model(family, scan_layers=scan)
    params = _init(model, cfg)
    trained = lora.trainable(params, jax.random.key(1), _lora_cfg())
    adapted = lora.model_params(params, trained, lora.lora_scale(_lora_cfg()))
    np.testing.assert_array_equal(_logits(model, cfg, adapted), _logits(model, cfg, params))
    per_block = 4 + 2 + int(cfg.gated_ffn)  # q k v o, wi (wi_gate) wo
    blocks = [per_block, per_block + 4] if family == "t5" else [per_block]  # + cross-attention
    expected = sum(blocks) * (1 if scan else cfg.num_layers)
    assert len(lora.target_paths(params, ALL_TARGETS)) == expected


@pytest.mark.parametrize("scan", [False, True])
def test_merge_is_w_plus_scaled_ab_by_hand(scan):
    cfg, model = _model("gpt", scan_layers=scan)
    params = _init(model, cfg)
    adapters = lora.init_adapters(jax.random.key(1), params, 3, ("out", "query", "ffn"))
    adapters = jax.tree.map(lambda x: x + 0.1, adapters)  # B ≠ 0
    merged = lora.merge(params, adapters, 0.5)
    stack = params["decoder"]["layers"] if scan else params["decoder"]["layer_1"]
    got = merged["decoder"]["layers"] if scan else merged["decoder"]["layer_1"]
    ad = adapters["decoder"]["layers" if scan else "layer_1"]
    for parent, name in (("self_attn", "out"), ("self_attn", "query"), ("ffn", "wo")):
        w = np.asarray(stack[parent][name]["kernel"], np.float64)
        a = np.asarray(ad[parent][name]["lora_a"], np.float64)
        b = np.asarray(ad[parent][name]["lora_b"], np.float64)
        lead = 1 if scan else 0
        n_in = 2 if name == "out" else 1
        a2 = a.reshape(*a.shape[:lead], -1, a.shape[-1])
        b2 = b.reshape(*b.shape[:lead + 1], -1)
        want = w + 0.5 * (a2 @ b2).reshape(w.shape)
        assert a.shape[lead:lead + n_in] == w.shape[lead:lead + n_in]
        np.testing.assert_allclose(np.asarray(got[parent][name]["kernel"]), want, rtol=1e-5,
                                   atol=1e-6)
    # untargeted kernels (key, value) and everything else are untouched
    np.testing.assert_array_equal(got["self_attn"]["key"]["kernel"], stack["self_attn"]["key"]["kernel"])
    np.testing.assert_array_equal(merged["token_embed"]["embedding"], params["token_embed"]["embedding"])


def test_adapters_carry_logical_axes_and_shard_like_their_kernels():
    """`lora.trainable_axes`: an adapter of a kernel named ``(*b, *in, *out)`` is named
    ``(*b, *in, None)`` (A) and ``(*b, None, *out)`` (B), and shards like its kernel."""
    cfg, model = _model("gpt", scan_layers=True)
    trained, axes = trainable_abstract(model, _lora_cfg())
    q = axes["lora"]["decoder"]["layers"]["self_attn"]["query"]
    assert q["lora_a"] == ("layers", "embed", None)
    assert q["lora_b"] == ("layers", None, "heads", "head_dim")
    o = axes["lora"]["decoder"]["layers"]["self_attn"]["out"]
    assert o["lora_a"] == ("layers", "heads", "head_dim", None)
    assert o["lora_b"] == ("layers", None, "embed")
    is_axes = lambda x: isinstance(x, tuple)  # noqa: E731
    for (path, names), shape in zip(jax.tree_util.tree_flatten_with_path(axes, is_leaf=is_axes)[0],
                                    jax.tree.leaves(trained), strict=True):
        assert len(names) == len(shape.shape), path  # one name per dim, in the trained tree's order
    mesh = make_mesh(ml_collections.ConfigDict(dict(data=1, fsdp=2, tensor=4)))
    sh = param_shardings(axes, trained, mesh)["lora"]["decoder"]["layers"]
    assert tuple(sh["self_attn"]["query"]["lora_a"].spec) == (None, "fsdp", None)
    assert tuple(sh["self_attn"]["query"]["lora_b"].spec) == (None, None, "tensor", None)
    assert tuple(sh["ffn"]["wo"]["lora_a"].spec) == (None, "tensor", None)
    assert tuple(sh["ffn"]["wo"]["lora_b"].spec) == (None, None, "fsdp")


def test_task_heads_keep_their_axes_and_only_targets_get_adapters():
    """`lora.trainable_axes` of a classifier: the ``classifier`` head's axes as the model has them,
    adapters exactly on the target kernels (here query and value only)."""
    cfg, model = _model("bert", head="classify", num_classes=3)
    targets = ("query", "value")
    trained, axes = trainable_abstract(model, _lora_cfg(targets=targets))
    assert set(axes) == {"lora", "classifier"}
    assert axes["classifier"] == model.logical_axes()["classifier"]
    adapted = {p[:-1] for p in lora._flat(trained["lora"])}
    assert adapted == {p[:-1] for p in lora.target_paths(model.abstract(), targets)}
    assert len(adapted) == 2 * cfg.num_layers


def _opt_state_bytes(model, cfg, rank: int | None) -> int:
    """Compiled output bytes of ``tx.init`` on the trainable parameters (all of them: None)."""
    params = model.abstract()
    if rank is not None:
        params = jax.eval_shape(lambda p: lora.trainable(p, jax.random.key(0), _lora_cfg(rank)),
                                params)
    tx, _ = make_optimizer(optimizer_settings(), cfg.d_model, 10)
    compiled = jax.jit(tx.init).lower(params).compile()
    return compiled.memory_analysis().output_size_in_bytes, lora.count(params)


def test_optimizer_state_bytes_scale_with_adapter_size():
    cfg, model = _model("gpt")
    (b4, n4), (b8, n8), (bfull, nfull) = (_opt_state_bytes(model, cfg, r) for r in (4, 8, None))
    # Adam keeps two float32 moments per trainable scalar (+ step counters, buffer padding)
    for b, n in ((b4, n4), (b8, n8), (bfull, nfull)):
        assert 8 * n <= b <= 8 * n + 1024
    assert n8 == 2 * n4  # every adapter is linear in the rank
    assert b4 < b8 < bfull / 2  # d_model=32: every kernel adapted at rank 8 is still < half


def test_bad_lora_config_is_refused_by_name():
    for bad, word in ((dict(rank=-1), "rank"), (dict(alpha=0.0), "alpha"),
                      (dict(targets=("qkv",)), "targets"), (dict(targets=()), "targets")):
        with pytest.raises(ValueError, match=f"optimizer.lora.{word}"):
            make_optimizer(optimizer_settings(lora={**_lora_cfg(), **bad}), 32, 10)
    opt = optimizer_settings(freeze_backbone=True, lora=dict(rank=4, alpha=8.0,
                                                                   targets=("query",)))
    with pytest.raises(ValueError, match="freeze_backbone"):
        make_optimizer(opt, 32, 10)


def test_task_heads_are_the_fine_tuning_heads():
    assert set(lora.TASK_HEADS) >= {"classifier", "token_classifier"}
    assert not set(lora.TASK_HEADS) & {"lm_head", "mlm_head", "pooler", "nsp_head"}
    cfg, model = _model("bert", head="classify", num_classes=3)
    params = _init(model, cfg)
    trained = lora.trainable(params, jax.random.key(1), _lora_cfg(targets=("query", "value")))
    assert set(trained) == {"lora", "classifier"}
    assert jnp.all(trained["lora"]["encoder"]["layer_0"]["self_attn"]["value"]["lora_b"] == 0)


# ------------------------------------------------------------------------------------------------
# The trainer: LoRA fine-tuning of a tiny pretraining run and of a random-weight HF GPT-2.

TINY_RUN = dict(d_model=32, num_heads=2, d_ff=64, num_layers=1, max_len=64, vocab_size=512)  # as
# tests/test_train.py's TINY_MODEL: the same programs (the suite's compilation cache serves both)
LORA_KEYS = {"optimizer.lora.rank": 4, "optimizer.lora.alpha": 8.0,
             "optimizer.lora.targets": ("query", "value", "out", "ffn")}


def _run_config(name: str, steps: int = 30, **overrides):
    c = train_config.load_config(ROOT / "configs" / f"{name}.py")
    c.model.update(TINY_RUN)
    c.data.tokenizer.vocab_size, c.data.tokenizer.max_train_texts = 512, 1500
    c.data.seq_len, c.data.batch_size, c.num_train_steps = 32, 8, steps
    c.log_every_steps, c.eval.every_steps, c.eval.num_batches = 5, steps, 2
    c.checkpoint.every_steps, c.progress_bar = steps, False
    c.optimizer.warmup_steps, c.optimizer.peak_lr = 5, 3e-3
    for key, value in overrides.items():
        set_key(c, key, value)
    return c


def _first_last(workdir) -> tuple[float, float]:
    ls = [r["loss"] for r in read_metrics(workdir) if "loss" in r]
    return float(np.mean(ls[:2])), float(np.mean(ls[-2:]))


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    wd = tmp_path_factory.mktemp("gpt_pretrain")
    train_and_evaluate(_run_config("gpt_pretrain_tiny"), wd)
    return wd


def _flat(tree) -> dict:
    return {jax.tree_util.keystr(p): np.asarray(v)
            for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.mark.slow
def test_lora_finetune_trains_only_adapters_and_exports_merged(gpt_run, tmp_path):
    wd = tmp_path / "lora"
    config = _run_config("gpt_finetune_tiny", 40, init_from=str(gpt_run), **LORA_KEYS)
    config.optimizer.peak_lr = 1e-2
    trainer = Trainer(config, wd)
    assert set(trainer.state.params) == {"lora", "classifier"}
    base_before = _flat(trainer.extension.frozen)
    pretrained = _flat(load_checkpoint_params(gpt_run))
    for name, value in base_before.items():  # the base is init_from's backbone, bit for bit
        if not name.startswith("['classifier']"):
            np.testing.assert_array_equal(value, pretrained[name], err_msg=name)
    at_init = _flat(trainer.model_params(trainer.state))
    for name in at_init:  # adapted = base at initialisation (B = 0)
        np.testing.assert_array_equal(at_init[name], base_before[name], err_msg=name)
    trainer.run()
    first, last = _first_last(wd)
    assert last < first, (first, last)
    assert _flat(trainer.extension.frozen).keys() == base_before.keys()
    for name, value in _flat(trainer.extension.frozen).items():  # the base never changes
        np.testing.assert_array_equal(value, base_before[name], err_msg=name)
    adapted = _flat(trainer.model_params(trainer.state))
    changed = {n for n in adapted if not np.array_equal(adapted[n], base_before[n])}
    targets = ("['query']", "['value']", "['out']", "['wi']", "['wo']")
    assert changed and all(n.startswith("['classifier']") or
                           (n.endswith("['kernel']") and any(t in n for t in targets))
                           for n in changed), changed
    # the checkpoint holds the adapters and the task head only, not the base
    saved = load_checkpoint_params(wd)
    assert set(saved) == {"lora", "classifier"}
    assert lora.count(saved) < lora.count(trainer.extension.frozen) / 5
    # merged for inference and export: equal to the adapted model
    model_cfg, merged, _ = load_for_inference(wd)
    for name, value in _flat(merged).items():
        np.testing.assert_allclose(value, adapted[name], rtol=1e-6, atol=1e-7, err_msg=name)
    model = build_model(model_cfg)
    np.testing.assert_allclose(_logits(model, model_cfg, merged),
                               _logits(model, model_cfg, trainer.model_params(trainer.state)),
                               rtol=1e-5, atol=1e-6)
    # a rerun resumes the adapters (the base is read from init_from again)
    config.num_train_steps = 45
    again = Trainer(config, wd)
    assert again.start_step == 40
    for name, value in _flat(again.state.params).items():
        np.testing.assert_array_equal(value, _flat(trainer.state.params)[name], err_msg=name)
    again.lock.release()


@pytest.mark.slow
def test_lora_finetunes_an_imported_random_gpt2(tmp_path):
    from golden import golden_dir

    # a tiny random HF GPT-2 (tests/golden.py)
    config = _run_config("gpt_pretrain_tiny", 30, init_from=golden_dir("gpt2_v512"), **LORA_KEYS)
    config.optimizer.peak_lr = 1e-2
    trainer = Trainer(config, tmp_path / "run")
    assert set(trainer.state.params) == {"lora"}  # the LM head is pretrained: frozen
    trainer.run()
    first, last = _first_last(tmp_path / "run")
    assert last < first, (first, last)  # observed 6.22 -> 6.19 in 30 steps (a random base)
    # HF export of the merged model: read back, it is the adapted model
    out = tmp_path / "merged_hf"
    assert convert_main(["--from", str(tmp_path / "run"), "--to-hf", str(out)]) == 0
    adapted = _flat(trainer.model_params(trainer.state))
    _, back, _ = load_hf(str(out))
    for name, value in _flat(back).items():
        np.testing.assert_allclose(value, adapted[name], rtol=1e-6, atol=1e-7, err_msg=name)
    assert any(not np.array_equal(adapted[n], _flat(trainer.extension.frozen)[n]) for n in adapted)


@pytest.fixture(scope="module")
def lora_runs(gpt_run, tmp_path_factory):
    """Two short LoRA runs on ``gpt_run``: a sentiment classifier and a language model."""
    runs = {}
    for name, config_name in (("clf", "gpt_finetune_tiny"), ("lm", "gpt_pretrain_tiny")):
        config = _run_config(config_name, 10, init_from=str(gpt_run), **LORA_KEYS)
        config.optimizer.peak_lr = 1e-2
        trainer = Trainer(config, tmp_path_factory.mktemp(f"lora_{name}"))
        trainer.run()
        trainer.lock.release()
        runs[name] = trainer
    return runs


@pytest.mark.slow
def test_inference_entry_points_read_a_lora_run_merged(lora_runs, tmp_path, capsys):
    for trainer in lora_runs.values():  # load_for_inference = the trainer's adapted parameters
        adapted = _flat(trainer.model_params(trainer.state))
        _, merged, _ = load_for_inference(trainer.workdir)
        assert _flat(merged).keys() == adapted.keys()
        for name, value in _flat(merged).items():
            np.testing.assert_allclose(value, adapted[name], rtol=1e-6, atol=1e-7, err_msg=name)
    clf, lm = lora_runs["clf"], lora_runs["lm"]
    # predict: the classifier's probabilities are those of the adapted model
    texts = ["a gripping , funny film", "dull and far too long", "not bad"]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    out = tmp_path / "out.jsonl"
    assert predict_main(["--workdir", str(clf.workdir), "--input", str(tmp_path / "in.txt"),
                         "--output", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    want = list(classify(build_model(clf.model_cfg), clf.model_params(clf.state), clf.tokenizer,
                         clf.config.to_dict(), texts, batch_size=4))
    for row, p in zip(rows, want, strict=True):
        np.testing.assert_allclose(list(row["probabilities"].values()), p, rtol=1e-5, atol=1e-6)
    # evaluate: the classifier scores its split
    results = evaluate_run(clf.workdir, split="validation", progress=False)
    assert 0.0 <= results["metrics"]["accuracy"] <= 1.0, results
    # generate: the language model's greedy continuation is the adapted model's
    capsys.readouterr()
    assert generate_main(["--workdir", str(lm.workdir), "--prompt", "the king",
                          "--max_new_tokens", "6"]) == 0
    want = generate_text(build_model(lm.model_cfg), lm.model_params(lm.state), lm.tokenizer,
                         ["the king"], max_new_tokens=6)[0]
    assert f"OUTPUT: {want}" in capsys.readouterr().out


def test_lora_needs_init_from(tmp_path):
    with pytest.raises(ValueError, match="optimizer.lora.rank > 0 adapts the weights of init_from"):
        Trainer(_run_config("gpt_pretrain_tiny", **LORA_KEYS), tmp_path)


@pytest.mark.slow
def test_lora_on_an_fsdp_tensor_mesh_trains_like_data_parallel(lora_runs, gpt_run, tmp_path):
    """The LoRA classifier run of ``lora_runs`` (all devices on ``data``) repeated on a
    data=2 × fsdp=2 × tensor=2 mesh: the adapters and the frozen base are sharded by their logical
    axes, and the same updates come out (losses to float rounding, as tests/test_parallel.py)."""
    config = _run_config("gpt_finetune_tiny", 10, init_from=str(gpt_run), **LORA_KEYS)
    config.optimizer.peak_lr = 1e-2
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 2, 2, 2
    trainer = Trainer(config, tmp_path / "mesh")
    trainer.run()
    trainer.lock.release()
    adapters = jax.tree.leaves(trainer.state.params["lora"])
    assert adapters and any(not a.sharding.is_fully_replicated for a in adapters)
    losses = [[r["loss"] for r in read_metrics(wd) if "loss" in r]
              for wd in (lora_runs["clf"].workdir, tmp_path / "mesh")]
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
