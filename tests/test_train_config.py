"""The training config's schema (`jaxformer.train.config.schema`, `jaxformer.settings`): every key
declared with a type, default and doc; unknown keys, wrong types and refused values fail naming the
key before anything compiles; ``--print_config`` and resuming are derived from the declarations."""

import dataclasses
import json
from pathlib import Path

import ml_collections
import pytest

from jaxformer.settings import VOCABULARY, Setting, check_tree, flat, settings_of_kind, type_name
from jaxformer.train.config import (
    base_config,
    check_resume,
    check_schema,
    key_docs,
    load_config,
    schema,
    validate_config,
)
from jaxformer.train.config.printing import flat_keys, format_config

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ["", "model.", "objective.", "data.", "data.tokenizer.", "optimizer.", "optimizer.lora.",
            "checkpoint.", "eval.", "mesh.", "distill."]


def _tiny() -> ml_collections.ConfigDict:
    return load_config(ROOT / "configs" / "gpt_pretrain_tiny.py")


def _wrong_value(s: Setting):
    """A value of another type than the setting's (and never None)."""
    name = type_name(s.type)
    return (3 if name.startswith(("str", "tuple")) else "yes" if name.startswith("bool")
            else "0.5" if name.startswith("float") else 0.5)


def test_every_key_is_declared_with_a_type_a_default_of_that_type_and_a_one_line_doc():
    """The schema is the one list of keys: `base_config` has exactly its keys, each default fits
    its declared type (None only where the type allows it), passes its own check, and has a
    one-line description that `key_docs` (``--print_config``) shows."""
    settings = flat(schema())
    assert set(settings) == set(flat_keys(base_config())) == set(key_docs())
    assert len(settings) > 150 and {s[:-1] for s in SECTIONS if s} <= {
        k.rsplit(".", 1)[0] for k in settings}
    for key, s in settings.items():
        assert s.doc and "\n" not in s.doc and len(s.doc) >= 5, key
        check_tree({key.rsplit(".", 1)[-1]: s}, {key.rsplit(".", 1)[-1]: s.default})
        assert s.check is None or s.default is None or s.check(s.default) is None, key
    check_schema(base_config())


@pytest.mark.parametrize("where", SECTIONS)
def test_an_unknown_key_is_refused_naming_it_with_the_close_spelling(where):
    config = _tiny()
    node = config
    for part in where.split(".")[:-1]:
        node = node[part]
    first = sorted(k for k in node.keys() if not isinstance(node[k], ml_collections.ConfigDict))[0]
    with node.unlocked():
        node[first + "s_"] = node[first]
    with pytest.raises(ValueError, match=rf"unknown config key '{where}{first}s_'.*did you mean "
                                         rf"'{first}'\?"):
        validate_config(config)


@pytest.mark.parametrize("where", SECTIONS)
def test_a_value_of_the_wrong_type_is_refused_naming_the_key(where):
    """Every key of every section, given a value of another type (as a config that replaced a
    section, or a config.json, can hold: ml_collections checks only overrides of existing keys)."""
    tree = schema()
    for part in where.split(".")[:-1]:
        tree = tree[part]
    keys = [k for k, v in tree.items() if isinstance(v, Setting)]
    assert keys
    for key in keys:
        config = _tiny().to_dict()
        node = config
        for part in where.split(".")[:-1]:
            node = node[part]
        node[key] = _wrong_value(tree[key])
        with pytest.raises(ValueError, match=rf"^{where}{key}=.* is of type \w+; expected "):
            check_schema(config)


def test_a_wrong_type_fails_in_validate_config_before_anything_else():
    config = _tiny()
    with config.unlocked():
        config.checkpoint = ml_collections.ConfigDict(dict(config.checkpoint.to_dict(), keep="3"))
    with pytest.raises(ValueError, match=r"checkpoint.keep='3' is of type str; expected int$"):
        validate_config(config)
    config = _tiny()
    with config.unlocked():
        config.data.tokenizer = ml_collections.ConfigDict(
            dict(config.data.tokenizer.to_dict(), num_sentinels=2.5))
    with pytest.raises(ValueError, match=r"data.tokenizer.num_sentinels=2.5 .* int or None"):
        validate_config(config)


@pytest.mark.parametrize("key, value, message", [
    ("checkpoint.best_mode", "median", r"checkpoint.best_mode='median' is invalid: choose one of "
                                       r"\('min', 'max'\)"),
    ("num_train_steps", 0, r"num_train_steps=0 is invalid: must be positive"),
    ("nonfinite", "ignore", r"nonfinite='ignore' is invalid: choose one of \('stop', 'skip'\)"),
    ("objective.mask_rate", 1.5, r"objective.mask_rate=1.5 is invalid: must lie in \[0, 1\]"),
    ("data.tokenizer.model_type", "wordpiece", r"model_type='wordpiece' is invalid: choose one"),
    ("optimizer.schedule", "cosine", r"optimizer.schedule='cosine' is invalid: choose one of"),
    ("distill.temperature", 0.0, r"distill.temperature=0.0 is invalid: must be positive"),
    ("eval.num_batches", -1, r"eval.num_batches=-1 is invalid: must be >= 0"),
])
def test_a_value_its_declaration_refuses_fails_naming_the_key(key, value, message):
    with pytest.raises(ValueError, match=message):
        validate_config(load_config(ROOT / "configs" / "gpt_pretrain_tiny.py", {key: value}))


