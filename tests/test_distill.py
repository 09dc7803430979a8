"""Knowledge distillation (DistilBERT, Sanh et al. 2019): the loss against a float64 NumPy reference
of its formula, the teacher's frozen parameters, the every-other-layer student initialisation, the
config's refusals, and a tiny distillation on real text (`jaxformer.train.distill`)."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.checkpoint import load_checkpoint_params, read_metrics
from jaxformer.cli.convert import main as convert_main
from jaxformer.config import ModelConfig
from jaxformer.models import build_model
from jaxformer.models.presets import preset
from jaxformer.train.config import load_config, validate_config
from jaxformer.train.distill import DistillLoss, check_student, select_layers
from jaxformer.train.distill_config import DistillSettings, settings
from jaxformer.train.loop import Trainer
from jaxformer.train.setup import merge_backbone, open_pretrained
from jaxformer.train.step import _sums

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(vocab_size=97, d_model=32, num_heads=2, d_ff=64, max_len=16)


def _cfg(name: str, num_layers: int, **fields) -> ModelConfig:
    return ModelConfig.from_dict({**preset(name), **SMALL, "num_layers": num_layers, **fields})


def _settings(**kw) -> DistillSettings:
    base = dict(teacher="t", teacher_step=None, teacher_best=False, temperature=2.0, alpha=5.0,
                beta=2.0, gamma=1.0, init_student=False)
    return DistillSettings(**{**base, **kw})


def _batch(cfg: ModelConfig, seed: int = 0) -> dict:
    """A prepared batch: token objectives weight ~half the positions, classification every row."""
    rng = np.random.default_rng(seed)
    tokens = jnp.asarray(rng.integers(1, cfg.vocab_size, (3, 8)), jnp.int32)
    if cfg.head == "classify":
        targets, weights = rng.integers(0, cfg.num_classes, 3), np.array([1.0, 1.0, 0.0])
    else:
        targets, weights = rng.integers(0, cfg.vocab_size, (3, 8)), (rng.random((3, 8)) < 0.5) * 1.0
    return {"model_inputs": {"tokens": tokens}, "targets": jnp.asarray(targets, jnp.int32),
            "weights": jnp.asarray(weights, jnp.float32)}


def _hard(logits, nsp_logits, prepared):
    return _sums(logits, nsp_logits, prepared)


CASES = [("gpt_mini", {}), ("bert_mini", {}),
         ("bert_mini", dict(head="classify", num_classes=3, pooling="first"))]


@pytest.mark.parametrize("name,fields", CASES)
def test_kl_is_zero_when_the_student_is_the_teacher(name, fields):
    cfg = _cfg(name, 2, **fields)
    model = build_model(cfg)
    params = model.init(jax.random.key(0))
    loss = DistillLoss(model, _settings(), cfg.pooling if cfg.head == "classify" else None)
    sums = loss(model, params, params, _batch(cfg), dropout_rng=None, hard_sums=_hard)
    assert float(sums["distill_kl"]) == 0.0
    assert abs(float(sums["distill_cos"])) < 1e-5
    other = model.init(jax.random.key(1))  # a different teacher: KL > 0
    assert float(loss(model, params, other, _batch(cfg), dropout_rng=None,
                      hard_sums=_hard)["distill_kl"]) > 1e-5


def _log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _reference_loss(s_logits, t_logits, s_hidden, t_hidden, targets, w, T, a, b, g) -> float:
    """α·T²·Σw·KL(p_t ‖ p_s) + β·Σw·CE + γ·Σw·(1 − cos), over Σw, in float64 (DistilBERT §3)."""
    s, t = (np.asarray(x, np.float64) for x in (s_logits, t_logits))
    log_p, log_q = _log_softmax(t / T), _log_softmax(s / T)
    kl = (np.exp(log_p) * (log_p - log_q)).sum(-1)
    ce = -np.take_along_axis(_log_softmax(s), np.asarray(targets)[..., None], -1)[..., 0]
    hs, ht = (np.asarray(x, np.float64) for x in (s_hidden, t_hidden))
    cos = (hs * ht).sum(-1) / (np.linalg.norm(hs, axis=-1) * np.linalg.norm(ht, axis=-1))
    w = np.asarray(w, np.float64)
    return float(((a * T * T * kl + b * ce + g * (1 - cos)) * w).sum() / w.sum())


@pytest.mark.parametrize("name,fields", CASES)
def test_whole_loss_matches_the_formula_for_several_temperatures(name, fields):
    """The hook's loss on a 2-layer student and a 4-layer teacher against the float64 reference
    computed from their logits and hidden states; the T² factor is the formula's."""
    s_cfg, t_cfg = _cfg(name, 2, **fields), _cfg(name, 4, **fields)
    student, teacher = build_model(s_cfg), build_model(t_cfg)
    sp = student.init(jax.random.key(0))
    tp = teacher.init(jax.random.key(1))
    batch = _batch(s_cfg, seed=3)
    (s_out, s_h), (t_out, t_h) = (m.apply(p, **batch["model_inputs"], return_hidden=True)
                                  for m, p in ((student, sp), (teacher, tp)))
    s_out, t_out = (o[0] if isinstance(o, tuple) else o for o in (s_out, t_out))
    if s_cfg.head == "classify":  # pooled as the head pools: the first token
        s_h, t_h = s_h[:, 0], t_h[:, 0]
    for T, (a, b, g) in [(0.5, (5.0, 2.0, 1.0)), (1.0, (1.0, 0.0, 0.0)), (2.0, (0.3, 1.0, 2.0)),
                         (4.0, (1.0, 0.5, 0.0))]:
        loss = DistillLoss(teacher, _settings(temperature=T, alpha=a, beta=b, gamma=g),
                           s_cfg.pooling if s_cfg.head == "classify" else None)
        sums = loss(student, sp, tp, batch, dropout_rng=None, hard_sums=_hard)
        got = float(sums["loss"]) / float(sums["weight"])
        want = _reference_loss(s_out, t_out, s_h, t_h, batch["targets"], batch["weights"], T, a, b, g)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-7, err_msg=f"T={T}")


