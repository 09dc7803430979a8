"""Hugging Face RoBERTa / DistilBERT / BART ↔ jaxformer: logits and greedy generation against
PyTorch, export → ``from_pretrained``, import → export byte-identical, both module APIs.

Every reference model is built by a ``build_*`` function below from a fixed seed (tiny, random,
saved with ``save_pretrained``; nothing is downloaded) and its outputs computed by `reference`,
apart from the assertions, so that they can be stored as golden files. torch and transformers are
imported inside functions: without them this module is collected and its ``hf`` tests skipped.
"""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from jaxformer import nnx as jnnx
from jaxformer.config import ModelConfig
from jaxformer.convert import load_hf, save_hf
from jaxformer.decode import generate
from jaxformer.models.transformer import build_model

V, B, L, T = 128, 2, 12, 7  # vocabulary, batch, source length, target length
RTOL = 1e-5
MAX_NEW = 8
ENCODER = dict(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=128)
DISTILBERT = dict(vocab_size=V, dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                  max_position_embeddings=64)
BART = dict(vocab_size=V, d_model=64, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
            decoder_ffn_dim=128, max_position_embeddings=64)


# --------------------------------------------------------------------------------------------------
# The reference models (one builder per model, fixed seeds) and their outputs.

def _saved(model, path) -> str:
    model.eval().save_pretrained(path, safe_serialization=True)
    return str(path)


def build_roberta_mlm(path) -> str:
    import torch
    import transformers
    torch.manual_seed(0)
    cfg = transformers.RobertaConfig(**ENCODER, max_position_embeddings=66, type_vocab_size=1)
    return _saved(transformers.RobertaForMaskedLM(cfg), path)


def build_roberta_cls(path) -> str:
    import torch
    import transformers
    torch.manual_seed(1)
    cfg = transformers.RobertaConfig(**ENCODER, max_position_embeddings=66, type_vocab_size=1,
                                     num_labels=3)
    return _saved(transformers.RobertaForSequenceClassification(cfg), path)


def build_distilbert_mlm(path) -> str:
    import torch
    import transformers
    torch.manual_seed(2)
    return _saved(transformers.DistilBertForMaskedLM(transformers.DistilBertConfig(**DISTILBERT)),
                  path)


def build_distilbert_cls(path) -> str:
    import torch
    import transformers
    torch.manual_seed(3)
    cfg = transformers.DistilBertConfig(**DISTILBERT, num_labels=3)
    return _saved(transformers.DistilBertForSequenceClassification(cfg), path)


def build_roberta_token(path) -> str:
    import torch
    import transformers
    torch.manual_seed(10)
    cfg = transformers.RobertaConfig(**ENCODER, max_position_embeddings=66, type_vocab_size=1,
                                     num_labels=5)
    return _saved(transformers.RobertaForTokenClassification(cfg), path)


def build_roberta_qa(path) -> str:
    import torch
    import transformers
    torch.manual_seed(11)
    cfg = transformers.RobertaConfig(**ENCODER, max_position_embeddings=66, type_vocab_size=1)
    return _saved(transformers.RobertaForQuestionAnswering(cfg), path)


def build_distilbert_token(path) -> str:
    import torch
    import transformers
    torch.manual_seed(12)
    cfg = transformers.DistilBertConfig(**DISTILBERT, num_labels=5)
    return _saved(transformers.DistilBertForTokenClassification(cfg), path)


def build_distilbert_qa(path) -> str:
    import torch
    import transformers
    torch.manual_seed(13)
    return _saved(transformers.DistilBertForQuestionAnswering(
        transformers.DistilBertConfig(**DISTILBERT)), path)