def test_an_int_is_a_float_and_a_list_a_tuple_but_not_the_other_way_round():
    config = _tiny().to_dict()
    config["optimizer"]["peak_lr"] = 1
    config["data"]["split_fractions"] = [0.8, 0.1, 0.1]
    check_schema(config)
    config["optimizer"]["warmup_steps"] = 1.0
    with pytest.raises(ValueError, match=r"optimizer.warmup_steps=1.0 is of type float; expected int"):
        check_schema(config)
    config["optimizer"]["warmup_steps"] = True  # a bool is not a count
    with pytest.raises(ValueError, match=r"optimizer.warmup_steps=True is of type bool"):
        check_schema(config)
    config["optimizer"]["warmup_steps"] = 10
    config["data"]["split_fractions"] = (0.8, "0.2")  # the items are checked too
    with pytest.raises(ValueError, match=r"data.split_fractions=.* expected tuple of float$"):
        check_schema(config)


def test_print_config_lists_values_base_defaults_and_the_declared_docs():
    """One line per key: the file's value, the base default where it differs (for an unset model
    field, ModelConfig's default), and the doc of the key's declaration."""
    config = load_config(ROOT / "configs" / "bert_finetune_tiny.py",
                         {"data.columns": ("text", "label")})
    lines = {line.split(" = ")[0].strip(): line for line in format_config(config).splitlines()}
    docs = key_docs()
    assert set(lines) == set(flat_keys(base_config())) == set(docs)
    assert all(line.endswith(f"  # {docs[key]}") for key, line in lines.items())
    assert lines["data.seq_len"].endswith("= 64  (base: 128)  # row length of inputs (tokens, "
                                          "framing included); longer examples: data.long_examples")
    assert "= ('text', 'label')  (base: None)  # files, TSV without a header row" in lines[
        "data.columns"]
    assert "= 128  (base: unset = 512)  # width of the hidden states" in lines["model.d_model"]
    assert "= None  (unset = 'float32')  # compute dtype" in lines["model.dtype"]
    assert "= 0  # " in lines["seed"] and "(base" not in lines["seed"]  # the same as the base
    assert lines["objective.noise_density"].endswith("# span_corruption: fraction of tokens corrupted")


def test_what_a_resume_may_change_follows_the_declared_kinds():
    """The keys of kind VOCABULARY (the tokenizer's, but its path) are refused on resume; the
    tokenizer path and every other training key are noted."""
    assert set(settings_of_kind(schema(), VOCABULARY)) == {
        "data.tokenizer.vocab_size", "data.tokenizer.model_type", "data.tokenizer.num_sentinels",
        "data.tokenizer.max_train_texts", "data.tokenizer.character_coverage",
        "data.tokenizer.normalization"}
    saved = json.loads(json.dumps(_tiny().to_dict()))
    config = _tiny()
    config.data.tokenizer.path = "/elsewhere/tokenizer.model"
    config.checkpoint.keep = 5
    assert check_resume(saved, config) == [
        "checkpoint.keep: 3 -> 5", "data.tokenizer.path: '' -> '/elsewhere/tokenizer.model'"]
    config.data.tokenizer.character_coverage = 1.0
    with pytest.raises(ValueError, match=r"data.tokenizer.character_coverage: 0.9995 -> 1.0"):
        check_resume(saved, config)


def test_distill_settings_fill_what_an_unset_key_means():
    from jaxformer.train.distill_config import DistillSettings, settings

    config = _tiny()
    assert settings(config) is None
    config.distill.teacher, config.distill.alpha = "/run", 1
    assert settings(config) == DistillSettings("/run", None, False, 2.0, 1.0, 2.0, 1.0, False)
    assert isinstance(settings(config).alpha, float)


def test_an_unknown_key_in_a_config_file_names_the_key_a_hugging_face_user_means(tmp_path):
    """A key set in the file itself (not an override) is refused when the config is validated,
    naming the key of the same meaning (`HF_NAMES`)."""
    path = tmp_path / "my_config.py"
    path.write_text("from jaxformer.train.config import base_config\n\n"
                    "def get_config():\n"
                    "    c = base_config()\n"
                    "    c.optimizer.learning_rate = 3e-4\n"
                    "    return c\n")
    with pytest.raises(ValueError, match=r"unknown config key 'optimizer.learning_rate': optimizer "
                                         r"has no key 'learning_rate'; did you mean "
                                         r"'optimizer.peak_lr'\? \(what Hugging Face calls"):
        validate_config(load_config(path))