@pytest.mark.slow  # compiles the distillation step's gradient (~7 s)
def test_no_gradient_reaches_the_teacher():
    s_cfg, t_cfg = _cfg("bert_mini", 2), _cfg("bert_mini", 4)
    student, teacher = build_model(s_cfg), build_model(t_cfg)
    sp = student.init(jax.random.key(0))
    tp = teacher.init(jax.random.key(1))
    loss = DistillLoss(teacher, _settings(), None)
    batch = _batch(s_cfg)

    def total(s, t):
        return loss(student, s, t, batch, dropout_rng=None, hard_sums=_hard)["loss"]

    g_student, g_teacher = jax.jit(jax.grad(total, argnums=(0, 1)))(sp, tp)  # eager: 2x slower
    assert all(not np.any(np.asarray(g)) for g in jax.tree.leaves(g_teacher))
    assert sum(float(jnp.abs(g).sum()) for g in jax.tree.leaves(g_student)) > 0


@pytest.mark.parametrize("teacher_scan,student_scan", [(False, False), (True, False),
                                                       (False, True), (True, True)])
def test_student_takes_every_other_teacher_layer(teacher_scan, student_scan):
    t_cfg = _cfg("gpt_mini", 5, scan_layers=teacher_scan)
    s_cfg = _cfg("gpt_mini", 3, scan_layers=student_scan)
    check_student(s_cfg, t_cfg, _settings(init_student=True))
    tp = jax.tree.map(np.asarray, build_model(t_cfg).init(jax.random.key(0)))
    fresh = build_model(s_cfg).init(jax.random.key(1))
    params, new = merge_backbone(fresh, select_layers(tp, t_cfg, 3, student_scan))
    assert new == []

    def layer(p, i, scanned):
        stack = p["decoder"]
        return (jax.tree.map(lambda a: np.asarray(a)[i], stack["layers"]) if scanned
                else stack[f"layer_{i}"])

    for i, j in enumerate((0, 2, 4)):
        for a, b in zip(jax.tree.leaves(layer(params, i, student_scan)),
                        jax.tree.leaves(layer(tp, j, teacher_scan)), strict=True):
            np.testing.assert_array_equal(a, b)
    for name in ("token_embed", "embed", "decoder_norm"):  # embeddings and the final norm copied
        for a, b in zip(jax.tree.leaves(params[name]), jax.tree.leaves(tp[name]), strict=True):
            np.testing.assert_array_equal(a, b)


