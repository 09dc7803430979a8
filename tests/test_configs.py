"""Every runnable config builds and validates (before any data or compilation)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxformer.train.config import check_config, check_resume, load_config, validate_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p.stem for p in (ROOT / "configs").glob("*.py"))


def get_config(name: str):
    """``configs/<name>.py:get_config()``, as `load_config` reads it (completed)."""
    return load_config(ROOT / "configs" / f"{name}.py")


@pytest.mark.parametrize("name", CONFIGS)
def test_config_validates(name):
    config = get_config(name)
    model_cfg = validate_config(config)
    assert config.num_train_steps > 0 and model_cfg.vocab_size >= config.data.tokenizer.vocab_size


def test_data_task_is_derived_from_the_objective():
    """No config sets ``data.task``; one that still does (written before, or an old run's
    config.json) is accepted when it is the objective's data task, else refused naming both."""
    config = get_config("t5_pretrain_tiny")
    assert "task" not in config.data
    with config.unlocked():
        config.data.task = "span_corruption"
    validate_config(config)
    config.objective.name = "denoise"  # BART denoising: the same text pieces, another corruption
    validate_config(config)
    config.data.task = "seq2seq"
    with pytest.raises(ValueError, match="data.task='seq2seq' does not fit objective.name='denoise'"):
        validate_config(config)


def test_resume_of_a_run_that_stated_data_task_and_framing_notes_nothing():
    """A config.json written when configs still stated ``data.task`` and ``data.framing`` resumes
    under today's config (which derives both from the objective) without a note; another framing
    is still noted."""
    config = get_config("t5_pretrain_tiny")
    saved = json.loads(json.dumps(config.to_dict(), default=str))
    saved["data"].update(task="span_corruption", framing="eos")
    assert check_resume(saved, config) == []
    saved["data"]["framing"] = "bos_eos"
    assert check_resume(saved, config) == ["data.framing: 'bos_eos' -> 'eos'"]


def test_unknown_top_level_key_is_rejected():
    config = get_config("gpt_pretrain_tiny")
    with config.unlocked():
        config.num_train_step = 3
    with pytest.raises(ValueError, match="num_train_step"):
        validate_config(config)


@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")  # in ml_collections
def test_every_model_field_and_objective_option_is_settable_from_the_command_line():
    """Configs declare every ModelConfig field and every objective option (ml_collections refuses
    to override an undeclared key, or a None one), so ``train.py --config.model.dtype=bfloat16``
    works; fields left to be derived still follow their inputs."""
    import dataclasses

    from absl import flags

    from jaxformer.config import ModelConfig
    from jaxformer.train.config import base_config, define_config_flag

    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    for name in CONFIGS:
        assert set(get_config(name).model) == fields, name
    from jaxformer.objectives import option_settings

    read = set(option_settings())  # objectives read their options dataclasses' fields only
    assert {"mask_rate", "whole_word_mask", "infill_rate"} <= read <= set(base_config().objective)
    argv = ["train.py", "--config", str(ROOT / "configs" / "gpt_pretrain_tiny.py"),
            "--config.model.dtype=bfloat16", "--config.model.d_model=64",
            "--config.model.num_kv_heads=2", "--config.model.dropout_rate=0",
            "--config.objective.label_smoothing=0.2"]
    fv = flags.FlagValues()  # what train.py's absl app does with its command line
    define_config_flag("config", flag_values=fv, sys_argv=argv)
    fv(argv)
    cfg = validate_config(fv.config)
    assert (cfg.dtype, cfg.d_model, cfg.num_kv_heads, cfg.dropout_rate) == ("bfloat16", 64, 2, 0.0)
    assert cfg.head_dim == 64 // cfg.num_heads  # still derived, from the new d_model
    assert fv.config.objective.label_smoothing == 0.2


