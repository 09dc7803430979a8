"""Hugging Face RoBERTa / DistilBERT / BART ↔ jaxformer: logits and greedy generation against
PyTorch's, import → export byte-identical (tensors) and key for key (config.json), both module
APIs; export → ``from_pretrained`` (live PyTorch: ``hf``).

Every reference model is built by a ``build_*`` function below from a fixed seed (tiny, random;
nothing is downloaded) and its outputs on `batch` computed by `reference_outputs`;
`tests/make_golden.py` saves both as committed golden files (`tests/golden.py`), which the tests
read without torch. torch and transformers are imported inside functions: without them this module
is collected and its ``hf`` tests skipped.
"""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest
from golden import golden_dir, reference, rel_err
from test_convert import assert_same_config, export_like_the_cli

from jaxformer.config import ModelConfig
from jaxformer.convert import from_hf, load_hf, save_hf
from jaxformer.decode import generate
from jaxformer.models import build_model

V, B, L, T = 128, 2, 12, 7  # vocabulary, batch, source length, target length
RTOL = 1e-5
MAX_NEW = 8
ENCODER = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=64)
DISTILBERT = dict(vocab_size=V, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                  max_position_embeddings=64)
BART = dict(vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
            decoder_ffn_dim=64, max_position_embeddings=64)


# --------------------------------------------------------------------------------------------------
# The reference models (one builder per model, fixed seeds) and their outputs.

def _seeded(seed: int):
    import torch
    import transformers
    torch.manual_seed(seed)
    return transformers


def build_roberta_mlm():
    t = _seeded(0)
    return t.RobertaForMaskedLM(t.RobertaConfig(**ENCODER, max_position_embeddings=66,
                                                type_vocab_size=1)).eval()


def build_roberta_cls():
    t = _seeded(1)
    return t.RobertaForSequenceClassification(t.RobertaConfig(
        **ENCODER, max_position_embeddings=66, type_vocab_size=1, num_labels=3)).eval()


def build_distilbert_mlm():
    t = _seeded(2)
    return t.DistilBertForMaskedLM(t.DistilBertConfig(**DISTILBERT)).eval()


def build_distilbert_cls():
    t = _seeded(3)
    return t.DistilBertForSequenceClassification(t.DistilBertConfig(**DISTILBERT,
                                                                    num_labels=3)).eval()


def build_roberta_token():
    t = _seeded(10)
    return t.RobertaForTokenClassification(t.RobertaConfig(
        **ENCODER, max_position_embeddings=66, type_vocab_size=1, num_labels=5)).eval()


def build_roberta_qa():
    t = _seeded(11)
    return t.RobertaForQuestionAnswering(t.RobertaConfig(
        **ENCODER, max_position_embeddings=66, type_vocab_size=1)).eval()


def build_distilbert_token():
    t = _seeded(12)
    return t.DistilBertForTokenClassification(t.DistilBertConfig(**DISTILBERT,
                                                                 num_labels=5)).eval()


def build_distilbert_qa():
    t = _seeded(13)
    return t.DistilBertForQuestionAnswering(t.DistilBertConfig(**DISTILBERT)).eval()


def build_bart():
    import torch
    t = _seeded(5)
    # init_std 0.3: at BART's 0.02 the greedy search of a random model ends at once (</s> first,
    # for every input), which would make the generation test unable to fail
    model = t.BartForConditionalGeneration(t.BartConfig(**BART, scale_embedding=True, init_std=0.3))
    with torch.no_grad():  # HF initialises the buffer at zero: make the bias visible in logits
        model.final_logits_bias.normal_(0.0, 0.05)
    return model.eval()


BUILDERS = {"roberta_mlm": build_roberta_mlm, "roberta_cls": build_roberta_cls,
            "roberta_token": build_roberta_token, "roberta_qa": build_roberta_qa,
            "distilbert_mlm": build_distilbert_mlm, "distilbert_cls": build_distilbert_cls,
            "distilbert_token": build_distilbert_token, "distilbert_qa": build_distilbert_qa,
            "bart": build_bart}


