"""ModernBERT (Warner et al. 2024): logits of HF ``ModernBertForMaskedLM`` /
``…ForSequenceClassification`` (``cls`` and ``mean`` pooling) / ``…ForTokenClassification``,
import → export byte for byte, the tokenizer, the presets' published parameter counts, the local
window against a brute-force reference, and packed rows equal to the examples run alone.

The references are small random transformers models (PyTorch, CPU, float32, eager attention) built
from a fixed seed by the ``build_*`` functions below, with a local window (6) shorter than the inputs
(20) and distinct global / local θ, so that each of ModernBERT's options changes the logits;
`tests/make_golden.py` saves them and their logits as committed golden files (`tests/golden.py`),
which the tests read without torch; the ``hf`` tests load exports back into live PyTorch.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from golden import golden_copy, golden_dir, reference, rel_err
from test_convert_llama import _randomized

from jaxformer.config import ModelConfig
from jaxformer.convert import hf_modernbert, load_hf, save_hf
from jaxformer.models import build_model
from jaxformer.models.presets import preset
from jaxformer.ops.kernel_choice import fastest_attention, target_platform
from jaxformer.ops.masks import local_window_mask

V = 96
TOKENS = np.random.default_rng(0).integers(3, V, (2, 20)).astype(np.int32)
MASK = np.ones_like(TOKENS)
MASK[1, 15:] = 0  # right padding in the second row
RTOL = 1e-5
SMALL = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
             num_attention_heads=4, max_position_embeddings=64, local_attention=6,
             global_attn_every_n_layers=3, global_rope_theta=500.0, local_rope_theta=50.0,
             pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)


# --------------------------------------------------------------------------------------------------
# The reference models (one function per model) and their outputs.

def _build(cls: str, seed: int, **kw):
    import transformers
    return _randomized(getattr(transformers, cls)(transformers.ModernBertConfig(**SMALL, **kw)), seed)


def build_mlm():
    """ModernBertForMaskedLM: layers 0 and 3 global, 1 and 2 local; tied decoder with its bias."""
    return _build("ModernBertForMaskedLM", 0)


def build_cls():
    """ModernBertForSequenceClassification on the first ([CLS]) token, 3 labels."""
    return _build("ModernBertForSequenceClassification", 1, num_labels=3)


def build_cls_mean_bias():
    """Mean pooling, and every bias ModernBERT can have (norms, attention, MLP, head)."""
    return _build("ModernBertForSequenceClassification", 2, num_labels=3, classifier_pooling="mean",
                  norm_bias=True, attention_bias=True, mlp_bias=True, classifier_bias=True)


def build_token():
    """ModernBertForTokenClassification, 5 labels."""
    return _build("ModernBertForTokenClassification", 3, num_labels=5)


BUILDERS = {"modernbert_mlm": build_mlm, "modernbert_cls": build_cls,
            "modernbert_cls_mean_bias": build_cls_mean_bias, "modernbert_token": build_token}


def reference_outputs(model) -> dict[str, np.ndarray]:
    """``logits`` on `TOKENS` with `MASK` (`[2, 20, V]`, `[2, 3]` or `[2, 20, 5]`)."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor(TOKENS).long(), attention_mask=torch.tensor(MASK)).logits
    return {"logits": logits.numpy()}


def _our_logits(cfg: dict, params) -> np.ndarray:
    """Op by op, not jitted: on this tiny model a call costs 0.1 s once the ops are compiled, a
    jit compilation of each config several seconds."""
    model = build_model(ModelConfig.from_dict(cfg))
    return np.asarray(model.apply(params, TOKENS, segment_ids=MASK))


def _valid(logits: np.ndarray) -> np.ndarray:
    """The rows the padding does not touch: all of `[2, C]`, the real tokens of `[2, 20, ...]`."""
    return logits if logits.ndim == 2 else logits[MASK == 1]


# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,scan", [("modernbert_mlm", False), ("modernbert_mlm", True),
                                       ("modernbert_cls", False), ("modernbert_cls_mean_bias", True),
                                       ("modernbert_token", False)])
