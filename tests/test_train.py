"""The trainer end to end on real (registry-shipped) corpora, tiny models, CPU.

For each family: pretraining lowers the loss and writes checkpoints; fine-tuning with ``init_from``
starts from exactly the pretrained backbone and lowers its loss. For GPT: a killed run resumes at
its checkpoint and continues bit for bit; equal seeds give bitwise-identical runs, different seeds
differ.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxformer.checkpoint import load_checkpoint_params, read_metrics
from jaxformer.data.sources import SourceSettings, get_source
from jaxformer.data.tokenizer import Tokenizer
from jaxformer.settings import read
from jaxformer.train import config as train_config
from jaxformer.train.config import set_key
from jaxformer.train.loop import Trainer, train_and_evaluate

ROOT = Path(__file__).resolve().parents[1]
# One layer: nothing here depends on depth, and XLA:CPU compiles a 2-layer model's init and train
# step ~2.5x slower (~6 s + 5 s vs 2 s + 2 s), once per distinct program (~12 in this file).
# Pretraining still drops the loss by 0.77-1.35 nats in 30 steps (seeds 0-2, each family; the
# test asks for 0.3).
TINY_MODEL = dict(d_model=32, num_heads=2, d_ff=64, num_layers=1, max_len=64, vocab_size=512)


def load_config(name: str, **overrides):
    c = train_config.load_config(ROOT / "configs" / f"{name}.py")
    c.model.update(TINY_MODEL)
    c.data.tokenizer.vocab_size = 512
    c.data.tokenizer.max_train_texts = 1500
    c.data.seq_len = 32
    c.data.target_len = 32 if c.objective.name == "seq2seq" else 16
    c.data.batch_size = 8
    c.num_train_steps = 30
    c.log_every_steps = 5
    c.eval.every_steps = 30
    c.eval.num_batches = 4
    c.checkpoint.every_steps = 15
    c.progress_bar = False
    c.optimizer.warmup_steps = 5
    c.optimizer.peak_lr = 3e-3
    for key, value in overrides.items():
        set_key(c, key, value)
    return c


def losses(workdir) -> dict[int, float]:
    """step → train loss, the last row written for each step (a resumed run rewrites some)."""
    return {r["step"]: r["loss"] for r in read_metrics(workdir) if "loss" in r}


def first_last(workdir) -> tuple[float, float]:
    ls = [v for _, v in sorted(losses(workdir).items())]
    return float(np.mean(ls[:2])), float(np.mean(ls[-2:]))


FAMILIES = {"gpt": {}, "bert": {}, "t5": {}}


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    out = {}
    for fam in FAMILIES:
        wd = tmp_path_factory.mktemp(f"{fam}_pretrain")
        train_and_evaluate(load_config(f"{fam}_pretrain_tiny"), wd)
        out[fam] = wd
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_pretraining_lowers_loss_and_checkpoints(pretrained, family):
    wd = pretrained[family]
    first, last = first_last(wd)
    assert last < first - 0.3, (family, first, last)
    assert sorted(int(p.name) for p in (wd / "checkpoints").iterdir() if p.name.isdigit()) == [15, 30]
    assert (wd / "tokenizer.model").exists() and (wd / "config.json").exists()
    rows = read_metrics(wd)
    assert any("eval_loss" in r for r in rows) and all("step" in r for r in rows)
    assert (wd / "tensorboard").is_dir()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_finetune_starts_from_pretrained_backbone(pretrained, tmp_path, family):
    config = load_config(f"{family}_finetune_tiny", init_from=str(pretrained[family]))
    trainer = Trainer(config, tmp_path)
    start = jax.device_get(trainer.state.params)
    backbone = load_checkpoint_params(pretrained[family])
    flat_new = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(start)[0]}
    flat_old = {jax.tree_util.keystr(p): v
                for p, v in jax.tree_util.tree_flatten_with_path(backbone)[0]}
    shared = set(flat_new) & set(flat_old)
    dropped = set(flat_old) - shared  # only the pretraining head may be left behind
    assert all(n.startswith(("['lm_head']", "['mlm_head']")) for n in dropped), dropped
    for name in shared:
        np.testing.assert_array_equal(flat_new[name], flat_old[name], err_msg=name)
    fresh = set(flat_new) - set(flat_old)
    if family in ("gpt", "bert"):  # a new classification head
        assert fresh and all("classifier" in n or "pooler" in n for n in fresh), fresh
    assert trainer.start_step == 0
    trainer.run()
    first, last = first_last(tmp_path)
    assert last < first, (family, first, last)
    evals = [r for r in read_metrics(tmp_path) if "eval_loss" in r]
    assert evals and all(("eval_perplexity" in r) == (family == "t5") for r in evals)


def test_init_from_shape_mismatch_names_parameter(pretrained, tmp_path):
    config = load_config("gpt_finetune_tiny", init_from=str(pretrained["gpt"]))
    config.model.d_ff = 96  # an architecture field: refused by name, before any parameter is read
    with pytest.raises(ValueError, match=r"another architecture; changed: model.d_ff: 64 -> 96"):
        Trainer(config, tmp_path)
    config.model.d_ff, config.model.scan_layers = 64, True
    with pytest.raises(ValueError, match=r"the checkpoint's layers are unrolled: set "
                                         r"model.scan_layers=False"):
        Trainer(config, tmp_path)


@pytest.mark.parametrize("field, value, message", [
    ("activation", "relu", r"model.activation: 'gelu_tanh' -> 'relu'"),
    ("norm_position", "post", r"model.norm_position: 'pre' -> 'post'"),
])
def test_init_from_a_run_refuses_an_architecture_change_by_name(pretrained, tmp_path, field,
                                                                value, message):
    """A GELU-pretrained model fine-tuned with ReLU, or a pre-LN one as post-LN (which silently
    dropped its final norms), is refused like a resume with another architecture: nothing is
    written."""
    config = load_config("gpt_finetune_tiny", init_from=str(pretrained["gpt"]),
                         **{f"model.{field}": value})
    with pytest.raises(ValueError, match=rf"init_from=.* another architecture; changed: {message}"):
        Trainer(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_init_from_a_run_and_from_its_hf_export_start_the_same(pretrained, tmp_path):
    """The same fine-tuning config trains the same from a run and from its Hugging Face export:
    a value the config states wins even when it equals ModelConfig's default (t5_finetune_tiny's
    dropout_rate=0.1, the pretraining run's 0.0), and an unset one is the pretrained model's."""
    from jaxformer.cli.convert import main as convert

    hf = tmp_path / "hf"
    assert convert(["--from", str(pretrained["t5"]), "--to-hf", str(hf)]) == 0
    unset = {"model.attention_dropout_rate": None}  # the pretraining run's 0.0
    from_run = Trainer(load_config("t5_finetune_tiny", init_from=str(pretrained["t5"]), **unset),
                       tmp_path / "from_run")
    from_hf = Trainer(load_config("t5_finetune_tiny", init_from=str(hf), **unset),
                      tmp_path / "from_hf")
    for trainer in (from_run, from_hf):
        trainer.lock.release()
        assert (trainer.model_cfg.dropout_rate, trainer.model_cfg.attention_dropout_rate) == (
            0.1, 0.0)
    assert from_run.model_cfg == from_hf.model_cfg
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(from_run.state.params),
                 jax.device_get(from_hf.state.params))


def test_another_seed_trains_another_model(pretrained, tmp_path):
    """Seed 1 differs from the pretrained fixture's seed 0. (That an equal seed gives a bitwise
    identical run is `test_killed_run_resumes_exactly`'s: its killed process and its uninterrupted
    reference are two runs of one seed, compared loss for loss and parameter for parameter.) The
    same step count as the fixture: the same programs, read from the compilation cache."""
    other = tmp_path / "other"
    train_and_evaluate(load_config("gpt_pretrain_tiny", seed=1, **{"eval.num_batches": 0}), other)
    ref = losses(pretrained["gpt"])
    assert all(losses(other)[step] != ref[step] for step in (5, 30))


def test_killed_run_resumes_exactly(tmp_path):
    """SIGKILL a training process after a checkpoint, rerun the same command, compare with an
    uninterrupted run: every step after the resume point has the identical loss."""
    settings = {"log_every_steps": 1, "eval.num_batches": 0, "optimizer.schedule": "constant",
                "optimizer.peak_lr": 3e-3, "progress_bar": False, "checkpoint.every_steps": 5,
                "checkpoint.async_save": False, "data.tokenizer.vocab_size": 512,
                "data.tokenizer.max_train_texts": 1500, "data.seq_len": 32, "data.batch_size": 8,
                **{f"model.{k}": v for k, v in TINY_MODEL.items()}}
    killed = tmp_path / "killed"
    cmd = [sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs/gpt_pretrain_tiny.py"),
           "--workdir", str(killed), "--config.num_train_steps=400",
           *[f"--config.{k}={v}" for k, v in settings.items()]]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while not (killed / "checkpoints" / "10").exists():
        assert proc.poll() is None, "training process exited before its checkpoint"
        assert time.time() < deadline, "no checkpoint within 240 s"
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = sorted(int(p.name) for p in (killed / "checkpoints").iterdir() if p.name.isdigit())
    resume_at = saved[-1]
    total = resume_at + 6
    config = lambda: load_config("gpt_pretrain_tiny", num_train_steps=total, **settings)

    trainer = Trainer(config(), killed)  # what rerunning the same command does
    assert trainer.start_step == resume_at
    trainer.run()
    straight = tmp_path / "straight"
    train_and_evaluate(config(), straight)
    resumed, reference = losses(killed), losses(straight)
    for step in range(1, total + 1):  # steps <= resume_at were written by the killed process
        assert resumed[step] == reference[step], step
    # two runs of one seed (the killed process's steps included) end bitwise equal
    jax.tree.map(np.testing.assert_array_equal, load_checkpoint_params(killed),
                 load_checkpoint_params(straight))


@pytest.mark.slow  # two train.py runs (14 s); dropout_key's purity is test_head_bytes.py's, in make test
def test_rbg_dropout_masks_resume_exactly(tmp_path):
    """With ``dropout_prng='rbg'`` the dropout masks are still a function of (seed, step): a run
    resumed from a checkpoint repeats an uninterrupted run's losses and parameters bitwise, and the
    masks differ from threefry's (the setting takes effect)."""
    import shutil

    settings = {"log_every_steps": 1, "eval.num_batches": 0, "optimizer.schedule": "constant",
                "checkpoint.every_steps": 3, "checkpoint.async_save": False,
                "model.dropout_rate": 0.2, "num_train_steps": 6}
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train_and_evaluate(load_config("gpt_pretrain_tiny", dropout_prng="rbg", **settings), straight)
    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "checkpoints" / "6")
    trainer = Trainer(load_config("gpt_pretrain_tiny", dropout_prng="rbg", **settings), resumed)
    assert trainer.start_step == 3
    trainer.run()
    assert losses(resumed) == losses(straight)
    jax.tree.map(np.testing.assert_array_equal, load_checkpoint_params(resumed),
                 load_checkpoint_params(straight))
    threefry = tmp_path / "threefry"
    train_and_evaluate(load_config("gpt_pretrain_tiny", **{**settings, "num_train_steps": 1}),
                       threefry)
    assert losses(threefry)[1] != losses(straight)[1]