def batch() -> dict[str, np.ndarray]:
    """Fixed inputs: ids in [3, V) (no RoBERTa / BART special id inside a row), the second row
    padded (pad id 1, attention mask 0) after 8 tokens; BART's targets start with ``</s>`` = 2."""
    r = np.random.default_rng(0)
    x = r.integers(3, V, (B, L)).astype(np.int32)
    mask = np.ones_like(x)
    mask[1, 8:] = 0
    x[mask == 0] = 1
    y = r.integers(3, V, (B, T)).astype(np.int32)
    y[:, 0] = 2
    return {"inputs": x, "mask": mask, "targets_in": y}


def reference_outputs(name: str, model) -> dict[str, np.ndarray]:
    """HF PyTorch outputs of model ``name`` on `batch`: ``logits`` (MLM / token class logits of
    the non-padding tokens `[N, V or C]`, QA start and end logits `[N, 2]`, class logits `[B, C]`,
    BART's `[B, T, V]`) and, for BART, ``greedy`` `[B, MAX_NEW]` (generate's greedy search, all
    ``generation_config`` extras off)."""
    import torch
    b = batch()
    x, mask = torch.tensor(b["inputs"]).long(), torch.tensor(b["mask"]).long()
    out = {}
    with torch.no_grad():
        if name == "bart":
            out["logits"] = model(input_ids=x, attention_mask=mask, decoder_input_ids=torch.tensor(
                b["targets_in"]).long()).logits.numpy()
            gen = model.generate(input_ids=x, attention_mask=mask, do_sample=False, num_beams=1,
                                 max_new_tokens=MAX_NEW, forced_eos_token_id=None,
                                 forced_bos_token_id=None, no_repeat_ngram_size=0).numpy()
            greedy = np.full((B, MAX_NEW), model.config.pad_token_id, np.int32)
            greedy[:, :gen.shape[1] - 1] = gen[:, 1:]  # less decoder_start_token_id; padded
            out["greedy"] = greedy
        elif name.endswith("_qa"):  # start and end logits of the non-padding tokens, [N, 2]
            o = model(input_ids=x, attention_mask=mask)
            both = np.stack([o.start_logits.numpy(), o.end_logits.numpy()], axis=-1)
            out["logits"] = both[b["mask"] == 1]
        else:
            logits = model(input_ids=x, attention_mask=mask).logits.numpy()
            out["logits"] = logits[b["mask"] == 1] if logits.ndim == 3 else logits
    return out


def _from_pretrained(path):
    import transformers
    cls = getattr(transformers, transformers.AutoConfig.from_pretrained(path).architectures[0])
    return cls.from_pretrained(path, attn_implementation="eager").eval()


# --------------------------------------------------------------------------------------------------
def ours(name: str, cfg_dict: dict, params: dict) -> np.ndarray:
    """jaxformer (Linen) logits on `batch`, laid out as `reference_outputs`'."""
    b = batch()
    apply = jax.jit(build_model(ModelConfig.from_dict(cfg_dict)).apply)
    if name == "bart":
        return np.asarray(apply(params, b["inputs"], b["targets_in"],
                                inputs_segment_ids=b["mask"]))
    out = np.asarray(apply(params, b["inputs"], segment_ids=b["mask"]))
    return _per_token(name, out, b["mask"])


def _per_token(name: str, out, mask) -> np.ndarray:
    """Outputs of the non-padding tokens: `[B, L, X]` → `[N, X]` (span logits `[B, 2, L]` first
    as `[B, L, 2]`); sequence outputs `[B, C]` as they are."""
    out = np.asarray(out)
    if name.endswith("_qa"):
        out = np.swapaxes(out, 1, 2)
    return out[mask == 1] if out.ndim == 3 else out


@pytest.mark.parametrize("name", list(BUILDERS))
def test_logits_equal_pytorch_and_export_round_trips(name, tmp_path):
    path, ref = golden_dir(name), reference(name)
    np.testing.assert_array_equal(ref["inputs"], batch()["inputs"])  # the golden case's batch
    cfg, params, _ = load_hf(path)
    got = ours(name, cfg, params)
    assert got.shape == ref["logits"].shape
    err = rel_err(got, ref["logits"])
    print(f"{name}: max relative logit error {err:.2e}")
    assert err <= RTOL
    # the NNX model of the same directory computes the same function
    b = batch()
    nnx_model = from_hf(path)
    if name == "bart":
        nnx_out = nnx_model(b["inputs"], b["targets_in"], inputs_segment_ids=b["mask"])
    else:
        nnx_out = _per_token(name, nnx_model(b["inputs"], segment_ids=b["mask"]), b["mask"])
    assert rel_err(nnx_out, ref["logits"]) <= RTOL
    # import → export: the same file, byte for byte, and the same config.json entries
    save_hf(cfg, params, tmp_path / "out")
    with open(os.path.join(path, "model.safetensors"), "rb") as a, \
            open(tmp_path / "out" / "model.safetensors", "rb") as c:
        assert a.read() == c.read()
    export_like_the_cli(cfg, params, path, tmp_path / "cli")
    assert_same_config(path, tmp_path / "cli")


