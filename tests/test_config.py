"""`ModelConfig` validation: every bad value is a ValueError naming the field, before compiling."""

import dataclasses

import ml_collections
import pytest

from jaxformer.config import ModelConfig
from jaxformer.models.presets import PRESETS, preset


def test_defaults_are_derived():
    cfg = ModelConfig(d_model=96, num_heads=6, num_layers=3)
    assert cfg.head_dim == 16 and cfg.num_kv_heads == 6
    assert cfg.num_encoder_layers == cfg.num_decoder_layers == 3
    assert cfg.embed_init_std == cfg.init_std
    assert ModelConfig(d_model=96, num_heads=5, head_dim=8).head_dim == 8  # explicit head_dim
    assert ModelConfig(family="decoder").causal and not ModelConfig(family="encoder",
                                                                     head="mlm").causal


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_build_and_round_trip(name):
    cfg = ModelConfig.from_dict(preset(name))
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    assert ModelConfig.from_dict(ml_collections.ConfigDict(PRESETS[name])) == cfg
    with pytest.raises(ValueError, match="unknown preset"):
        preset("gpt5")


@pytest.mark.parametrize("kw,field", [
    (dict(d_model=100, num_heads=8), "d_model=100"),
    (dict(num_heads=8, num_kv_heads=3), "num_kv_heads=3"),
    (dict(num_heads=8, num_kv_heads=16), "num_kv_heads=16"),
    (dict(norm="batch"), "norm='batch'"),
    (dict(position="alibi"), "position='alibi'"),
    (dict(family="encoder-decoder"), "family"),
    (dict(norm_position="sandwich"), "norm_position"),
    (dict(head="seq2seq"), "head"),
    (dict(pooling="median"), "pooling"),
    (dict(remat_policy="everything"), "remat_policy"),
    (dict(attention_impl="flash"), "attention_impl"),
    (dict(dtype="float8"), "model.dtype"),
    (dict(param_dtype="int8"), "param_dtype"),
    (dict(activation="swish"), "activation='swish'"),
    (dict(dropout_rate=1.0), "dropout_rate=1.0"),
    (dict(attention_dropout_rate=-0.1), "attention_dropout_rate"),
    (dict(ffn_dropout_rate=1.5), "ffn_dropout_rate"),
    (dict(num_layers=2.5), "num_layers"),
    (dict(type_vocab_size=-1), "type_vocab_size"),
    (dict(position="sinusoidal", d_model=63, num_heads=7), "d_model=63"),
    (dict(position="rope", d_model=60, num_heads=4), "head_dim=15"),
    (dict(position="rope", rope_theta=-1.0), "rope_theta=-1.0"),
    (dict(family="encoder", head="lm"), "head='lm'"),
    (dict(family="encoder_decoder", head="token_classify"), "head"),
    (dict(family="encoder_decoder", head="classify"), "head='classify'"),
    (dict(tie_embeddings=False, rescale_tied_logits=True), "rescale_tied_logits"),
    (dict(family="decoder", nsp_head=True), "nsp_head"),
    (dict(family="decoder", head="classify", pooling="first"), "pooling='first'"),
])
def test_bad_values_raise_value_error_naming_the_field(kw, field):
    with pytest.raises(ValueError, match=field.replace("(", r"\(").replace(".", r"\.")):
        ModelConfig(**kw)
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        ModelConfig.from_dict(kw)


@pytest.mark.parametrize("field", ["vocab_size", "d_model", "num_heads", "num_kv_heads", "head_dim",
                                   "d_ff", "num_layers", "num_encoder_layers", "num_decoder_layers",
                                   "max_len", "relative_num_buckets", "relative_max_distance",
                                   "num_classes", "attention_chunk_size"])
@pytest.mark.parametrize("value", [0, -4])
def test_non_positive_sizes(field, value):
    with pytest.raises(ValueError, match=rf"model\.{field}={value} is invalid: must be a positive"):
        ModelConfig(**{field: value})


def test_unknown_keys_are_listed():
    with pytest.raises(ValueError, match=r"unknown model config keys \['d_modle', 'heads'\]"):
        ModelConfig.from_dict({"d_modle": 512, "heads": 8, "num_layers": 2})


def test_frozen_and_replace_revalidates():
    cfg = ModelConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.d_model = 8  # type: ignore[misc]
    assert cfg.replace(num_layers=3).num_layers == 3
    with pytest.raises(ValueError, match="num_kv_heads"):
        cfg.replace(num_kv_heads=3)
    assert hash(cfg) == hash(ModelConfig())  # usable as a Flax module attribute