def test_sigterm_checkpoints_the_current_step_and_the_rerun_continues_exactly(tmp_path):
    """A preempted job (SIGTERM) saves the step it is at — not only the last periodic checkpoint —
    exits with 143, and rerunning the command continues bit for bit like an uninterrupted run."""
    settings = {"log_every_steps": 1, "eval.num_batches": 0, "optimizer.schedule": "constant",
                "optimizer.peak_lr": 3e-3, "progress_bar": False, "checkpoint.every_steps": 1000,
                "data.tokenizer.vocab_size": 512, "data.tokenizer.max_train_texts": 1500,
                "data.seq_len": 32, "data.batch_size": 8,
                **{f"model.{k}": v for k, v in TINY_MODEL.items()}}
    run = tmp_path / "preempted"
    cmd = [sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs/gpt_pretrain_tiny.py"),
           "--workdir", str(run), "--config.num_train_steps=5000",
           *[f"--config.{k}={v}" for k, v in settings.items()]]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    deadline = time.time() + 240
    while not ((run / "metrics.jsonl").exists() and len(losses(run)) >= 7):
        assert proc.poll() is None, "training process exited early"
        assert time.time() < deadline, "no training steps within 240 s"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out[-2000:]
    saved = sorted(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit())
    assert len(saved) == 1 and saved[0] >= 7 and f"Preempted (SIGTERM) at step {saved[0]}" in out
    total = saved[0] + 4
    config = lambda: load_config("gpt_pretrain_tiny", num_train_steps=total, **settings)
    trainer = Trainer(config(), run)
    assert trainer.start_step == saved[0]
    trainer.run()
    straight = tmp_path / "straight"
    train_and_evaluate(config(), straight)
    resumed, reference = losses(run), losses(straight)
    for step in range(1, total + 1):
        assert resumed[step] == reference[step], step


