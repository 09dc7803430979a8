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
    (dict(position="xpos"), "position='xpos'"),
    (dict(family="encoder-decoder"), "family"),
    (dict(norm_position="sandwich"), "norm_position"),
    (dict(head="seq2seq"), "head"),
    (dict(pooling="median"), "pooling"),
    (dict(remat_policy="everything"), "remat_policy"),
    (dict(attention_impl="flash3"), "attention_impl"),
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
    (dict(position="rope", rope_scaling="longrope"), "rope_scaling='longrope'"),
    (dict(position="rope", rope_scaling="dynamic", rope_scaling_factor=2.0),
     "rope_original_max_len=None"),
    (dict(position="learned", rope_scaling="linear", rope_scaling_factor=2.0), "rope_scaling='linear'"),
    (dict(position="rope", rope_scaling="linear", rope_scaling_factor=0.0), "rope_scaling_factor=0.0"),
    (dict(position="rope", rope_scaling="llama3", rope_scaling_factor=8.0), "rope_original_max_len=None"),
    (dict(position="rope", rope_scaling="llama3", rope_original_max_len=64,
          rope_low_freq_factor=4.0, rope_high_freq_factor=1.0), "rope_high_freq_factor=1.0"),
    (dict(position="rope", rope_scaling="yarn", rope_original_max_len=64, rope_beta_fast=0.5),
     "rope_beta_fast=0.5"),
    (dict(sliding_window=0), "sliding_window=0"),
    (dict(family="encoder", head="mlm", sliding_window=4), "sliding_window=4"),
    (dict(sliding_window=4, attention_impl="splash_interpret", attention_dropout_rate=0.0,
          dtype="bfloat16"), "attention_impl='splash_interpret'"),
    (dict(position="alibi", attention_impl="splash_interpret", attention_dropout_rate=0.0,
          dtype="bfloat16"), "position='alibi'"),
    (dict(position="alibi", attention_impl="cudnn", attention_dropout_rate=0.0,
          dtype="bfloat16"), "position='alibi'"),
    (dict(position="alibi", permutation_lm=True), "permutation_lm=True"),
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


def test_every_field_declares_its_kind_and_the_lists_derive_from_it():
    """One fact, one place: the field lists a resume, a fine-tune and an HF export use are the
    fields of the kinds they name (they were three hand-kept lists that disagreed)."""
    from jaxformer import config

    fields = [f.name for f in dataclasses.fields(ModelConfig)]
    assert all(f.metadata["kind"] in config.KINDS for f in dataclasses.fields(ModelConfig))
    assert sorted(config.fields_of(*config.KINDS)) == sorted(fields)
    arch, fine = set(config.architecture_fields()), set(config.fine_tuning_fields())
    assert arch.isdisjoint(fine) and arch | fine == set(fields)
    assert {"d_model", "activation", "norm_position", "position", "vocab_size"} <= arch
    assert {"head", "num_classes", "pooling", "pooler", "nsp_head", "scan_layers"} <= fine
    # a resume may change what neither shapes the parameters nor changes their function, and an
    # MoE's capacity (which assignments drop) and router-loss weights
    assert config.resumable_fields() == (
        "capacity_factor", "moe_dropless", "router_jitter_noise", "router_aux_loss_weight",
        "router_z_loss_weight", "dropout_rate", "attention_dropout_rate", "ffn_dropout_rate",
        "target_token_dropout_rate", "init_scheme", "init_std", "embed_init_std", "dtype",
        "remat_policy", "attention_impl", "attention_chunk_size")
    assert set(config.exported_fields()) <= fine
    with pytest.raises(ValueError, match="unknown field kinds"):
        config.fields_of("runtime")


def test_choices_come_from_the_ops_that_implement_them():
    from jaxformer import config
    from jaxformer.ops.attention import IMPLEMENTATIONS
    from jaxformer.ops.stack import REMAT_POLICIES

    assert config.REMAT_POLICIES == ("none", *REMAT_POLICIES)
    assert config.ATTENTION_IMPLS == ("auto", *IMPLEMENTATIONS)  # auto: resolved by the config


def test_the_head_registry_names_every_head_module_a_model_builds():
    """`jaxformer.models.head_parts` is the one list of head modules: every top-level parameter module
    of every head configuration is either a head module there or part of the backbone."""
    from jaxformer.config import HEADS
    from jaxformer.models.head_parts import HEAD_MODULES, PER_ROW_MODULES
    from jaxformer.models.spec import model_spec

    backbone = set(model_spec(ModelConfig(family="decoder", head="none")))
    seen = set()
    for family, head, extra in [("decoder", "lm", {"tie_embeddings": False}),
                                ("encoder", "mlm", {"nsp_head": True, "pooler": True,
                                                    "mlm_transform": True}),
                                ("encoder", "classify", {"pooler": True}),
                                ("encoder", "token_classify", {"prediction_head": True}),
                                ("encoder", "span", {}),
                                ("encoder", "none", {})]:
        modules = set(model_spec(ModelConfig(family=family, head=head, **extra)))
        heads = {m for m in modules if m in HEAD_MODULES}
        assert all(head in HEAD_MODULES[m].heads for m in heads), (head, heads)
        assert modules - heads <= backbone | set(model_spec(ModelConfig(family="encoder",
                                                                         head="none"))), modules
        seen |= heads
    assert seen == set(HEAD_MODULES)
    assert {h for m in HEAD_MODULES.values() for h in m.heads} <= set(HEADS)
    assert set(PER_ROW_MODULES) == {"pooler", "classifier", "nsp_head"}


def test_from_dict_reads_none_as_unset():
    assert ModelConfig.from_dict({"d_model": 64, "num_heads": 4, "dropout_rate": None,
                                  "head_dim": None}) == ModelConfig(d_model=64, num_heads=4)


# --------------------------------------------------------------------------------------------------
# What ops read of the config: `jaxformer.ops.model_fields.ModelFields`.


def test_model_config_has_every_field_ops_read():
    """`ModelConfig` (a preset of each family, too) satisfies the Protocol ops type ``cfg`` with."""
    from jaxformer.ops.model_fields import ModelFields

    assert isinstance(ModelConfig(), ModelFields)
    for name in ("gpt2_small", "bert_base", "t5_small"):
        assert isinstance(ModelConfig.from_dict(preset(name)), ModelFields), name
    assert not isinstance(object(), ModelFields)


def test_every_cfg_field_read_in_ops_is_declared_in_model_fields():
    """An AST scan of ``jaxformer/ops``: every ``cfg.<name>`` read is a `ModelFields` member, so a
    new field ops read is declared where ops can name its type (docs/extending.md, step 3)."""
    import ast
    import typing
    from pathlib import Path

    from jaxformer.ops.model_fields import ModelFields

    declared = set(typing.get_type_hints(ModelFields))
    ops = Path(__file__).resolve().parents[1] / "jaxformer" / "ops"
    read = {}
    for path in sorted(ops.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id == "cfg"):
                read.setdefault(node.attr, f"{path.name}:{node.lineno}")
    assert len(read) >= 30  # the scan finds the reads
    undeclared = {k: v for k, v in read.items() if k not in declared}
    assert not undeclared, f"ops read cfg fields ModelFields does not declare: {undeclared}"
    unread = declared - set(read)
    assert not unread, f"ModelFields declares fields ops no longer read: {unread}"