def test_a_section_field_without_a_declared_doc_is_refused():
    import dataclasses

    from jaxformer.settings import section, setting

    @dataclasses.dataclass(frozen=True)
    class Undocumented:
        rate: float = setting(0.1, "a documented rate")
        other: int = 3

    with pytest.raises(TypeError, match=r"Undocumented.other is not declared with .*setting"):
        section(Undocumented)


@pytest.mark.parametrize("body,line,message", [
    ("def get_config(:\n    pass\n", 1, "SyntaxError: invalid syntax"),
    ("from jaxformer.train.config import base_config\n\ndef get_config():\n"
     "    raise ValueError('my own problem')\n", 4, "get_config() raised ValueError: my own problem"),
    ("import not_a_module_xyz\n", 1, "ModuleNotFoundError: No module named 'not_a_module_xyz'"),
    ("X = 1\n", None, "defines no get_config(): a config file returns its ml_collections.ConfigDict"),
])
def test_a_config_file_that_gives_no_config_is_one_line_naming_file_and_line(tmp_path, body, line,
                                                                              message):
    """Issue 60: a syntax error, a raising ``get_config``, a missing import or no ``get_config``
    gave a 40-46-line absl traceback. One line: the file (and line), the user's own text."""
    from jaxformer.train.config.loading import ConfigError

    path = tmp_path / "mine.py"
    path.write_text(body)
    where = f"{path}:{line}" if line else str(path)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value).startswith(f"config file {where}") and message in str(e.value), e.value
    assert "\n" not in str(e.value)


def test_train_py_reports_a_broken_config_file_in_one_line_and_takes_flags_in_any_order(tmp_path):
    """Issue 60: ``train.py`` printed absl's traceback for a broken config file, refused an override
    placed before ``--config``, and ``--print_config`` needed ``--config``."""
    import subprocess
    import sys

    def train_py(*args):
        return subprocess.run([sys.executable, str(ROOT / "train.py"), *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)

    (tmp_path / "broken.py").write_text("def get_config():\n    return 1 / 0\n")
    proc = train_py("--config", str(tmp_path / "broken.py"), "--workdir", str(tmp_path / "wd"))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"train.py: error: config file {tmp_path / 'broken.py'}:2: get_config() raised "
        "ZeroDivisionError: division by zero"], proc.stderr[-3000:]
    assert not (tmp_path / "wd").exists()
    proc = train_py("--config.num_train_steps=7", "--config.data.label_names=neg,pos", "--config",
                    str(ROOT / "configs" / "bert_finetune_tiny.py"), "--print_config")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {k.strip(): v for k, v in (line.split(" = ", 1) for line in proc.stdout.splitlines())}
    assert rows["num_train_steps"].startswith("7  (base: 1000)"), rows["num_train_steps"]
    assert rows["data.label_names"].startswith("('neg', 'pos')  (base: None)")  # split, as used
    proc = train_py("--print_config")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == format_config(base_config()) + "\n"


# --------------------------------------------------------------------------------------------------
# The typed config at run time: `TrainSettings`, built once from the checked config.

MAIN_RUNS = ROOT / "tests" / "data" / "config_json_main"  # config.json files written by main 0e9ddf4
# the overrides each fixture was written with (tests/data/config_json_main/README.md)
MAIN_OVERRIDES = {"gpt_pretrain_tiny": {}, "bert_pretrain_tiny": {},
                  "bert_finetune_tiny": {"data.label_names": ("negative", "positive"),
                                         "optimizer.lora.targets": ("query", "key")}}


def test_read_builds_subsections_and_tuples_as_declared():
    """`jaxformer.settings.read` builds ``data.tokenizer`` and ``optimizer.lora`` as their section
    objects, fills what a dict lacks with the defaults, turns a JSON list into a tuple and splits a
    comma string (an unquoted ``--config.data.label_names=neg,pos``) as a tuple setting reads it."""
    from jaxformer.data.pipeline import DataSettings
    from jaxformer.data.tokenizer import TokenizerSettings
    from jaxformer.models.lora import LoraSettings
    from jaxformer.settings import read
    from jaxformer.train.optim import OptimizerSettings

    data = read(DataSettings, {"seq_len": 32, "label_names": ("neg, pos",), "columns": ["a", "b"],
                               "split_fractions": [0.8, 0.1, 0.1], "tokenizer": {"vocab_size": 9}})
    assert data.seq_len == 32 and data.batch_size == DataSettings().batch_size
    assert data.label_names == ("neg", "pos") and data.columns == ("a", "b")
    assert data.split_fractions == (0.8, 0.1, 0.1)
    assert data.tokenizer == TokenizerSettings(vocab_size=9)
    opt = read(OptimizerSettings, {"peak_lr": 1, "lora": {"targets": "query,ffn", "rank": 4}})
    assert opt.peak_lr == 1.0 and isinstance(opt.peak_lr, float)
    assert opt.lora == LoraSettings(rank=4, targets=("query", "ffn"))
    assert read(OptimizerSettings, None) == OptimizerSettings()
    hash(data), hash(opt)  # frozen all the way down: usable as a jit static argument