def _trainer_from_hugging_face_directory(workdir):
    """A fine-tuning Trainer with ``init_from`` a local HF GPT-2 directory (a golden tiny one,
    `tests/golden.py`), after checking that its architecture and weights are used."""
    from golden import golden_dir
    from safetensors.numpy import load_file

    hf = golden_dir("gpt2_v512")
    config = load_config("gpt_finetune_tiny", init_from=hf, num_train_steps=30)
    trainer = Trainer(config, workdir)
    assert trainer.model_cfg.activation == "gelu_tanh" and trainer.model_cfg.norm_eps == 1e-5
    wte = load_file(f"{hf}/model.safetensors")["transformer.wte.weight"]
    np.testing.assert_array_equal(jax.device_get(trainer.state.params["token_embed"]["embedding"]), wte)
    return trainer


def test_init_from_hugging_face_directory(tmp_path):
    """``init_from`` a local HF GPT-2 directory: its architecture and weights are used."""
    _trainer_from_hugging_face_directory(tmp_path / "run").lock.release()


@pytest.mark.slow  # 30 steps (~10 s of CPU); that fine-tuning lowers the loss is
# test_finetune_starts_from_pretrained_backbone's, the same loop from a run's weights
def test_fine_tuning_from_a_hugging_face_directory_lowers_the_loss(tmp_path):
    _trainer_from_hugging_face_directory(tmp_path / "run").run()
    first, last = first_last(tmp_path / "run")
    assert last < first, (first, last)