@pytest.mark.hf
@pytest.mark.parametrize("name", list(BUILDERS))
def test_export_loads_in_pytorch_with_the_same_logits(name, tmp_path):
    cfg, params, _ = load_hf(golden_dir(name))
    save_hf(cfg, params, tmp_path / "out")
    got = reference_outputs(name, _from_pretrained(tmp_path / "out"))["logits"]
    assert rel_err(got, reference(name)["logits"]) <= RTOL


def test_bart_greedy_generation_is_token_identical():
    cfg, params, _ = load_hf(golden_dir("bart"))
    b = batch()
    sources = [row[m == 1].tolist() for row, m in zip(b["inputs"], b["mask"])]
    result = generate(build_model(ModelConfig.from_dict(cfg)), params, sources, strategy="greedy",
                      max_new_tokens=MAX_NEW, eos_id=2, pad_id=1, decoder_start_id=2)
    np.testing.assert_array_equal(np.asarray(result.tokens), reference("bart")["greedy"])


def test_configs():
    rob, _, _ = load_hf(golden_dir("roberta_cls"))
    assert (rob["position_offset"], rob["max_len"], rob["type_vocab_size"], rob["pooler"],
            rob["pooler_activation"], rob["num_classes"]) == (2, 64, 1, True, "tanh", 3)
    dist, _, _ = load_hf(golden_dir("distilbert_cls"))
    assert (dist["type_vocab_size"], dist["pooler"], dist["pooler_activation"],
            dist["norm_eps"]) == (0, True, "relu", 1e-12)
    bart, _, _ = load_hf(golden_dir("bart"))
    assert (bart["position_offset"], bart["max_len"], bart["norm_position"],
            bart["scale_embeddings"], bart["lm_head_bias"], bart["norm_eps"]) == (
        2, 64, "post", True, True, 1e-5)


@pytest.mark.hf
def test_distilbert_student_of_a_bert_teacher_exports_as_distilbert(tmp_path):
    """``distill.init_student``'s parameters for a DistilBERT-shaped student of an imported BERT
    (token types and pooler dropped, layers 0 and 2) export as a DistilBertForMaskedLM that
    computes what the jaxformer student computes."""
    import torch
    import transformers

    from jaxformer.train.distill import check_student, select_layers
    from jaxformer.train.distill_config import DistillSettings
    from jaxformer.train.setup import merge_backbone

    torch.manual_seed(6)
    teacher_dir = tmp_path / "bert"
    transformers.BertForMaskedLM(transformers.BertConfig(
        **{**ENCODER, "num_hidden_layers": 4}, max_position_embeddings=64)).save_pretrained(
        teacher_dir)
    t_dict, t_params, _ = load_hf(teacher_dir)
    t_cfg = ModelConfig.from_dict(t_dict)
    s_cfg = t_cfg.replace(num_layers=2, type_vocab_size=0, pooler=False)
    check_student(s_cfg, t_cfg, DistillSettings("t", None, False, 2.0, 5.0, 2.0, 1.0, True))
    fresh = build_model(s_cfg).init(jax.random.key(0))
    params, new = merge_backbone(fresh, select_layers(t_params, t_cfg, 2, False))
    assert new == []
    save_hf(s_cfg, params, tmp_path / "student")
    hf = transformers.DistilBertForMaskedLM.from_pretrained(tmp_path / "student").eval()
    b = batch()
    with torch.no_grad():
        want = hf(input_ids=torch.tensor(b["inputs"]),
                  attention_mask=torch.tensor(b["mask"])).logits.numpy()[b["mask"] == 1]
    assert rel_err(ours("distilbert_mlm", s_cfg.to_dict(), params), want) <= RTOL