def test_student_must_match_the_teacher_widths():
    t_cfg = _cfg("bert_mini", 4)
    with pytest.raises(ValueError, match=r"model\.d_model=64 \(teacher: 32\)"):
        check_student(_cfg("bert_mini", 2, d_model=64), t_cfg, _settings())
    with pytest.raises(ValueError, match=r"model\.d_ff=32 \(teacher: 64\)"):
        check_student(_cfg("bert_mini", 2, d_ff=32), t_cfg, _settings(init_student=True))
    check_student(_cfg("bert_mini", 2, d_ff=32), t_cfg, _settings())  # widths of the KL and cos
    with pytest.raises(ValueError, match=r"model\.num_layers=3.*at most 2"):
        check_student(_cfg("bert_mini", 3), t_cfg, _settings(init_student=True))
    with pytest.raises(ValueError, match=r"model\.vocab_size=50"):
        check_student(_cfg("bert_mini", 2, vocab_size=50), t_cfg, _settings(gamma=0.0))


def test_a_distilbert_shaped_student_drops_token_types_and_pooler():
    """DistilBERT §3: the student of a BERT teacher has no token-type table and no pooler; it takes
    the teacher's layers 0, 2 and every other embedding, and only these."""
    t_cfg = _cfg("bert_mini", 4, head="classify", num_classes=3, pooler=True)
    s_cfg = _cfg("bert_mini", 2, head="classify", num_classes=3, type_vocab_size=0,
                 pooler=False)
    assert t_cfg.type_vocab_size == 2
    check_student(s_cfg, t_cfg, _settings(init_student=True))
    with pytest.raises(ValueError, match=r"model\.type_vocab_size=0 \(teacher: 2\)"):
        check_student(s_cfg.replace(family="decoder", head="classify", pooling="last"),
                      t_cfg.replace(family="decoder", pooling="last"), _settings(init_student=True))
    tp = jax.tree.map(np.asarray, build_model(t_cfg).init(jax.random.key(0)))
    fresh = build_model(s_cfg).init(jax.random.key(1))
    params, new = merge_backbone(fresh, select_layers(tp, t_cfg, 2, False))
    assert new == [] and "pooler" in tp and "pooler" not in params
    assert set(params["embed"]) == {"pos_embedding", "norm"} and "type_embedding" in tp["embed"]
    for a, b in zip(jax.tree.leaves(params["encoder"]["layer_1"]),
                    jax.tree.leaves(tp["encoder"]["layer_2"]), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("overrides,message", [
    ({"objective.name": "seq2seq"}, r"objective\.name='seq2seq'"),
    ({"parallel": "pmap"}, r"parallel='jit'"),
    ({"distill.temperature": 0.0}, r"distill\.temperature=0\.0"),
    ({"distill.alpha": 0.0, "distill.beta": 0.0, "distill.gamma": 0.0}, "all 0"),
    ({"distill.init_student": True, "init_from": "/x"}, "choose one"),
])
def test_config_refuses_what_distillation_cannot_run(overrides, message):
    config = load_config(ROOT / "configs" / "gpt_pretrain_tiny.py",
                         {"distill.teacher": "/some/run", **overrides})
    with pytest.raises(ValueError, match=message):
        validate_config(config)


def test_without_a_teacher_the_other_keys_are_ignored():
    """A distillation config run with ``distill.teacher=''`` (the no-teacher baseline) trains
    without distillation, even with settings distillation refuses (parallel='pmap')."""
    config = load_config(ROOT / "configs" / "bert_distill_tiny.py",
                         {"distill.teacher": "", "parallel": "pmap"})
    validate_config(config)
    assert settings(config) is None
    assert settings(load_config(ROOT / "configs" / "bert_distill_tiny.py")) == DistillSettings(
        "runs/bert_pretrain", None, False, 2.0, 5.0, 2.0, 1.0, True)


# --------------------------------------------------------------------------------------------------
# A tiny distillation on real text: one teacher run shared by the slow tests.

TINY = {"model.d_model": 64, "model.num_heads": 2, "model.d_ff": 128, "model.max_len": 64,
        "model.vocab_size": 512, "data.tokenizer.vocab_size": 512,
        "data.tokenizer.max_train_texts": 1500, "data.seq_len": 32, "data.batch_size": 8,
        "log_every_steps": 5, "eval.num_batches": 4, "progress_bar": False,
        "optimizer.warmup_steps": 5}
TEACHER_STEPS, STUDENT_STEPS, EVAL_EVERY = 40, 20, 10


def _config(num_layers: int, steps: int, **overrides):
    return load_config(ROOT / "configs" / "gpt_pretrain_tiny.py", {
        **TINY, "model.num_layers": num_layers, "num_train_steps": steps,
        "eval.every_steps": min(steps, EVAL_EVERY), "checkpoint.every_steps": steps,
        "optimizer.peak_lr": 3e-3, **overrides})


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory):
    wd = tmp_path_factory.mktemp("teacher")
    Trainer(_config(4, TEACHER_STEPS), wd).run()
    return wd


