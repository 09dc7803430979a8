"""SentencePiece tokenizer: lossless round trips, reserved special ids, determinism, loading."""

import dataclasses
import io
import pickle
import re

import numpy as np
import pytest
import sentencepiece as spm

from jaxformer.data.tokenizer import (
    Tokenizer,
    TokenizerSettings,
    load_or_train_tokenizer,
    resolve_num_sentinels,
    train_sentencepiece,
)
from jaxformer.vocab import SpecialTokens

ENGLISH = """It was the best of times, it was the worst of times, it was the age of wisdom, it was
the age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the
season of Light, it was the season of Darkness, it was the spring of hope, it was the winter of
despair. Call me Ishmael. Some years ago, never mind how long precisely, having little or no money
in my purse, and nothing particular to interest me on shore, I thought I would sail about a little
and see the watery part of the world. The quick brown fox jumps over the lazy dog; 12 dogs, 3.5
cats! Attention is all you need: the Transformer relies entirely on self-attention to compute
representations of its input and output without using sequence-aligned recurrent networks."""
SPANISH = """En un lugar de la Mancha, de cuyo nombre no quiero acordarme, no ha mucho tiempo que
vivía un hidalgo de los de lanza en astillero, adarga antigua, rocín flaco y galgo corredor.
¿Qué pasó después? El niño comió una manzana en la montaña y bebió café con azúcar.
Señor, ¡qué día más bonito! La canción del corazón habló de la nación y de la razón."""
CORPUS = [line.strip() for line in (ENGLISH + "\n" + SPANISH).splitlines()] * 3


@pytest.fixture(scope="module", params=["unigram", "bpe"])
def tok(request):
    return Tokenizer(train_sentencepiece(CORPUS, vocab_size=600, model_type=request.param))


@pytest.mark.parametrize("text", [
    "It was the age of wisdom, it was the winter of despair.",
    "¿Qué pasó después? El niño comió una manzana en la montaña.",
    "Unseen: 😀🚀 日本語 Ωμέγα ß \t tabs,  double  spaces\nand a newline ",
    "literal specials stay text: [MASK] [CLS] [SEP] <extra_id_0> </s> <pad> <unk>",
])
def test_round_trip_is_lossless(tok, text):
    ids = tok.encode(text)
    assert all(isinstance(i, int) for i in ids)
    assert tok.decode(ids) == text
    assert tok.decode(np.asarray(ids, np.int32)) == text


def test_unseen_characters_use_byte_pieces(tok):
    s = tok.special
    first_byte = 7 + len(s.sentinel_ids)
    ids = tok.encode("😀")
    assert s.unk_id not in ids
    # "😀" is F0 9F 98 80 in UTF-8: four byte pieces after the (optional) word-boundary piece.
    byte_ids = [i for i in ids if first_byte <= i < first_byte + 256]
    assert [i - first_byte for i in byte_ids] == list("😀".encode())
    assert [tok.id_to_piece(i) for i in byte_ids] == ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]


def test_special_ids_are_reserved_and_never_encoded(tok):
    n = resolve_num_sentinels(600, None)
    assert n == 37
    assert tok.special == SpecialTokens(vocab_size=tok.vocab_size,
                                        sentinel_ids=tuple(range(7, 7 + n)))
    pieces = ["<pad>", "</s>", "<s>", "<unk>", "[MASK]", "[CLS]", "[SEP]"]
    assert [tok.id_to_piece(i) for i in range(7)] == pieces
    assert [tok.id_to_piece(i) for i in tok.special.sentinel_ids] == [
        f"<extra_id_{i}>" for i in range(n)]
    text = " ".join(CORPUS) + " [MASK] [CLS] [SEP] <extra_id_0> <extra_id_3> </s> <s> <pad> 😀"
    ids = np.asarray(tok.encode(text))
    assert ids.min() >= tok.special.num_special  # no special (nor unk) from ordinary text
    assert ids.max() < tok.vocab_size


def test_decode_stops_at_eos_and_skips_padding(tok):
    s = tok.special
    a, b = tok.encode("Call me Ishmael."), tok.encode("Some years ago")
    assert tok.decode([s.pad_id, *a, s.pad_id, s.eos_id, *b]) == "Call me Ishmael."
    with pytest.raises(ValueError, match="out of range"):
        tok.decode([tok.vocab_size])


def test_training_is_deterministic(tmp_path):
    cfg = TokenizerSettings(vocab_size=600)
    paths = []
    for d in ("a", "b"):
        load_or_train_tokenizer(cfg, tmp_path / d, lambda: iter(CORPUS))
        paths.append(tmp_path / d / "tokenizer.model")
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert paths[0].read_bytes() == train_sentencepiece(CORPUS, vocab_size=600)


