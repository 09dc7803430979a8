"""Checkpoint tokenizers read by `jaxformer.data.tokenizer.Tokenizer.load` give the ids transformers'
``AutoTokenizer`` gives (``add_special_tokens=False``) on multilingual samples with emoji and
whitespace runs: a Llama-2-style SentencePiece ``tokenizer.model``, a Llama-3-style byte-level BPE
``tokenizer.json``, a RoBERTa / BART-style byte-level BPE and a BERT / DistilBERT-style WordPiece
(each as ``tokenizer.json`` and in the older ``vocab.json`` + ``merges.txt`` / ``vocab.txt``
layout). `FastTokenizer` saves (the run's copy), loads, pickles and exports to the same tokenizer,
and `Tokenizer.load` tells the formats apart. The tokenizers are trained here from fixed texts by
the ``build_*`` functions (nothing is downloaded); transformers (no torch) saves and reads them."""

from __future__ import annotations

import io
import json
import os
import pickle

import numpy as np
import pytest

from jaxformer.convert.hf_io import find_tokenizer
from jaxformer.data.fast_tokenizer import FastTokenizer, has_tokenizer_files
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


def reference_ids(directory, texts=(SAMPLE,)) -> list[list[int]]:
    """transformers' ids of each of ``texts`` (no special tokens added)."""
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(directory)
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


@pytest.mark.parametrize("build", [build_llama2_tokenizer, build_llama3_tokenizer])
def test_ids_equal_transformers_on_a_multilingual_sample(build, tmp_path):
    directory = build(tmp_path / "tok")
    ours = Tokenizer.load(find_tokenizer(directory))
    ids = ours.encode(SAMPLE)
    assert [ids] == reference_ids(directory)
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


# --------------------------------------------------------------------------------------------------
# RoBERTa / BART (byte-level BPE) and BERT / DistilBERT (WordPiece), both layouts
ENCODER_CORPUS = ["The quick brown fox jumps over the lazy dog.", "Café déjà vu, naïve façade.",
          "北京欢迎你，上海也欢迎你。", "Привет, мир! Как дела?", "مرحبا بالعالم",
          "emoji 😀🎉 and   spaces\t\ttabs\nnewlines"] * 20
SAMPLES = ["Hello  world!\n\tThe   lazy fox…", "Café déjà vu — naïve façade", "北京欢迎你 😀🎉!",
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
    tok.train_from_iterator(ENCODER_CORPUS, trainers.BpeTrainer(
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
    tok.train_from_iterator(ENCODER_CORPUS, trainers.WordPieceTrainer(
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


@pytest.mark.parametrize("kind", list(BUILDERS))
@pytest.mark.parametrize("legacy", [False, True])
def test_ids_equal_transformers_and_survive_the_runs_copy(kind, legacy, tmp_path):
    path = BUILDERS[kind](tmp_path / "hf", legacy=legacy)
    assert has_tokenizer_files(path)
    want = reference_ids(path, SAMPLES)
    tok = Tokenizer.load(find_tokenizer(path))  # tokenizer.json, or the directory (legacy)
    assert isinstance(tok, FastTokenizer)
    assert [tok.encode(t) for t in SAMPLES] == want
    assert any(len(ids) > 1 for ids in want) and len({i for ids in want for i in ids}) > 20
    # the run's copy (<workdir>/tokenizer.model), a pickled one (Grain workers), an export
    tok.save(tmp_path / "tokenizer.model")
    for other in (Tokenizer.load(tmp_path / "tokenizer.model"), pickle.loads(pickle.dumps(tok))):
        assert [other.encode(t) for t in SAMPLES] == want
        assert other.special == tok.special
    tok.write_hf_files(tmp_path / "exported")
    assert reference_ids(tmp_path / "exported", SAMPLES) == want


def test_roles_decode_and_word_starts(tmp_path):
    bpe = Tokenizer.load(build_byte_level_bpe(tmp_path / "bpe"))
    s = bpe.special
    assert (s.bos_id, s.pad_id, s.eos_id, s.unk_id, s.mask_id, s.cls_id, s.sep_id) == (
        0, 1, 2, 3, 4, 0, 2)
    for text in SAMPLES[:-3]:  # byte-level BPE is lossless (the last texts hold a special token)
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
    tok.train_from_iterator(ENCODER_CORPUS, trainers.BpeTrainer(
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