@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")  # in ml_collections
def test_a_config_that_replaces_a_declared_node_still_takes_every_override(tmp_path):
    """A user config written ``c.model = preset(...)`` / ``c.data = {...}`` drops the declarations
    (ml_collections would refuse ``--config.model.pooling=max`` with a bare AttributeError);
    ``define_config_flag`` completes it from `base_config()` first, keeping the config's own values."""
    from absl import flags

    from jaxformer.train.config import base_config, complete_config, define_config_flag

    path = tmp_path / "my_config.py"
    path.write_text("from jaxformer.models.presets import preset\n"
                    "from jaxformer.train.config import base_config\n\n"
                    "def get_config():\n"
                    "    c = base_config()\n"
                    "    c.model = preset('bert_tiny')\n"
                    "    c.data = dict(source='files:reviews.tsv', batch_size=4)\n"
                    "    c.objective = dict(name='mlm')\n"
                    "    return c\n")
    argv = ["train.py", "--config", str(path), "--config.model.pooling=max",
            "--config.model.head_dim=16", "--config.data.format=tsv",
            "--config.objective.whole_word_mask=True", "--config.data.tokenizer.vocab_size=99"]
    fv = flags.FlagValues()
    define_config_flag("config", flag_values=fv, sys_argv=argv)
    fv(argv)
    c = fv.config
    assert (c.model.pooling, c.model.head_dim, c.data.format, c.objective.whole_word_mask) == (
        "max", 16, "tsv", True)
    assert (c.data.source, c.data.batch_size, c.objective.name, c.data.tokenizer.vocab_size) == (
        "files:reviews.tsv", 4, "mlm", 99)
    assert c.objective.mask_rate == base_config().objective.mask_rate  # filled from the defaults
    assert c.model.d_model == 64 and c.model.family == "encoder"        # kept from the preset
    with pytest.raises(AttributeError):  # locked, as the plain ml_collections flag leaves it
        c.model.not_a_field = 1
    for name in CONFIGS:  # the repository's configs already declare everything: completion is a no-op
        assert complete_config(get_config(name)).to_dict() == get_config(name).to_dict(), name


def test_a_smoke_run_of_a_long_config_needs_only_num_train_steps():
    """A warmup longer than the run is clipped (warned, see test_schedules), not refused: one
    override makes a 20-step run of a config with 160 warmup steps; bad values still fail in the
    config check, before any tokenizer or data."""
    config = get_config("bert_finetune_tiny")
    config.num_train_steps = 20
    _, _, schedule = check_config(config, validate_config(config))
    assert float(schedule(19)) == pytest.approx(config.optimizer.peak_lr)  # peak at the clip
    config.optimizer.warmup_steps = -1
    with pytest.raises(ValueError, match="warmup_steps=-1"):
        validate_config(config)


@pytest.mark.parametrize("name, overrides, message", [
    ("gpt_pretrain_tiny", {"data.seq_len": 512}, r"data.seq_len=512 exceeds model.max_len=128"),
    ("bert_finetune_tiny", {"data.label_names": ("neg", "pos", "meh"), "model.num_classes": 2},
     r"data.label_names has 3 labels .* model.num_classes=2"),
    ("gpt_pretrain_tiny", {"model.vocab_size": 100},
     r"data.tokenizer.vocab_size=2048 exceeds model.vocab_size=100"),
    ("gpt_pretrain_tiny", {"data.batch_size": 0}, r"data.batch_size=0 is invalid"),
    ("bert_finetune_tiny", {"optimizer.peak_lr": -3e-4},
     r"optimizer.peak_lr=-0.0003 is invalid: must be positive"),
    ("gpt_pretrain_tiny", {"objective.mask_rate": 0.3}, r"objective.mask_rate=0.3 applies to "
                                                          r"objective 'mlm', not 'clm'"),
    ("gpt_pretrain_tiny", {"parallel": "pmap", "mesh.fsdp": 8},
     r"parallel='pmap' is data parallel only \(replicated state\), so mesh.fsdp=8 would be "
     r"ignored"),
    ("gpt_pretrain_tiny", {"parallel": "shard_map", "mesh.tensor": 2},
     r"parallel='shard_map' is data parallel only \(replicated state\), so mesh.tensor=2 would "
     r"be ignored; use parallel='jit'"),
    ("gpt_pretrain_tiny", {"parallel": "pjit"},
     r"parallel='pjit' is invalid: choose one of \('jit', 'shard_map', 'pmap'\)"),
])
def test_data_that_cannot_fit_the_model_fails_in_validate_config(name, overrides, message):
    """Caught from the config alone, before a tokenizer is trained (a learned position table
    indexed past its end gives NaN, a label past the classes NaN, a too-large id a clamped gather)."""
    from jaxformer.train.config import set_key

    config = get_config(name)
    for key, value in overrides.items():
        set_key(config, key, value)
    with pytest.raises(ValueError, match=message):
        validate_config(config)


def test_check_resume_refuses_architecture_changes_and_notes_the_rest():
    import json


    saved = json.loads(json.dumps(get_config("gpt_pretrain_tiny").to_dict(), default=str))
    config = get_config("gpt_pretrain_tiny")
    assert check_resume(saved, config) == []
    config.num_train_steps = 3200
    config.model.dropout_rate = 0.3  # training noise only: may change on resume
    notes = check_resume(saved, config)
    assert any(n.startswith("num_train_steps: 1200 -> 3200") for n in notes), notes
    assert any(n.startswith("model.dropout_rate: 0.0 -> 0.3") for n in notes), notes
    config.model.num_kv_heads = 2  # shapes the parameters: refused
    with pytest.raises(ValueError, match=r"model.num_kv_heads: 4 -> 2"):
        check_resume(saved, config)