def test_logits_match_pytorch_and_export_is_byte_identical(name, scan, tmp_path):
    path, ref = golden_dir(name), reference(name)
    cfg, params, _ = load_hf(path, scan_layers=scan)
    err = rel_err(_valid(_our_logits(cfg, params)), _valid(ref["logits"]))
    print(f"{name} scan={scan}: max relative logit error {err:.2e}")
    assert err <= RTOL
    out = tmp_path / "exported"
    save_hf(cfg, params, out)
    with open(f"{path}/model.safetensors", "rb") as a, open(out / "model.safetensors", "rb") as b:
        assert a.read() == b.read()
    assert load_hf(out)[0] == load_hf(path)[0]  # the config too


@pytest.mark.hf
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_export_loads_in_pytorch_with_the_same_logits(name, tmp_path):
    import transformers
    cfg, params, _ = load_hf(golden_dir(name))
    save_hf(cfg, params, tmp_path / "exported")
    model = transformers.AutoConfig.from_pretrained(tmp_path / "exported").architectures[0]
    live = getattr(transformers, model).from_pretrained(tmp_path / "exported",
                                                        attn_implementation="eager").eval()
    assert rel_err(_valid(reference_outputs(live)["logits"]),
                   _valid(reference(name)["logits"])) <= RTOL


@pytest.mark.hf
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_golden_files_match_live_pytorch(name):
    """The committed logits are what the builder's model computes in the installed transformers."""
    import torch
    torch.manual_seed(0)
    assert rel_err(_valid(reference_outputs(BUILDERS[name]())["logits"]),
                   _valid(reference(name)["logits"])) <= RTOL


def test_configs_read_from_each_checkpoint():
    common = dict(position="rope", rope_theta=500.0, local_rope_theta=50.0, local_attention=6,
                  global_attn_every_n_layers=3, first_attn_norm=False, gated_ffn=True,
                  norm_position="pre", embedding_norm=True, type_vocab_size=0)
    want = {"modernbert_mlm": dict(head="mlm", mlm_transform=True, lm_head_bias=True,
                                   tie_embeddings=True, use_bias=False, norm_bias=False),
            "modernbert_cls": dict(head="classify", prediction_head=True, pooling="first",
                                   num_classes=3),
            "modernbert_cls_mean_bias": dict(head="classify", pooling="mean", use_bias=True,
                                             norm_bias=True),
            "modernbert_token": dict(head="token_classify", prediction_head=True, num_classes=5)}
    for name, fields in want.items():
        cfg = load_hf(golden_dir(name))[0]
        assert {k: cfg[k] for k in {**common, **fields}} == {**common, **fields}, name


def test_a_masked_lm_checkpoint_fine_tunes_as_a_classifier():
    """head='classify' on the MLM checkpoint: the backbone and the prediction head (HF's ``head``,
    shared by every ModernBERT class) are read, the classifier starts fresh."""
    cfg, params, _ = load_hf(golden_dir("modernbert_mlm"), head="classify", num_classes=4)
    _, mlm, _ = load_hf(golden_dir("modernbert_mlm"))
    np.testing.assert_array_equal(params["prediction_head"]["dense"]["kernel"],
                                  mlm["mlm_head"]["dense"]["kernel"])
    assert params["classifier"]["kernel"].shape == (32, 4) and not params["classifier"]["bias"].any()
    assert _our_logits(cfg, params).shape == (2, 4)


def test_each_option_changes_the_logits():
    """The window, the local θ and layer 0's missing norm each matter on these inputs (so the
    parity above checks them), and a window as wide as the rows is global attention."""
    cfg, params, _ = load_hf(golden_dir("modernbert_mlm"))
    base = _our_logits(cfg, params)[MASK == 1]
    for change in (dict(local_attention=None, local_rope_theta=None), dict(local_rope_theta=500.0),
                   dict(local_attention=40), dict(first_attn_norm=True)):
        assert rel_err(_our_logits({**cfg, **change}, params)[MASK == 1], base) > 1e-3, change
    wide = _our_logits({**cfg, "local_attention": 40, "local_rope_theta": 500.0}, params)
    glob = _our_logits({**cfg, "local_attention": None, "local_rope_theta": None}, params)
    np.testing.assert_allclose(wide, glob, rtol=1e-6, atol=1e-6)


