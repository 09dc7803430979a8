"""Checkpoint tokenizers: a Llama-2-style SentencePiece ``tokenizer.model`` and a Llama-3-style
byte-level BPE ``tokenizer.json`` give the ids transformers gives, on a multilingual sample with
emoji and whitespace runs; `FastTokenizer` saves, loads and pickles to the same tokenizer, and
`Tokenizer.load` tells the two formats apart. The tokenizers are trained here from fixed texts by
the ``build_*`` functions (nothing is downloaded)."""

from __future__ import annotations

import io
import json
import pickle

import numpy as np
import pytest

from jaxformer.convert.hf_io import find_tokenizer
from jaxformer.data.fast_tokenizer import FastTokenizer
from jaxformer.data.tokenizer import Tokenizer

CORPUS = ["The quick brown fox jumps over the lazy dog.", "Größe und Ärger — naïve café.",
          "日本語のテキストです。", "Привет, мир! Как дела?", "emoji 😀🎉 here and 👩‍👩‍👧 there",
          "  spaces   runs\tand\nnewlines  ", "Numbers 12345 and code: x = f(y) + 1;"] * 40
SAMPLE = ("Hello wörld — 日本語のテキスト, Привет мир! 😀🎉👩‍👩‍👧  two  spaces\t\ttabs\n\n"
          "  newlines   end ")


def build_llama2_tokenizer(directory) -> str:
    """Llama 2's layout: SentencePiece BPE with byte fallback, <unk> 0, <s> 1, </s> 2, no pad."""
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_writer=model, vocab_size=400, model_type="bpe",
        byte_fallback=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, character_coverage=1.0,
        num_threads=1, remove_extra_whitespaces=False, normalization_rule_name="identity",
        split_digits=True, minloglevel=2)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.model").write_bytes(model.getvalue())
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
         "unk_token": "<unk>"}))
    return str(directory)


def build_llama3_tokenizer(directory) -> str:
    """Llama 3's layout: byte-level BPE in a ``tokenizer.json``, <|begin_of_text|> prepended by
    its post-processor, the roles named in ``tokenizer_config.json``."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    tok = Backend(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"]
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
         "eos_token": {"__type": "AddedToken", "content": "<|end_of_text|>", "lstrip": False,
                       "normalized": False, "rstrip": False, "single_word": False},
         "pad_token": "<|pad|>"}))
    return str(directory)


def reference_ids(directory) -> list[int]:
    """transformers' ids of `SAMPLE` (no special tokens added)."""
    import transformers
    return transformers.AutoTokenizer.from_pretrained(directory)(
        SAMPLE, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("build", [build_llama2_tokenizer, build_llama3_tokenizer])
def test_ids_equal_transformers_on_a_multilingual_sample(build, tmp_path):
    directory = build(tmp_path / "tok")
    ours = Tokenizer.load(find_tokenizer(directory))
    ids = ours.encode(SAMPLE)
    assert ids == reference_ids(directory)
    assert len(set(ids)) > 20  # a real segmentation, not bytes or <unk>s
    assert ours.decode(ids) == SAMPLE  # both are lossless on it


def test_llama3_style_special_tokens_save_load_and_pickle(tmp_path):
    directory = build_llama3_tokenizer(tmp_path / "tok")
    assert find_tokenizer(directory).endswith("tokenizer.json")
    tok = Tokenizer.load(f"{directory}/tokenizer.json")
    assert isinstance(tok, FastTokenizer)
    s = tok.special
    assert (s.bos_id, s.eos_id, s.pad_id, s.unk_id, s.mask_id) == (0, 1, 2, -1, -1)
    ids = tok.encode(SAMPLE)
    assert ids[0] != s.bos_id  # encode adds no specials (the pipeline frames rows)
    assert tok.decode([*ids, s.eos_id, *ids]) == SAMPLE  # stops at EOS
    tok.save(tmp_path / "run" / "tokenizer.model")  # the run's file
    back = Tokenizer.load(tmp_path / "run" / "tokenizer.model")
    assert back.special == s and back.encode(SAMPLE) == ids
    assert pickle.loads(pickle.dumps(tok)).encode(SAMPLE) == ids
    ids2, offsets = tok.encode_with_offsets("naïve café")
    assert ids2 == tok.encode("naïve café") and offsets.shape == (len(ids2), 2)
    assert "".join("naïve café"[a:b] for a, b in offsets) == "naïvecafé"  # spaces left out
    assert np.all(offsets[:-1, 1] <= offsets[1:, 0])  # "ï" is cut over two byte pieces
    initial = tok.word_initial()
    assert initial.shape == (tok.vocab_size,) and 0 < initial.sum() < tok.vocab_size
    # the export side: tokenizer.json and the roles, read back the same
    tok.write_hf_files(tmp_path / "export")
    again = Tokenizer.load(tmp_path / "export" / "tokenizer.json")
    assert again.special == s and again.encode(SAMPLE) == ids


def test_llama2_style_sentencepiece_has_no_pad():
    """Llama 2 has no pad token: pad_id is -1 and the pipeline pads with id 0 (its <unk>), which
    the segment ids mask out."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        tok = Tokenizer.load(find_tokenizer(build_llama2_tokenizer(Path(d))))
    assert (tok.special.unk_id, tok.special.bos_id, tok.special.eos_id, tok.special.pad_id) == (
        0, 1, 2, -1)
    assert np.all(np.array(tok.encode(SAMPLE)) >= 0)