def build_bart(path) -> str:
    import torch
    import transformers
    torch.manual_seed(5)
    # init_std 0.3: at BART's 0.02 the greedy search of a random model ends at once (</s> first,
    # for every input), which would make the generation test unable to fail
    model = transformers.BartForConditionalGeneration(
        transformers.BartConfig(**BART, scale_embedding=True, init_std=0.3))
    with torch.no_grad():  # HF initialises the buffer at zero: make the bias visible in logits
        model.final_logits_bias.normal_(0.0, 0.05)
    return _saved(model, path)


BUILDERS = {"roberta_mlm": build_roberta_mlm, "roberta_cls": build_roberta_cls,
            "roberta_token": build_roberta_token, "roberta_qa": build_roberta_qa,
            "distilbert_mlm": build_distilbert_mlm, "distilbert_cls": build_distilbert_cls,
            "distilbert_token": build_distilbert_token, "distilbert_qa": build_distilbert_qa,
            "bart": build_bart}
HF_CLASSES = {"roberta_mlm": "RobertaForMaskedLM", "roberta_cls": "RobertaForSequenceClassification",
              "roberta_token": "RobertaForTokenClassification",
              "roberta_qa": "RobertaForQuestionAnswering",
              "distilbert_mlm": "DistilBertForMaskedLM",
              "distilbert_cls": "DistilBertForSequenceClassification",
              "distilbert_token": "DistilBertForTokenClassification",
              "distilbert_qa": "DistilBertForQuestionAnswering",
              "bart": "BartForConditionalGeneration"}


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


def reference(name: str, path) -> dict[str, np.ndarray]:
    """HF PyTorch outputs of model ``name`` saved at ``path`` on `batch`: ``logits`` (MLM / token
    class logits of the non-padding tokens `[N, V or C]`, QA start and end logits `[N, 2]`, class
    logits `[B, C]`, BART's `[B, T, V]`) and, for BART,
    ``greedy`` `[B, MAX_NEW]` (generate's greedy search, all ``generation_config`` extras off)."""
    import torch
    import transformers
    model = getattr(transformers, HF_CLASSES[name]).from_pretrained(
        path, attn_implementation="eager").eval()
    b = batch()
    x, mask = torch.tensor(b["inputs"]), torch.tensor(b["mask"])
    out = {}
    with torch.no_grad():
        if name == "bart":
            out["logits"] = model(input_ids=x, attention_mask=mask,
                                  decoder_input_ids=torch.tensor(b["targets_in"])).logits.numpy()
            gen = model.generate(input_ids=x, attention_mask=mask, do_sample=False, num_beams=1,
                                 max_new_tokens=MAX_NEW, forced_eos_token_id=None,
                                 forced_bos_token_id=None, no_repeat_ngram_size=0).numpy()
            greedy = np.full((B, MAX_NEW), model.config.pad_token_id, np.int64)
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


# --------------------------------------------------------------------------------------------------
def ours(name: str, cfg_dict: dict, params: dict) -> np.ndarray:
    """jaxformer (Linen) logits on `batch`, laid out as `reference`'s."""
    b = batch()
    apply = jax.jit(build_model(ModelConfig.from_dict(cfg_dict)).apply)
    if name == "bart":
        return np.asarray(apply({"params": params}, b["inputs"], b["targets_in"],
                                inputs_segment_ids=b["mask"]))
    out = np.asarray(apply({"params": params}, b["inputs"], segment_ids=b["mask"]))
    return _per_token(name, out, b["mask"])


def _per_token(name: str, out, mask) -> np.ndarray:
    """Outputs of the non-padding tokens: `[B, L, X]` → `[N, X]` (span logits `[B, 2, L]` first
    as `[B, L, 2]`); sequence outputs `[B, C]` as they are."""
    out = np.asarray(out)
    if name.endswith("_qa"):
        out = np.swapaxes(out, 1, 2)
    return out[mask == 1] if out.ndim == 3 else out