def test_local_window_mask_against_brute_force():
    rng = np.random.default_rng(0)
    q, k = rng.integers(0, 30, (2, 7)), rng.integers(0, 30, (2, 9))
    for window in (2, 5, 128):
        want = np.array([[[[abs(int(q[b, i]) - int(k[b, j])) <= window // 2 for j in range(9)]
                           for i in range(7)]] for b in range(2)])
        np.testing.assert_array_equal(np.asarray(local_window_mask(q, k, window)), want)


# --------------------------------------------------------------------------------------------------
# Unpadded training is the pipeline's packing: packed rows give each example's outputs alone.

def test_packed_rows_give_the_outputs_of_each_example_alone():
    """Examples first-fit packed into rows of 32 (`jaxformer.data.packing.pack`, the pipeline's
    packing) give, token for token, the MLM logits each example gives alone (one example per row,
    `jaxformer.data.packing.pad_example`): segment ids keep examples apart, in the local layers'
    windows (6 here, shorter than the examples) too."""
    import grain

    from jaxformer.data.packing import pack, pad_example, unpack_row

    cfg = ModelConfig.from_dict(load_hf(golden_dir("modernbert_mlm"))[0])
    params = load_hf(golden_dir("modernbert_mlm"))[1]
    model = build_model(cfg)
    rng = np.random.default_rng(0)
    examples = [{"inputs": rng.integers(3, V, n).astype(np.int32)} for n in (13, 7, 11, 20, 9, 5)]
    rows = list(pack(grain.MapDataset.source(examples).to_iter_dataset(), {"inputs": 32}, num_bins=2))
    assert len(rows) < len(examples) and any(len(unpack_row(r, "inputs")) > 1 for r in rows)
    def run(rows):
        batch = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
        return np.asarray(model.apply(params, batch["inputs"], positions=batch["inputs_positions"],
                                      segment_ids=batch["inputs_segment_ids"]))

    packed = run(rows)
    alone = {tuple(e["inputs"]): out[:len(e["inputs"])]
             for e, out in zip(examples, run([pad_example(e, {"inputs": 32}) for e in examples]))}
    seen = 0
    for row, out in zip(rows, packed):
        seg = row["inputs_segment_ids"]
        for s in np.unique(seg[seg > 0]):
            assert rel_err(out[seg == s], alone[tuple(row["inputs"][seg == s])]) <= 1e-5
            seen += 1
    assert seen == len(examples)


# --------------------------------------------------------------------------------------------------
# Presets, kernels, refusals.

@pytest.mark.parametrize("name,head_count,want", [("modernbert_base", 768, 149_655_232),
                                                  ("modernbert_large", 1024, 395_881_664)])
def test_presets_hold_the_published_parameter_counts(name, head_count, want):
    """HF ModernBertForMaskedLM at the published configs (149M / 395M), plus the d_model scale of
    layer 0's attention norm that ours store unused."""
    shapes = build_model(ModelConfig.from_dict(preset(name, scan_layers=True))).abstract()
    assert sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes)) == want + head_count


def test_fused_kernels_refuse_the_local_window_and_auto_picks_xla():
    cfg = ModelConfig.from_dict(preset("modernbert_tiny"))
    for platform in ("tpu", "cuda"):
        with target_platform(platform):
            assert cfg.attention_kernel == "xla"
        assert fastest_attention(dtype="bfloat16", head_dim=64, relative_bias=False, causal=False,
                                 attention_dropout_rate=0.0, chunk_size=512, platform=platform,
                                 local_window=True) == "xla"
    for impl in ("splash", "flash", "cudnn"):
        with pytest.raises(ValueError, match="model.local_attention=16 is invalid.*no dense mask"):
            ModelConfig.from_dict(preset("modernbert_tiny", attention_impl=impl, dtype="bfloat16"))
    chunked = ModelConfig.from_dict(preset("modernbert_tiny", attention_impl="chunked",
                                           attention_chunk_size=8))
    tokens = np.random.default_rng(1).integers(3, 512, (2, 24)).astype(np.int32)
    params = build_model(cfg).init(jax.random.key(0))
    assert rel_err(build_model(chunked).apply(params, tokens),
                   build_model(cfg).apply(params, tokens)) <= 1e-5