def test_load_or_train_prefers_path_then_workdir(tmp_path):
    cfg = TokenizerSettings(vocab_size=500, max_train_texts=10)
    calls = []

    def texts():
        calls.append(1)
        return iter(CORPUS)

    trained = load_or_train_tokenizer(cfg, tmp_path, texts)
    assert calls == [1] and (tmp_path / "tokenizer.model").exists()
    # The cap: trained on the first 10 texts only, exactly as training on them directly.
    assert (tmp_path / "tokenizer.model").read_bytes() == train_sentencepiece(
        CORPUS[:10], vocab_size=500)
    again = load_or_train_tokenizer(cfg, tmp_path, texts)  # reused, not retrained
    assert calls == [1] and again.encode(ENGLISH) == trained.encode(ENGLISH)

    other = Tokenizer(train_sentencepiece(CORPUS, vocab_size=700, num_sentinels=5))
    other.save(tmp_path / "other.model")
    cfg = dataclasses.replace(cfg, path=str(tmp_path / "other.model"))
    loaded = load_or_train_tokenizer(cfg, tmp_path, texts)
    assert calls == [1] and loaded.encode(SPANISH) == other.encode(SPANISH)
    assert loaded.special.sentinel_ids == (7, 8, 9, 10, 11)
    assert loaded.id_to_piece(12) == "<0x00>"


def test_load_or_train_reads_every_training_setting(tmp_path):
    """Each `TokenizerSettings` field reaches the trainer as set (the normalization included: it was
    once read with a second default): the model equals ``train_sentencepiece`` given the same."""
    settings = TokenizerSettings(vocab_size=520, model_type="bpe", num_sentinels=3,
                                 max_train_texts=12, character_coverage=1.0, normalization="nfkc")
    load_or_train_tokenizer(settings, tmp_path, lambda: iter(CORPUS))
    assert (tmp_path / "tokenizer.model").read_bytes() == train_sentencepiece(
        CORPUS[:12], vocab_size=520, model_type="bpe", num_sentinels=3, character_coverage=1.0,
        normalization="nfkc")
    assert (tmp_path / "tokenizer.model").read_bytes() != train_sentencepiece(
        CORPUS[:12], vocab_size=520, model_type="bpe", num_sentinels=3, character_coverage=1.0)


def test_load_an_arbitrary_sentencepiece_model(tmp_path):
    """A model with SentencePiece's default layout (unk 0, bos 1, eos 2, no pad, no extras)."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS), model_writer=model,
                                   vocab_size=200, num_threads=1, minloglevel=2)
    (tmp_path / "plain.model").write_bytes(model.getvalue())
    tok = Tokenizer.load(tmp_path / "plain.model")
    assert tok.special == SpecialTokens(vocab_size=200, pad_id=-1, eos_id=2, bos_id=1, unk_id=0,
                                        mask_id=-1, cls_id=-1, sep_id=-1, sentinel_ids=())
    ids = tok.encode("it was the age of wisdom")
    assert tok.decode([*ids, 2, *ids]) == "it was the age of wisdom"
    with pytest.raises(ValueError, match="does not exist"):
        Tokenizer.load(tmp_path / "missing.model")


def test_pickle_round_trip(tok):
    again = pickle.loads(pickle.dumps(tok))
    assert again.special == tok.special and again.encode(SPANISH) == tok.encode(SPANISH)


@pytest.mark.parametrize("kwargs, match", [
    (dict(vocab_size=280), "too small"),
    (dict(vocab_size=600, model_type="wordpiece"), "model_type"),
    (dict(vocab_size=600, normalization="nfd"), "normalization"),
    (dict(vocab_size=600, num_sentinels=-1), "num_sentinels"),
])
def test_bad_settings_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        train_sentencepiece(CORPUS, **kwargs)


def test_a_vocabulary_too_small_for_the_corpus_names_the_size_that_fits():
    """Our up-front check counts only the reserved pieces; SentencePiece also needs every kept
    character. Its refusal is re-worded with the minimum, and that minimum is exact."""
    with pytest.raises(ValueError, match=r"vocab_size=300 is too small for this corpus: .* need "
                                         r"at least (\d+); raise vocab_size") as e:
        train_sentencepiece(CORPUS, vocab_size=300)
    need = int(re.search(r"at least (\d+)", str(e.value)).group(1))
    assert need > 300
    assert Tokenizer(train_sentencepiece(CORPUS, vocab_size=need)).vocab_size <= need
    with pytest.raises(ValueError, match=f"at least {need}"):
        train_sentencepiece(CORPUS, vocab_size=need - 1)


def test_no_text_raises(tmp_path):
    with pytest.raises(ValueError, match="no non-empty text"):
        load_or_train_tokenizer(TokenizerSettings(), tmp_path, lambda: iter(["", "  "]))


@pytest.mark.parametrize("bad_at", [0, 20])
def test_an_error_of_the_text_source_is_raised_as_is(bad_at):
    """A bad record met while the tokenizer trains is the source's own error (naming the record),
    not a "SentencePiece training failed" wrapper around it."""
    def texts():
        for i, line in enumerate(CORPUS):
            if i == bad_at:
                raise ValueError("reviews.tsv:21: label 'meh' is not one of data.label_names")
            yield line

    with pytest.raises(ValueError, match=r"^reviews.tsv:21: label 'meh'"):
        train_sentencepiece(texts(), vocab_size=600)