def rel_err(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{name: (directory, reference outputs)}."""
    tmp = tmp_path_factory.mktemp("hf")
    out = {}
    for name, build in BUILDERS.items():
        path = build(tmp / name)
        out[name] = (path, reference(name, path))
    return out


@pytest.mark.hf
@pytest.mark.parametrize("name", list(BUILDERS))
def test_logits_equal_pytorch_and_export_round_trips(models, name, tmp_path):
    path, ref = models[name]
    cfg, params, _ = load_hf(path)
    got = ours(name, cfg, params)
    assert got.shape == ref["logits"].shape
    err = rel_err(got, ref["logits"])
    print(f"{name}: max relative logit error {err:.2e}")
    assert err <= RTOL
    # the NNX model of the same directory computes the same function
    b = batch()
    nnx_model = jnnx.from_hf(path)
    if name == "bart":
        nnx_out = nnx_model(b["inputs"], b["targets_in"], inputs_segment_ids=b["mask"])
    else:
        nnx_out = _per_token(name, nnx_model(b["inputs"], segment_ids=b["mask"]), b["mask"])
    assert rel_err(nnx_out, ref["logits"]) <= RTOL
    # export → from_pretrained: the same logits; import → export: the same file, byte for byte
    save_hf(cfg, params, tmp_path / "out")
    assert rel_err(reference(name, tmp_path / "out")["logits"], ref["logits"]) <= RTOL
    with open(os.path.join(path, "model.safetensors"), "rb") as a, \
            open(tmp_path / "out" / "model.safetensors", "rb") as c:
        assert a.read() == c.read()


@pytest.mark.hf
def test_bart_greedy_generation_is_token_identical(models):
    path, ref = models["bart"]
    cfg, params, _ = load_hf(path)
    b = batch()
    sources = [row[m == 1].tolist() for row, m in zip(b["inputs"], b["mask"])]
    result = generate(build_model(ModelConfig.from_dict(cfg)), params, sources, strategy="greedy",
                      max_new_tokens=MAX_NEW, eos_id=2, pad_id=1, decoder_start_id=2)
    np.testing.assert_array_equal(np.asarray(result.tokens), ref["greedy"])


@pytest.mark.hf
def test_configs(models):
    rob, _, _ = load_hf(models["roberta_cls"][0])
    assert (rob["position_offset"], rob["max_len"], rob["type_vocab_size"], rob["pooler"],
            rob["pooler_activation"], rob["num_classes"]) == (2, 64, 1, True, "tanh", 3)
    dist, _, _ = load_hf(models["distilbert_cls"][0])
    assert (dist["type_vocab_size"], dist["pooler"], dist["pooler_activation"],
            dist["norm_eps"]) == (0, True, "relu", 1e-12)
    bart, _, _ = load_hf(models["bart"][0])
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
    from jaxformer.train.state import init_model_params

    torch.manual_seed(6)
    teacher_dir = _saved(transformers.BertForMaskedLM(transformers.BertConfig(
        **{**ENCODER, "num_hidden_layers": 4}, max_position_embeddings=64)), tmp_path / "bert")
    t_dict, t_params, _ = load_hf(teacher_dir)
    t_cfg = ModelConfig.from_dict(t_dict)
    s_cfg = t_cfg.replace(num_layers=2, type_vocab_size=0, pooler=False)
    check_student(s_cfg, t_cfg, DistillSettings("t", None, False, 2.0, 5.0, 2.0, 1.0, True))
    fresh = init_model_params(build_model(s_cfg), s_cfg, jax.random.key(0))
    params, new = merge_backbone(fresh, select_layers(t_params, t_cfg, 2, False))
    assert new == []
    save_hf(s_cfg, params, tmp_path / "student")
    hf = transformers.DistilBertForMaskedLM.from_pretrained(tmp_path / "student").eval()
    b = batch()
    with torch.no_grad():
        want = hf(input_ids=torch.tensor(b["inputs"]),
                  attention_mask=torch.tensor(b["mask"])).logits.numpy()[b["mask"] == 1]
    assert rel_err(ours("distilbert_mlm", s_cfg.to_dict(), params), want) <= RTOL