def test_train_settings_hold_every_section_typed():
    """`check_config` returns the config as `TrainSettings`: the run keys as attributes, each
    section its dataclass, the objective's own options its options class."""
    from jaxformer.objectives.mlm import MLMOptions
    from jaxformer.objectives.scheduled_sampling import ScheduledSamplingOptions
    from jaxformer.train.config import TrainSettings, check_config
    from jaxformer.train.config.schema import MeshSettings

    config = load_config(ROOT / "configs" / "bert_pretrain_tiny.py",
                         {"objective.mask_rate": 0.2, "mesh.fsdp": 1, "seed": 7})
    settings, _, _ = check_config(config, validate_config(config))
    assert isinstance(settings, TrainSettings) and settings.seed == 7
    assert settings.model == validate_config(config) and settings.mesh == MeshSettings()
    assert settings.objective.name == "mlm"
    assert settings.objective_options == MLMOptions(mask_rate=0.2)
    assert settings.data.seq_len == config.data.seq_len
    assert settings.optimizer.lora.rank == 0 and settings.distill.teacher == ""
    gpt = _tiny()
    assert check_config(gpt, validate_config(gpt))[0].objective_options == (
        ScheduledSamplingOptions())


@pytest.mark.parametrize("name", sorted(MAIN_OVERRIDES))
def test_a_config_json_written_by_main_reads_as_its_config_file(name, caplog):
    """An old run's ``config.json`` (written by main before the typed settings, with its legacy
    ``module_api`` key and lists for tuples) gives, through `run_settings`, the `TrainSettings`
    that its config file resolves to today; its ``module_api`` logs the legacy note once."""
    from jaxformer.train.config import run_settings
    from jaxformer.train.setup import resolve_config

    run_config = json.loads((MAIN_RUNS / name / "config.json").read_text())
    assert run_config["module_api"] == "nnx"
    want = resolve_config(load_config(ROOT / "configs" / f"{name}.py", MAIN_OVERRIDES[name])).settings
    # One default changed since: ModernBERT's `prediction_head` (issue 64) joined the head prefixes;
    # an old run keeps the prefixes it stored, which are today's without it.
    opt = want.optimizer
    want = dataclasses.replace(want, optimizer=dataclasses.replace(opt, head_param_prefixes=tuple(
        p for p in opt.head_param_prefixes if p != "prediction_head")))
    caplog.clear()
    with caplog.at_level("WARNING"):
        got = run_settings(run_config)
    assert got == want
    assert [r.getMessage() for r in caplog.records if "module_api" in r.getMessage()] == [
        "config key module_api='nnx': ignored: there is one model implementation (the former "
        "'linen' and 'nnx' ran the same program)"]


def test_the_legacy_runs_config_json_reads_with_the_keys_it_predates_as_defaults(caplog):
    """The config.json of tests/data/legacy_gpt_jax010 (a release before ``dropout_prng``,
    ``objective.vocab_block_size`` … existed, with the legacy ``data.task``) reads through
    `run_settings`, as `jaxformer.evaluate_run.load_run` reads that workdir: what it states is
    kept, what it predates takes the declared default, ``data.task`` logs its note."""
    from jaxformer.config import ModelConfig
    from jaxformer.evaluate_run import load_run
    from jaxformer.train.config import run_settings
    from jaxformer.train.config.schema import ObjectiveSettings, RunSettings

    workdir = ROOT / "tests" / "data" / "legacy_gpt_jax010" / "workdir"
    run_config = json.loads((workdir / "config.json").read_text())
    assert "dropout_prng" not in run_config and "vocab_block_size" not in run_config["objective"]
    with caplog.at_level("WARNING"):
        settings = run_settings(run_config)
    assert any("data.task='lm'" in r.getMessage() for r in caplog.records)
    assert settings.model == ModelConfig.from_dict(run_config["model"])
    assert (settings.num_train_steps, settings.seed) == (run_config["num_train_steps"],
                                                         run_config["seed"])
    assert settings.data.seq_len == run_config["data"]["seq_len"]
    assert settings.dropout_prng == RunSettings().dropout_prng
    assert settings.objective.vocab_block_size == ObjectiveSettings().vocab_block_size
    assert load_run(workdir).settings == settings