@pytest.mark.parametrize("change,message", [
    (dict(family="decoder", head="lm"), "local_attention=16 is invalid: is the encoder's"),
    (dict(global_attn_every_n_layers=0), "global_attn_every_n_layers=0 is invalid"),
    (dict(local_attention=1), "local_attention=1 is invalid: must be an integer >= 2"),
    (dict(position="learned", local_rope_theta=10_000.0), "local_rope_theta=10000.0 is invalid"),
    (dict(norm_position="post"), "first_attn_norm=False is invalid"),
    (dict(prediction_head=True), "prediction_head=True is invalid"),
])
def test_config_errors_name_the_field(change, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_dict(preset("modernbert_tiny", **change))


BASE = {"model_type": "modernbert", "vocab_size": V, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 4, "num_attention_heads": 4}


@pytest.mark.parametrize("extra,field", [
    (dict(layer_types=["full_attention", "sliding_attention", "full_attention", "full_attention"]),
     "layer_types="),
    (dict(attention_bias=True), "'attention_bias': True, 'mlp_bias': False"),
    (dict(classifier_activation="silu"), "classifier_activation='silu'"),
    (dict(classifier_pooling="max"), "classifier_pooling='max'"),
    (dict(rope_parameters={"full_attention": {"rope_type": "yarn", "factor": 2.0}}), "'yarn'"),
])
def test_unsupported_variants_are_refused_naming_the_field(extra, field):
    with pytest.raises(ValueError, match=field.replace("[", r"\[")):
        hf_modernbert.config_from_hf({**BASE, **extra}, {}, head="mlm", num_classes=None)


def test_layer_patterns_and_export_refusals():
    one_global = dict(BASE, layer_types=["full_attention"] + ["sliding_attention"] * 3)
    assert hf_modernbert.config_from_hf(one_global, {}, head="mlm", num_classes=None)[0][
        "global_attn_every_n_layers"] == 4
    all_global = dict(BASE, layer_types=["full_attention"] * 4)
    assert hf_modernbert.config_from_hf(all_global, {}, head="mlm", num_classes=None)[0][
        "local_attention"] is None
    with pytest.raises(ValueError, match="ModernBERT equivalent: first_attn_norm=True"):
        hf_modernbert.config_to_hf(ModelConfig.from_dict(preset("modernbert_tiny",
                                                                 first_attn_norm=True)))


# --------------------------------------------------------------------------------------------------
def build_modernbert_tokenizer(directory) -> str:
    """ModernBERT's tokenizer layout: a byte-level BPE with BERT's special tokens
    (``[UNK] [CLS] [SEP] [PAD] [MASK]``) and a ``[CLS] $A [SEP]`` post-processor, saved by
    transformers' ``PreTrainedTokenizerFast`` (trained here on a fixed text; nothing is downloaded)."""
    import transformers
    from test_fast_tokenizer import ENCODER_CORPUS
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    specials = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    tok = Backend(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(ENCODER_CORPUS, trainers.BpeTrainer(
        vocab_size=V, special_tokens=specials, show_progress=False,
        limit_alphabet=50))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
        pad_token="[PAD]", mask_token="[MASK]")
    fast.save_pretrained(directory)
    return str(directory)


def test_tokenizer_is_read_and_exported_with_the_model(tmp_path):
    """The checkpoint's tokenizer.json is what `load_hf` returns and `save_hf` writes back:
    transformers' ``AutoTokenizer`` gives the same ids (framing included) on both directories."""
    import transformers
    from test_fast_tokenizer import SAMPLES

    from jaxformer.data.tokenizer import Tokenizer

    src = golden_copy("modernbert_mlm", tmp_path / "src")
    build_modernbert_tokenizer(src)
    cfg, params, tok_file = load_hf(src)
    ours = Tokenizer.load(tok_file)
    auto = transformers.AutoTokenizer.from_pretrained(src)
    want = [auto(t, add_special_tokens=False)["input_ids"] for t in SAMPLES]
    assert [ours.encode(t) for t in SAMPLES] == want
    assert max(i for ids in want for i in ids) < V
    save_hf(cfg, params, tmp_path / "out", tokenizer=src)
    back = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert [back(t)["input_ids"] for t in SAMPLES] == [auto(t)["input_ids"] for t in SAMPLES]
    assert auto(SAMPLES[0])["input_ids"][0] == 1 and auto(SAMPLES[0])["input_ids"][-1] == 2
