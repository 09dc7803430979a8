"""Every runnable config builds and validates (before any data or compilation)."""

import importlib.util
from pathlib import Path

import pytest

from jaxformer.train.config import validate_config

CONFIGS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "configs").glob("*.py"))


@pytest.mark.parametrize("name", CONFIGS)
def test_config_validates(name):
    path = Path(__file__).resolve().parents[1] / "configs" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    model_cfg = validate_config(config)
    assert config.num_train_steps > 0 and model_cfg.vocab_size >= config.data.tokenizer.vocab_size


def test_unknown_top_level_key_is_rejected():
    spec = importlib.util.spec_from_file_location(
        "gpt", Path(__file__).resolve().parents[1] / "configs" / "gpt_pretrain_tiny.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    with config.unlocked():
        config.num_train_step = 3
    with pytest.raises(ValueError, match="num_train_step"):
        validate_config(config)