@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")  # in ml_collections
def test_a_misspelt_override_key_is_named_with_a_suggestion():
    from absl import flags

    from jaxformer.train.config import HF_NAMES, base_config, config_node, define_config_flag

    argv = ["train.py", "--config", str(ROOT / "configs" / "gpt_pretrain_tiny.py"),
            "--config.model.num_layer=2"]
    fv = flags.FlagValues()
    define_config_flag("config", flag_values=fv, sys_argv=argv)
    with pytest.raises(flags.IllegalFlagValueError,
                       match=r"'model.num_layer': model has no key 'num_layer'; did you mean "
                             r"'model.num_layers'\?"):
        fv(argv)
    for override, meant in (("optimizer.learning_rate=1e-3", "optimizer.peak_lr"),
                            ("model.num_labels=6", "model.num_classes"),
                            ("max_steps=10", "num_train_steps")):
        argv = ["train.py", "--config", str(ROOT / "configs" / "gpt_pretrain_tiny.py"),
                f"--config.{override}"]
        fv = flags.FlagValues()
        define_config_flag("config", flag_values=fv, sys_argv=argv)
        with pytest.raises(flags.IllegalFlagValueError, match=f"did you mean '{meant}'"):
            fv(argv)
    for wrong, meant in HF_NAMES.items():  # every suggestion names a key that exists
        config_node(base_config(), meant)
        assert "." in wrong or wrong not in base_config()
    argv = ["train.py", "--config", "configs/no_such_config.py"]
    fv = flags.FlagValues()
    define_config_flag("config", flag_values=fv, sys_argv=argv)
    with pytest.raises(flags.IllegalFlagValueError,
                       match=r"config file 'configs/no_such_config.py' does not exist"):
        fv(argv)


def test_shipped_classifier_configs_leave_num_classes_to_the_labels():
    """A shipped fine-tune config states no ``model.num_classes``, so ``data.label_names`` alone
    sets it (issue 45: a stated 2 refused six TREC labels); without names it is two."""
    for name in CONFIGS:
        config = get_config(name)
        if config.model.get("head") != "classify":
            continue
        if config.model.get("image_size"):  # an image set's classes are stated (digits 10,
            continue  # ImageNet 1,000): images carry no label names
        assert config.model.num_classes is None, name
        assert validate_config(config).num_classes == 2
        config.data.label_names = ("ABBR,DESC,ENTY,HUM,LOC,NUM",)  # as --config... parses it
        assert validate_config(config).num_classes == 6


def test_num_classes_is_derived_from_the_label_names_when_unset():
    """``model.num_classes`` unset + ``data.label_names`` of a classifier: one class per name, in
    the config the run records (so a resume compares equal); a stated smaller number stays an
    error (previous test); other objectives leave it unset."""
    from jaxformer.train.setup import resolve_config

    config = get_config("bert_finetune_tiny")
    config.data.label_names = ("abbr", "desc", "enty", "hum", "loc", "num")
    assert validate_config(config).num_classes == 6
    resolved = resolve_config(config)
    assert resolved.model_cfg.num_classes == 6 and resolved.config.model.num_classes == 6
    assert config.model.num_classes is None  # the given config is left as it is
    assert check_resume(json.loads(json.dumps(resolved.config.to_dict())), resolved.config) == []
    lm = get_config("gpt_pretrain_tiny")
    lm.data.label_names = ("a", "b", "c")
    assert resolve_config(lm).config.model.num_classes is None


@pytest.mark.slow
def test_train_py_print_config_lists_the_keys_and_trains_nothing(tmp_path):
    """``train.py --config X --print_config`` (no --workdir) prints a line per key, overrides
    applied, and exits 0; ``--help`` names the option; without --workdir training is refused."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    run = lambda *args: subprocess.run([sys.executable, str(ROOT / "train.py"), *args], env=env,
                                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    config = str(ROOT / "configs" / "gpt_pretrain_tiny.py")
    out = run("--config", config, "--print_config", "--config.data.seq_len=32")
    assert out.returncode == 0, out.stderr
    assert "data.seq_len" in out.stdout and "= 32  (base: 128)  # row length" in out.stdout
    assert len(out.stdout.splitlines()) > 100 and not list(tmp_path.iterdir())
    assert "--print_config" in run("--help").stdout
    refused = run("--config", config)
    assert refused.returncode == 2 and "--workdir is required" in refused.stderr  # a usage error
