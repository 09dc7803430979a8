"""Hugging Face tokenizers (byte-level BPE for RoBERTa / BART, WordPiece for DistilBERT) read by
`jaxformer.data.tokenizer.Tokenizer.load`: the ids transformers' ``AutoTokenizer`` gives on a
multilingual sample with emoji and whitespace runs, lossless byte-level round trips, and the run's
stored copy (save / load / pickle) giving the same ids.

The tokenizers are trained here on a tiny corpus with the `tokenizers` library (vocabulary < 1000,
nothing downloaded) by the ``build_*`` functions, which need transformers only to save them the
way a checkpoint directory holds them.
"""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest

from jaxformer.data.fast_tokenizer import FastTokenizer, has_tokenizer_files
from jaxformer.data.tokenizer import Tokenizer

CORPUS = ["The quick brown fox jumps over the lazy dog.", "Café déjà vu, naïve façade.",
          "北京欢迎你，上海也欢迎你。", "Привет, мир! Как дела?", "مرحبا بالعالم",
          "emoji 😀🎉 and   spaces\t\ttabs\nnewlines"] * 20
SAMPLE = ["Hello  world!\n\tThe   lazy fox…", "Café déjà vu — naïve façade", "北京欢迎你 😀🎉!",
          "Привет,    мир!", "مرحبا  بالعالم", "  leading and trailing  ", "tab\t\tnew\n\nline",
          "<mask> is special", "unseen: ÆØÅ ß ẞ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 🧪"]


def build_byte_level_bpe(path, legacy: bool = False) -> str:
    """A RoBERTa / BART-style byte-level BPE (specials ``<s> <pad> </s> <unk> <mask>`` = 0..4)
    saved by transformers (``tokenizer.json``); ``legacy``: only ``vocab.json`` + ``merges.txt``,
    as older checkpoints ship it."""
    import tokenizers
    import transformers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    os.makedirs(path, exist_ok=True)
    tok.model.save(str(path))
    if legacy:
        _write_class(path, "RobertaTokenizer")
    else:
        transformers.RobertaTokenizer(vocab=os.path.join(path, "vocab.json"),
                                      merges=os.path.join(path, "merges.txt")).save_pretrained(path)
        for name in ("vocab.json", "merges.txt"):
            os.remove(os.path.join(path, name))
    return str(path)


def _write_class(path, name: str) -> None:
    """The ``tokenizer_config.json`` of a legacy directory: its class only (older checkpoints
    name it through config.json's model_type), so the files alone define the tokenizer."""
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": name}, f)


def build_wordpiece(path, legacy: bool = False) -> str:
    """A BERT / DistilBERT-style uncased WordPiece (``[PAD] [UNK] [CLS] [SEP] [MASK]`` = 0..4)
    saved by transformers; ``legacy``: only ``vocab.txt``."""
    import tokenizers
    import transformers
    from tokenizers import models, normalizers, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(CORPUS, trainers.WordPieceTrainer(
        vocab_size=400, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
        show_progress=False))
    os.makedirs(path, exist_ok=True)
    vocab = os.path.join(path, "vocab.txt")
    with open(vocab, "w", encoding="utf-8") as f:
        f.writelines(t + "\n" for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1]))
    if legacy:
        _write_class(path, "DistilBertTokenizer")
    else:
        transformers.DistilBertTokenizer(vocab=vocab).save_pretrained(path)
        os.remove(vocab)
    return str(path)


BUILDERS = {"bpe": build_byte_level_bpe, "wordpiece": build_wordpiece}


def reference_ids(path) -> list[list[int]]:
    """transformers' ids of `SAMPLE` (no special tokens added)."""
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(path)
    return [tok(t, add_special_tokens=False)["input_ids"] for t in SAMPLE]


@pytest.mark.hf
@pytest.mark.parametrize("kind", list(BUILDERS))
@pytest.mark.parametrize("legacy", [False, True])
def test_ids_equal_transformers_and_survive_the_runs_copy(kind, legacy, tmp_path):
    path = BUILDERS[kind](tmp_path / "hf", legacy=legacy)
    assert has_tokenizer_files(path)
    want = reference_ids(path)
    tok = Tokenizer.load(path)
    assert isinstance(tok, FastTokenizer)
    assert [tok.encode(t) for t in SAMPLE] == want
    assert any(len(ids) > 1 for ids in want) and len({i for ids in want for i in ids}) > 20
    # the run's copy (<workdir>/tokenizer.model), a pickled one (Grain workers), an export
    tok.save(tmp_path / "tokenizer.model")
    for other in (Tokenizer.load(tmp_path / "tokenizer.model"), pickle.loads(pickle.dumps(tok))):
        assert [other.encode(t) for t in SAMPLE] == want
        assert other.special == tok.special
    tok.save_hf(tmp_path / "exported")
    assert reference_ids(tmp_path / "exported") == want


@pytest.mark.hf
def test_roles_decode_and_word_starts(tmp_path):
    bpe = Tokenizer.load(build_byte_level_bpe(tmp_path / "bpe"))
    s = bpe.special
    assert (s.bos_id, s.pad_id, s.eos_id, s.unk_id, s.mask_id, s.cls_id, s.sep_id) == (
        0, 1, 2, 3, 4, 0, 2)
    for text in SAMPLE[:-3]:  # byte-level BPE is lossless (the last texts hold a special token)
        ids = bpe.encode(text)
        assert bpe.decode(ids + [s.eos_id, 7, 8]) == text  # stops at EOS
        _, offsets = bpe.encode_with_offsets(text)
        assert offsets.shape == (len(ids), 2) and np.all(offsets[:, 0] <= offsets[:, 1])
    starts = bpe.word_initial()
    assert starts[bpe.encode(" fox")[0]] and not starts[s.pad_id]
    wp = Tokenizer.load(build_wordpiece(tmp_path / "wp"))
    w = wp.special
    assert (w.pad_id, w.unk_id, w.cls_id, w.sep_id, w.mask_id, w.eos_id, w.bos_id) == (
        0, 1, 2, 3, 4, -1, -1)
    ids = wp.encode("The quick brown foxes")
    assert wp.decode(ids) == "the quick brown foxes"
    starts = wp.word_initial()
    assert [bool(starts[i]) for i in ids] == [not wp.id_to_piece(i).startswith("##") for i in ids]


def test_a_tokenizer_without_padding_pads_with_eos_and_is_told_from_sentencepiece(tmp_path):
    """GPT-2's files name no padding token: EOS pads. A stored tokenizer is JSON, which
    `Tokenizer.load` tells from a SentencePiece model (needs only `tokenizers`, no transformers)."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.save(str(tmp_path / "tokenizer.json"))
    with open(tmp_path / "tokenizer_config.json", "w") as f:
        json.dump({"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                   "unk_token": "<|endoftext|>"}, f)
    loaded = Tokenizer.load(tmp_path)
    s = loaded.special
    assert s.pad_id == s.eos_id == s.bos_id == 0 and s.mask_id == s.cls_id == -1
    text = "Café 😀  two  spaces"
    assert loaded.encode(text) == tok.encode(text).ids and loaded.decode(loaded.encode(text)) == text
    loaded.save(tmp_path / "tokenizer.model")
    assert (tmp_path / "tokenizer.model").read_bytes()[:1] == b"{"
    again = Tokenizer.load(tmp_path / "tokenizer.model")
    assert isinstance(again, FastTokenizer) and again.encode(text) == loaded.encode(text)
    with pytest.raises(ValueError, match="holds no Hugging Face tokenizer"):
        FastTokenizer.from_directory(tmp_path / "nothing_here")
