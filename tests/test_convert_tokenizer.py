"""Exports carry a ``tokenizer.json`` that gives our SentencePiece ids (unigram and BPE) in
transformers (`jaxformer.convert.hf_tokenizer`, `jaxformer.data.sentencepiece_json`)."""

from __future__ import annotations

import io
import json
import logging

import jax
import jax.numpy as jnp
import pytest
import sentencepiece as spm
import transformers

from jaxformer.config import ModelConfig
from jaxformer.convert import save_hf
from jaxformer.data.sentencepiece_json import sentencepiece_backend
from jaxformer.data.sources import SourceSettings, get_source
from jaxformer.data.tokenizer import Tokenizer, train_sentencepiece
from jaxformer.models import build_model
from jaxformer.models.presets import preset

pytestmark = pytest.mark.slow  # transformers interop (AutoTokenizer); `make test` runs it

EDGE_CASES = ["", " ", "a  b", "  leading and trailing  ", "tabs\tand\nnewlines",
              "héllo wörld ☃ 日本語 🙂", "ﬁ ligature Ⅻ ①", "\u3000full-width space", "1234567890"]


def _texts(source: str, split: str, n: int) -> list[str]:
    src = get_source(SourceSettings(source=source), split)
    return [src[i]["text"] for i in range(min(n, len(src)))]


@pytest.fixture(scope="module")
def held_out() -> list[str]:
    return (_texts("shakespeare", "validation", 800) + _texts("movie_sentiment", "test", 400)
            + EDGE_CASES)


@pytest.fixture(scope="module")
def spm_models(tmp_path_factory) -> dict[str, str]:
    """Our default tokenizer (identity normalization), an NFKC one (precompiled character map,
    extra whitespace removed) and a BPE one, trained on training text only."""
    out = {}
    corpus = _texts("shakespeare", "train", 3000) + _texts("movie_sentiment", "train", 3000)
    for name, kwargs in {"identity": {}, "nmt_nfkc": {"normalization": "nmt_nfkc"},
                         "bpe": {"model_type": "bpe"}}.items():
        path = tmp_path_factory.mktemp("spm") / f"{name}.model"
        path.write_bytes(train_sentencepiece(corpus, vocab_size=1200, **kwargs))
        out[name] = str(path)
    return out


@pytest.mark.parametrize("normalization", ["identity", "nmt_nfkc", "bpe"])
def test_fast_tokenizer_gives_our_ids(spm_models, held_out, normalization):
    ours = Tokenizer.load(spm_models[normalization])
    fast = sentencepiece_backend(ours.model_proto)
    for text in held_out:
        ids = ours.encode(text)
        assert fast.encode(text, add_special_tokens=False).ids == ids, repr(text)
        assert fast.decode(ids) == ours.decode(ids), repr(text)
    # the emoji is not in the vocabulary: byte fallback is exercised, not just plain pieces
    assert any(fast.id_to_token(i).startswith("<0x") for i in ours.encode("🙂"))


def _gpt_params(cfg):
    jnp.zeros((1, 4), jnp.int32)
    return build_model(cfg).init(jax.random.key(0))


def test_export_loads_with_auto_tokenizer(spm_models, held_out, tmp_path):
    spm = spm_models["identity"]
    ours = Tokenizer.load(spm)
    cfg = ModelConfig.from_dict(preset("gpt_tiny", vocab_size=ours.vocab_size, d_model=16,
                                       num_heads=2, d_ff=32, num_layers=1, max_len=16))
    save_hf(cfg, _gpt_params(cfg), tmp_path / "out", tokenizer=spm)
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert isinstance(auto, transformers.PreTrainedTokenizerFast)
    for text in held_out[::7]:
        assert auto(text, add_special_tokens=False)["input_ids"] == ours.encode(text), repr(text)
    special = ours.special
    assert (auto.pad_token_id, auto.eos_token_id, auto.bos_token_id, auto.mask_token_id) == (
        special.pad_id, special.eos_id, special.bos_id, special.mask_id)
    batch = auto(["a b", "a longer text"], padding=True)["input_ids"]
    assert batch[0][-1] == special.pad_id


def test_a_bpe_model_exports_and_a_model_with_user_pieces_is_written_as_is(spm_models, held_out,
                                                                          tmp_path, caplog):
    ours = Tokenizer.load(spm_models["bpe"])
    cfg = ModelConfig.from_dict(preset("gpt_tiny", vocab_size=ours.vocab_size, d_model=16,
                                       num_heads=2, d_ff=32, num_layers=1, max_len=16))
    save_hf(cfg, _gpt_params(cfg), tmp_path / "out", tokenizer=spm_models["bpe"])
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    for text in held_out[::7]:
        assert auto(text)["input_ids"] == ours.encode(text), repr(text)  # no framing given
    # a model tokenizers cannot express exactly: spiece.model only, and a warning naming why
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_texts("shakespeare", "train", 500)), model_writer=model,
        vocab_size=200, user_defined_symbols=["<user>"], num_threads=1, minloglevel=2)
    (tmp_path / "user.model").write_bytes(model.getvalue())
    with caplog.at_level(logging.WARNING):
        save_hf(cfg.replace(vocab_size=200), _gpt_params(cfg.replace(vocab_size=200)),
                tmp_path / "user", tokenizer=str(tmp_path / "user.model"))
    assert "user-defined pieces are not converted" in caplog.text
    assert not (tmp_path / "user" / "tokenizer.json").exists()
    assert (tmp_path / "user" / "spiece.model").read_bytes() == model.getvalue()
    assert json.loads((tmp_path / "user" / "config.json").read_text())["model_type"] == "gpt2"