# (``objective.whole_word_mask`` through the Trainer, which hands the objective its tokenizer's
# word-start table: tests/test_hf_finetune.py's RoBERTa MLM run; the sentencepiece table and the
# choice of whole words: tests/test_objectives.py.)


def test_init_from_a_step_dir_reuses_the_pretraining_tokenizer(pretrained, tmp_path):
    """``init_from=<run>/checkpoints/<step>`` reads the run's tokenizer, not a new one (a new one
    would read the pretrained embeddings with other ids)."""
    step_dir = pretrained["gpt"] / "checkpoints" / "15"
    trainer = Trainer(load_config("gpt_finetune_tiny", init_from=str(step_dir)), tmp_path)
    saved = (pretrained["gpt"] / "tokenizer.model").read_bytes()
    assert (tmp_path / "tokenizer.model").read_bytes() == saved
    np.testing.assert_array_equal(jax.device_get(trainer.state.params["token_embed"]["embedding"]),
                                  load_checkpoint_params(step_dir)["token_embed"]["embedding"])


def test_resuming_with_another_architecture_fails_and_leaves_the_run_intact(pretrained, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(pretrained["gpt"], run)
    before = (run / "config.json").read_text()
    with pytest.raises(ValueError, match=r"model.d_ff: 64 -> 96"):
        Trainer(load_config("gpt_pretrain_tiny", **{"model.d_ff": 96}), run)
    with pytest.raises(ValueError, match=r"data.tokenizer.vocab_size: 512 -> 400"):
        Trainer(load_config("gpt_pretrain_tiny", **{"data.tokenizer.vocab_size": 400}), run)
    assert (run / "config.json").read_text() == before
    trainer = Trainer(load_config("gpt_pretrain_tiny", num_train_steps=40), run)  # may extend
    assert trainer.start_step == 30


def test_a_tokenizer_left_by_a_run_without_checkpoints_is_replaced(pretrained, tmp_path):
    """A run that failed before its first checkpoint leaves ``tokenizer.model`` behind; the next
    run trains the tokenizer its own config asks for instead of silently reusing it."""
    (tmp_path / "tokenizer.model").write_bytes((pretrained["gpt"] / "tokenizer.model").read_bytes())
    trainer = Trainer(load_config("gpt_pretrain_tiny", **{"data.tokenizer.vocab_size": 400}), tmp_path)
    assert trainer.tokenizer.vocab_size == 400
    assert Tokenizer.load(tmp_path / "tokenizer.model").vocab_size == 400


def test_exported_workdir_fine_tunes_with_its_own_tokenizer(pretrained, tmp_path):
    """``convert --from <workdir> --to-hf D`` writes the run's sentencepiece model and special ids,
    so ``init_from=D`` fine-tunes with the same tokenizer."""
    import json

    from jaxformer.cli.convert import main as convert

    hf = tmp_path / "hf"
    assert convert(["--from", str(pretrained["gpt"]), "--to-hf", str(hf)]) == 0
    saved = (pretrained["gpt"] / "tokenizer.model").read_bytes()
    assert (hf / "spiece.model").read_bytes() == saved
    special = Tokenizer.load(pretrained["gpt"] / "tokenizer.model").special
    config = json.loads((hf / "config.json").read_text())
    assert (config["pad_token_id"], config["eos_token_id"], config["bos_token_id"]) == (
        special.pad_id, special.eos_id, special.bos_id)
    Trainer(load_config("gpt_finetune_tiny", init_from=str(hf)), tmp_path / "run")
    assert (tmp_path / "run" / "tokenizer.model").read_bytes() == saved


def test_a_workdir_that_is_a_file_or_a_missing_init_from_fails_before_any_work(tmp_path):
    (tmp_path / "afile").write_text("")
    with pytest.raises(ValueError, match="workdir .*afile.* is not a directory"):
        Trainer(load_config("gpt_pretrain_tiny"), tmp_path / "afile")
    with pytest.raises(FileNotFoundError, match="init_from='nowhere' does not exist"):
        Trainer(load_config("gpt_finetune_tiny", init_from="nowhere"), tmp_path / "run")
    assert not (tmp_path / "run").exists()  # nothing trained, nothing written
    # (a mesh the model cannot be sharded on: tests/test_parallel.py, which has 8 devices)


def test_labels_outside_the_classes_are_refused():
    from jaxformer.config import ModelConfig
    from jaxformer.train.loop import _check_batch

    cfg = ModelConfig(family="encoder", head="classify", num_classes=2, vocab_size=16)
    _check_batch({"inputs": np.ones((2, 4), np.int32), "label": np.array([0, 1])}, cfg, True)
    with pytest.raises(ValueError, match=r"label 2 is outside \[0, model.num_classes=2\)"):
        _check_batch({"inputs": np.ones((2, 4), np.int32), "label": np.array([0, 2])}, cfg, True)
    # a model that predicts no labels (an LM reading a labelled file) leaves them unchecked
    _check_batch({"inputs": np.ones((2, 4), np.int32), "label": np.array([0, 2])}, cfg, False)


def test_an_empty_eval_split_fails_at_set_up_not_after_training(tmp_path):
    (tmp_path / "few.txt").write_text("one line\nanother line\n")  # both land in one split
    config = load_config("gpt_pretrain_tiny", **{"data.source": f"files:{tmp_path}/few.txt",
                                                 "data.split_fractions": (1.0, 0.0, 0.0)})
    with pytest.raises(ValueError, match=r"split 'validation' of data.source=.* holds 0; .*"
                                         r"eval.num_batches=0"):
        Trainer(config, tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoints").exists() or not any(
        (tmp_path / "run" / "checkpoints").iterdir())


def test_progress_bar_shows_no_loss_until_one_is_logged(capsys):
    """Steps before the first logged loss showed "loss=nan" (a placeholder that reads like a
    diverged run); they show only the token rate."""
    from jaxformer.train.metrics import Progress

    progress = Progress(0, 4, enabled=True)  # stderr under pytest is no terminal
    progress.update(1, loss=None, lr=None, tokens=64)
    progress.bar.refresh()
    first = capsys.readouterr().err
    progress.update(1, loss=2.5, lr=1e-3, tokens=64)
    progress.bar.refresh()
    progress.close()
    later = capsys.readouterr().err
    assert "tok_s=0" in first and "loss" not in first and "nan" not in first
    assert "loss=2.5000" in later and "lr=1.00e-03" in later


def test_metric_rows_name_the_count_for_what_it_counts(tmp_path):
    """The train step's ``tokens`` (what the loss averages over) is written as ``examples`` for a
    classifier."""
    from jaxformer.train import metrics

    writer = metrics.MetricWriter(tmp_path, count_name="examples")
    writer.write(5, {"loss": 1.0, "tokens": 8.0})
    writer.write(10, {"loss": 0.5, "tokens": 8.0, "examples_per_s": 20.0})
    writer.close()
    rows = read_metrics(tmp_path)
    assert rows == [{"step": 5, "loss": 1.0, "examples": 8.0},
                    {"step": 10, "loss": 0.5, "examples": 8.0, "examples_per_s": 20.0}]
    with pytest.raises(ValueError, match="count_name='rows'"):
        metrics.MetricWriter(tmp_path, count_name="rows")


def test_a_headerless_tsv_classifier_runs_with_one_override_per_fact(tmp_path, capsys):
    """The user's loop of issue 26 on a header-less six-class TSV: data.columns reads it,
    model.num_classes comes from data.label_names, a 12-step run of a config with 160 warmup steps
    needs no warmup override; the logs give each split's size, and metrics.jsonl counts examples
    (8 a step: one label per row), never tokens."""
    labels = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")
    lines = [f"{labels[i % 6]}\tquestion {i} about {' '.join(['thing'] * (i % 7))}" for i in range(240)]
    (tmp_path / "questions.tsv").write_text("\n".join(lines) + "\n")
    config = load_config("bert_finetune_tiny", **{
        "data.source": f"files:{tmp_path}/questions.tsv", "data.columns": ("label", "text"),
        "data.label_key": "label", "data.label_names": labels, "model.num_classes": None,
        "num_train_steps": 12, "optimizer.warmup_steps": 160, "eval.every_steps": 6})
    trainer = Trainer(config, tmp_path / "run")
    assert trainer.model_cfg.num_classes == 6 and trainer.config.model.num_classes == 6
    trainer.run()
    out = capsys.readouterr().out
    assert ", attention xla (auto)" in out  # the preset's "auto", resolved for this CPU host
    sizes = {s: len(get_source(read(SourceSettings, config.data), s)) for s in ("train", "validation")}
    assert f"data train: {sizes['train']:,} examples in data.source='files:" in out
    assert f"data validation: {sizes['validation']:,} examples in data.source=" in out
    rows = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert rows and all(r["examples"] == 8 and "tokens" not in r for r in rows)
    assert all(r["examples_per_s"] > 0 for r in rows[1:])


def test_progress_bars_follow_the_terminal_unless_asked(capsys):
    """Issue 45: bars flooded redirected logs. Unset (auto) = tqdm's disable=None, off when
    stderr is no terminal (as under pytest); true / false force it; the same values everywhere."""
    from jaxformer.progress import bar_disabled
    from jaxformer.train.metrics import Progress

    assert [bar_disabled(v) for v in (None, "auto", True, "true", False, "false")] == [
        None, None, False, False, True, True]
    with pytest.raises(ValueError, match="progress_bar='yes' must be one of"):
        bar_disabled("yes")
    for enabled, shown in ((None, False), (True, True), (False, False)):
        bar = Progress(0, 3, enabled=enabled)
        bar.update(3, loss=1.0, lr=1e-3, tokens=10.0)
        bar.close()
        assert ("train: 100%" in capsys.readouterr().err) == shown


def test_config_json_stores_what_the_run_used(tmp_path):
    """Issue 60 §7: ``--config.data.columns=text,label`` (one string) was stored as
    ``['text,label']``, and a loaded tokenizer's size as the config's ``vocab_size`` (2,048 for an
    init_from whose tokenizer has 30,522 pieces). config.json holds the split list and the loaded
    tokenizer's own size, and the run resumes under the same config."""
    import json

    from jaxformer.data.sources import SourceSettings
    from jaxformer.settings import read
    from jaxformer.train.config.resume import check_resume
    from jaxformer.train.setup import resolve_config, with_label_names_from_data

    lines = [f"question {i} about {' '.join(['thing'] * (i % 7))}\t{('neg', 'pos')[i % 2]}"
             for i in range(120)]
    (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n")
    overrides = {"data.source": f"files:{tmp_path}/train.tsv", "data.columns": ("text,label",),
                 "data.label_key": "label", "model.num_classes": None, "eval.num_batches": 0}
    first = Trainer(load_config("bert_finetune_tiny", **overrides), tmp_path / "first")
    first.lock.release()
    saved = json.loads((tmp_path / "first" / "config.json").read_text())
    assert saved["data"]["columns"] == ["text", "label"]
    path = tmp_path / "first" / "tokenizer.model"
    size = Tokenizer.load(str(path)).vocab_size
    c = load_config("bert_finetune_tiny", **overrides, **{"data.tokenizer.path": str(path)})
    c.data.tokenizer.vocab_size = 2048  # a key that sizes only a tokenizer to be trained
    second = Trainer(c, tmp_path / "second")
    second.lock.release()
    saved = json.loads((tmp_path / "second" / "config.json").read_text())
    assert saved["data"]["tokenizer"]["vocab_size"] == size != 2048
    # a resume under the same config compares it with config.json: no refusal, no note
    named = with_label_names_from_data(c, read(SourceSettings, c.data))
    assert check_resume(saved, resolve_config(*named).config) == []


def test_a_feature_reaches_the_step_and_evaluation_through_its_extension_only(tmp_path, monkeypatch):
    """A toy feature registered as one `Extension` (no edit to the loop): its ``model_params`` hook
    scales every parameter by the frozen factor 0, so the model's logits are all 0 and the loss is
    ln(vocabulary) exactly, in the train step and in evaluation (which apply the same hook); the
    same run without it does not give ln(V)."""
    import jax.numpy as jnp

    from jaxformer.train import loop
    from jaxformer.train.extension import Extension
    from jaxformer.train.step import StepHooks

    def scaled(trained, factor):
        return jax.tree.map(lambda p: p * factor.astype(p.dtype), trained)

    def toy(resolved, built):
        return Extension(hooks=StepHooks(model_params=scaled), frozen=jnp.zeros((), jnp.float32))

    config = load_config("gpt_pretrain_tiny", num_train_steps=1, log_every_steps=1,
                         **{"eval.every_steps": 1, "eval.num_batches": 1})
    plain = Trainer(config, tmp_path / "plain").run()
    monkeypatch.setattr(loop, "FEATURES", (*loop.FEATURES, toy))
    trainer = Trainer(config, tmp_path / "toy")
    toyed = trainer.run()
    uniform = float(np.log(trainer.model_cfg.vocab_size))  # -log(1/V) at every position
    np.testing.assert_allclose([toyed["loss"], toyed["eval_loss"]], uniform, rtol=1e-6)
    assert abs(plain["loss"] - uniform) > 1e-4 and abs(plain["eval_loss"] - uniform) > 1e-4


def test_evaluate_scores_the_split_it_is_given(pretrained, tmp_path):
    """`Trainer.evaluate(split=…, num_batches=…)` scores that split, as a run configured with it
    does (the demo's and the benchmarks' test figures: mutating ``trainer.config`` after set-up no
    longer reaches the typed settings the trainer reads)."""
    init = str(pretrained["gpt"])
    trainer = Trainer(load_config("gpt_finetune_tiny", init_from=init), tmp_path / "a")
    params = trainer.model_params(trainer.state)
    validation = trainer.evaluate(params)
    test = trainer.evaluate(params, split="test")
    configured = Trainer(load_config("gpt_finetune_tiny", init_from=init, **{"eval.split": "test"}),
                         tmp_path / "b")
    assert test == pytest.approx(configured.evaluate(params), rel=1e-6)
    assert test["eval_loss"] != pytest.approx(validation["eval_loss"], rel=1e-6)
    assert trainer.evaluate(params, split="test", num_batches=1) != test  # 1 batch, not 4
    assert trainer.evaluate(params, num_batches=0) == {}