def _student_eval_losses(wd, **overrides) -> dict[int, float]:
    """{step: eval_loss} of a 2-layer student trained STUDENT_STEPS steps."""
    Trainer(_config(2, STUDENT_STEPS, **overrides), wd).run()
    return {r["step"]: r["eval_loss"] for r in read_metrics(wd) if "eval_loss" in r}


@pytest.mark.slow
def test_distillation_lowers_the_students_loss_faster(teacher_run, tmp_path):
    """Same student, seed, steps and data (the teacher's tokenizer): with the teacher the held-out
    hard-label cross-entropy after STUDENT_STEPS steps is lower than without."""
    tokenizer = str(teacher_run / "tokenizer.model")
    plain = _student_eval_losses(tmp_path / "plain", **{"data.tokenizer.path": tokenizer})
    distilled = _student_eval_losses(tmp_path / "distilled", **{"distill.teacher": str(teacher_run)})
    print(f"student eval_loss by step: without a teacher {plain}, distilled {distilled}")
    assert plain.keys() == distilled.keys() == {EVAL_EVERY, STUDENT_STEPS}
    for step in plain:  # measured 5.317 → 5.209 at step 10, 4.991 → 4.937 at step 20
        assert distilled[step] < plain[step] - 0.02, step
    # the checkpoint holds the 2-layer student only; a resume reloads the teacher and goes on
    saved = load_checkpoint_params(tmp_path / "distilled")
    assert set(saved["decoder"]) == {"layer_0", "layer_1"}
    resumed = Trainer(_config(2, STUDENT_STEPS + 5, **{"distill.teacher": str(teacher_run)}),
                      tmp_path / "distilled")
    assert resumed.start_step == STUDENT_STEPS and resumed.extension.frozen is not None
    assert resumed.run()["eval_loss"] < distilled[STUDENT_STEPS] + 0.1


@pytest.mark.slow
def test_init_student_starts_from_teacher_layers_0_and_2(teacher_run, tmp_path):
    trainer = Trainer(_config(2, 1, **{"distill.teacher": str(teacher_run),
                                       "distill.init_student": True}), tmp_path / "init")
    trainer.lock.release()
    teacher = load_checkpoint_params(teacher_run)
    student = jax.device_get(trainer.state.params)
    for i, j in ((0, 0), (1, 2)):
        for a, b in zip(jax.tree.leaves(student["decoder"][f"layer_{i}"]),
                        jax.tree.leaves(teacher["decoder"][f"layer_{j}"]), strict=True):
            np.testing.assert_array_equal(a, b)
    assert trainer.settings.distill.init_student is True
    # distill.teacher_step picks a step as init_from_step does; a Hugging Face dir has none
    config = _config(2, 1, **{"distill.teacher": str(teacher_run), "distill.teacher_step": 40})
    assert open_pretrained(config, "distill.teacher").run.step_dir.name == str(TEACHER_STEPS)
    config = _config(2, 1, **{"distill.teacher": str(teacher_run), "distill.teacher_step": 7})
    with pytest.raises(FileNotFoundError, match="40"):
        open_pretrained(config, "distill.teacher")
    # the same teacher exported to a Hugging Face directory: imported as init_from imports it
    hf_dir = tmp_path / "teacher_hf"
    assert convert_main(["--from", str(teacher_run), "--to-hf", str(hf_dir)]) == 0
    from_hf = Trainer(_config(2, 1, **{"distill.teacher": str(hf_dir),
                                       "distill.init_student": True}), tmp_path / "init_hf")
    from_hf.lock.release()
    config = _config(2, 1, **{"distill.teacher": str(hf_dir), "distill.teacher_best": True})
    with pytest.raises(ValueError, match="unset distill.teacher_step and distill.teacher_best"):
        open_pretrained(config, "distill.teacher")
    for a, b in zip(jax.tree.leaves(jax.device_get(from_hf.state.params)), jax.tree.leaves(student),
                    strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
