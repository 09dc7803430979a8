"""SentencePiece tokenizer (Kudo & Richardson 2018) with the layout of `SpecialTokens`.

Trained models reserve, in this order: ``<pad>`` 0, ``</s>`` (EOS) 1, ``<s>`` (BOS) 2, ``<unk>`` 3,
``[MASK]`` 4, ``[CLS]`` 5, ``[SEP]`` 6, ``<extra_id_0>`` … ``<extra_id_{S-1}>`` from 7 (T5
sentinels, Raffel et al. 2020), then the 256 byte pieces ``<0x00>``…``<0xFF>`` (``byte_fallback``:
characters never seen in training, e.g. emoji, become their UTF-8 bytes instead of ``<unk>``), then
the learned pieces. The specials after ``<unk>`` are *control* symbols: encoding ordinary text never
produces them (a literal "[MASK]" in text is spelled out); `Tokenizer.decode` renders them as "".

Training is deterministic (single thread; same texts and settings give a byte-identical ``.model``)
and, by default, lossless: ``normalization="identity"`` with whitespace kept, so
``decode(encode(text)) == text`` for any text. ``normalization="nmt_nfkc"`` gives the usual
T5/ALBERT NFKC normalisation and whitespace folding instead.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import os
import re
from collections.abc import Callable, Iterable

import ml_collections
import numpy as np
import sentencepiece as spm
from absl import logging

from jaxformer.data.fast_tokenizer import FastTokenizer, is_saved_fast_tokenizer
from jaxformer.settings import (
    VOCABULARY,
    at_least,
    config_dict,
    one_of,
    positive,
    section,
    setting,
)
from jaxformer.vocab import SpecialTokens

MODEL_TYPES = ("unigram", "bpe")
NORMALIZATIONS = ("identity", "nmt_nfkc", "nfkc")
NUM_BYTE_PIECES = 256
# Named specials after pad/eos/bos/unk, in id order (see module docstring).
NAMED_CONTROL = ("[MASK]", "[CLS]", "[SEP]")
# Training texts are cut to this many characters (SentencePiece skips longer "sentences").
MAX_TRAIN_CHARS = 16_384


def sentinel_piece(i: int) -> str:
    """The piece of T5 sentinel ``i``: ``<extra_id_{i}>``."""
    return f"<extra_id_{i}>"


@dataclasses.dataclass(frozen=True)
class TokenizerSettings:
    """``config.data.tokenizer``: the tokenizer a run loads or trains. Every key but ``path`` fixes
    the token ids of a run's checkpoints, so a resumed run may not change it (kind VOCABULARY)."""

    path: str = setting(
        "", "an existing SentencePiece .model to load ('' = train one on the train split, saved as "
        "<workdir>/tokenizer.model)")
    vocab_size: int = setting(
        8000, "pieces of a tokenizer to be trained (specials and sentinels included)",
        kind=VOCABULARY, check=positive)
    model_type: str = setting(
        "unigram", "SentencePiece model type of a tokenizer to be trained ('unigram' or 'bpe')",
        kind=VOCABULARY, check=one_of(*MODEL_TYPES))
    num_sentinels: int | None = setting(
        None, "T5 sentinel tokens to reserve; unset = min(100, vocab_size // 16)", kind=VOCABULARY,
        check=at_least(0))
    max_train_texts: int = setting(
        200_000, "cap on the texts fed to the tokenizer trainer", kind=VOCABULARY, check=positive)
    character_coverage: float = setting(
        0.9995, "SentencePiece character coverage (rarer characters become <unk>)", kind=VOCABULARY)
    normalization: str = setting(
        "identity", "'identity' (lossless) or 'nmt_nfkc' / 'nfkc'", kind=VOCABULARY,
        check=one_of(*NORMALIZATIONS))


def default_tokenizer_config() -> ml_collections.ConfigDict:
    """Defaults of ``data.tokenizer`` (`TokenizerSettings`)."""
    return config_dict(section(TokenizerSettings))


def resolve_num_sentinels(vocab_size: int, num_sentinels: int | None) -> int:
    """``num_sentinels``, or when None ``min(100, vocab_size // 16)`` (32 for 512 pieces)."""
    return min(100, vocab_size // 16) if num_sentinels is None else int(num_sentinels)


def _check_train_args(vocab_size, model_type, num_sentinels, character_coverage, normalization):
    if model_type not in MODEL_TYPES:
        raise ValueError(f"data.tokenizer.model_type={model_type!r} is invalid: choose one of "
                         f"{MODEL_TYPES}")
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"data.tokenizer.normalization={normalization!r} is invalid: choose one "
                         f"of {NORMALIZATIONS}")
    if num_sentinels < 0:
        raise ValueError(f"data.tokenizer.num_sentinels={num_sentinels} is invalid: must be >= 0")
    reserved = 4 + len(NAMED_CONTROL) + num_sentinels + NUM_BYTE_PIECES
    if vocab_size < reserved + 16:
        raise ValueError(
            f"data.tokenizer.vocab_size={vocab_size} is too small: {reserved} ids are reserved "
            f"(7 specials, {num_sentinels} sentinels, 256 byte pieces); use at least "
            f"{reserved + 16} or fewer sentinels")
    if not 0.0 < character_coverage <= 1.0:
        raise ValueError(f"data.tokenizer.character_coverage={character_coverage} is invalid: "
                         "must be in (0, 1]")


def train_sentencepiece(texts: Iterable[str], *, vocab_size: int, model_type: str = "unigram",
                        num_sentinels: int | None = None, character_coverage: float = 0.9995,
                        normalization: str = "identity") -> bytes:
    """Train a SentencePiece model on ``texts``; returns the serialized ``.model`` bytes.

    ``vocab_size`` is an upper bound (``hard_vocab_limit=False``): a corpus too small to support it
    yields a smaller vocabulary, with a warning. Empty texts are skipped; texts longer than
    `MAX_TRAIN_CHARS` characters are cut for training only.
    """
    num_sentinels_arg, num_sentinels = num_sentinels, resolve_num_sentinels(vocab_size,
                                                                            num_sentinels)
    _check_train_args(vocab_size, model_type, num_sentinels, character_coverage, normalization)
    source_errors: list[Exception] = []

    def sentences_of(texts):  # an error of the source (a bad record) ends the stream; it is
        try:                  # re-raised below as is, not as a SentencePiece failure
            yield from (t[:MAX_TRAIN_CHARS] for t in texts if t and not t.isspace())
        except Exception as e:  # noqa: BLE001 - re-raised after SentencePiece returns
            source_errors.append(e)

    sentences = sentences_of(texts)
    first = next(sentences, None)
    if source_errors:
        raise source_errors[0]
    if first is None:
        raise ValueError("cannot train a tokenizer on no text: texts_fn() yielded no non-empty "
                         "text")
    model = io.BytesIO()
    try:
        _train(model, itertools.chain([first], sentences), vocab_size, model_type, num_sentinels,
               character_coverage, normalization)
    except RuntimeError as e:  # SentencePiece reports bad settings as RuntimeError
        if source_errors:
            raise source_errors[0] from None
        short = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", str(e))
        if short:  # the reserved pieces plus every character the coverage keeps must fit
            need = _smallest_vocab(int(short.group(2)) - num_sentinels, num_sentinels_arg)
            raise ValueError(
                f"data.tokenizer.vocab_size={vocab_size} is too small for this corpus: its "
                f"reserved pieces (specials, sentinels, 256 byte pieces) and the characters "
                f"data.tokenizer.character_coverage={character_coverage} keeps need at least "
                f"{need}; raise vocab_size or lower character_coverage") from None
        raise ValueError(f"SentencePiece training failed for vocab_size={vocab_size}, "
                         f"model_type={model_type!r}: {e}") from e
    if source_errors:
        raise source_errors[0]
    tok = Tokenizer(model.getvalue())
    if tok.vocab_size < vocab_size:
        logging.warning("tokenizer: corpus supports only %d pieces (asked for %d)",
                        tok.vocab_size, vocab_size)
    return model.getvalue()


def _smallest_vocab(fixed: int, num_sentinels: int | None) -> int:
    """The smallest vocabulary holding ``fixed`` pieces plus its sentinels (whose default count
    grows with the vocabulary, `resolve_num_sentinels`)."""
    size = fixed
    while size < fixed + resolve_num_sentinels(size, num_sentinels):
        size += 1
    return size


def _train(model, sentences, vocab_size, model_type, num_sentinels, character_coverage,
           normalization):
    spm.SentencePieceTrainer.train(
        sentence_iterator=sentences, model_writer=model,
        vocab_size=vocab_size, model_type=model_type, character_coverage=character_coverage,
        byte_fallback=True, pad_id=0, eos_id=1, bos_id=2, unk_id=3,
        pad_piece="<pad>", eos_piece="</s>", bos_piece="<s>", unk_piece="<unk>",
        control_symbols=[*NAMED_CONTROL, *(sentinel_piece(i) for i in range(num_sentinels))],
        normalization_rule_name=normalization,
        remove_extra_whitespaces=normalization != "identity",
        hard_vocab_limit=False, num_threads=1, max_sentence_length=4 * MAX_TRAIN_CHARS,
        input_sentence_size=0, shuffle_input_sentence=False, minloglevel=2)


class Tokenizer:
    """A loaded SentencePiece model. Picklable (for Grain worker processes).

    ``special`` reads the ids by piece name, so any ``.model`` works: ids of specials the model
    lacks are -1 (e.g. a T5 model has no ``<s>``, ``[MASK]``, ``[CLS]``, ``[SEP]``) and
    ``sentinel_ids`` holds the consecutive ``<extra_id_0>``, ``<extra_id_1>``, … that exist (maybe
    none). Code needing an absent special (the pipeline's ``[CLS]`` framing, span corruption's
    sentinels) raises a ValueError naming it.
    """

    def __init__(self, model_proto: bytes):
        self._proto = bytes(model_proto)
        self._sp = spm.SentencePieceProcessor(model_proto=self._proto)
        self.special = self._read_special()

    def _piece_id(self, piece: str) -> int:
        i = self._sp.piece_to_id(piece)
        return i if self._sp.id_to_piece(i) == piece else -1

    def _read_special(self) -> SpecialTokens:
        sentinels = []
        while (i := self._piece_id(sentinel_piece(len(sentinels)))) >= 0:
            sentinels.append(i)
        return SpecialTokens(
            vocab_size=self.vocab_size, pad_id=self._sp.pad_id(), eos_id=self._sp.eos_id(),
            bos_id=self._sp.bos_id(), unk_id=self._sp.unk_id(), mask_id=self._piece_id("[MASK]"),
            cls_id=self._piece_id("[CLS]"), sep_id=self._piece_id("[SEP]"),
            sentinel_ids=tuple(sentinels))

    @property
    def model_proto(self) -> bytes:
        """The serialized SentencePiece model (the ``.model`` file's bytes)."""
        return self._proto

    @property
    def vocab_size(self) -> int:
        """Number of pieces (ids are ``0 .. vocab_size - 1``)."""
        return self._sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        """Text → piece ids (no BOS/EOS added; the pipeline frames sequences)."""
        return self._sp.encode(text, out_type=int)

    def encode_with_offsets(self, text: str) -> tuple[list[int], np.ndarray]:
        """Text → (piece ids, as `encode`; character offsets `[n, 2]` int32 into ``text``).

        Piece ``i`` covers ``text[offsets[i, 0]:offsets[i, 1]]``, less the whitespace a word-initial
        piece ("▁word") absorbs, so whole-word spans map back exactly (extractive QA). SentencePiece
        reports UTF-8 *byte* offsets; they are turned into character offsets here. Byte-fallback
        pieces of one character share its span: all but the last are empty (``start == end``).
        """
        proto = self._sp.encode(text, return_type="proto")
        char_of_byte = np.zeros(len(text.encode("utf-8")) + 1, np.int32)
        byte_starts = np.cumsum([0] + [len(c.encode("utf-8")) for c in text])
        char_of_byte[byte_starts] = np.arange(len(text) + 1)
        ids, offsets = [], np.zeros((len(proto.pieces), 2), np.int32)
        for i, piece in enumerate(proto.pieces):
            ids.append(piece.id)
            start, end = int(char_of_byte[piece.begin]), int(char_of_byte[piece.end])
            while start < end and text[start].isspace() and not text[start:end].isspace():
                start += 1
            offsets[i] = start, end
        return ids, offsets

    def decode(self, ids: Iterable[int]) -> str:
        """Ids → text, stopping at the first EOS, skipping padding; other specials render as ""."""
        return self._sp.decode(self.special.ids_to_decode(ids))

    def id_to_piece(self, i: int) -> str:
        return self._sp.id_to_piece(int(i))

    def word_initial(self) -> np.ndarray:
        """Bool `[vocab_size]`: the pieces that begin a word (sentencepiece's "▁" prefix), for
        whole-word masking; byte-fallback and other continuation pieces are False."""
        return np.array([self._sp.id_to_piece(i).startswith("\u2581")
                         for i in range(self.vocab_size)], bool)

    def save(self, path: str | os.PathLike) -> None:
        """Write the ``.model`` (atomically: concurrent writers of the same model are safe)."""
        path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(self._proto)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Tokenizer | FastTokenizer:
        """A SentencePiece ``.model``; or a Hugging Face tokenizer (the same methods,
        `jaxformer.data.fast_tokenizer.FastTokenizer`): a model directory's (``tokenizer.json``,
        ``vocab.json`` + ``merges.txt``, ``vocab.txt``), a ``tokenizer.json`` or a run's saved
        one (JSON, told from a SentencePiece model by content)."""
        if not os.path.exists(path):
            raise ValueError(f"tokenizer model {os.fspath(path)!r} does not exist")
        if os.path.isdir(path):
            return FastTokenizer.from_directory(path)
        if is_saved_fast_tokenizer(path):
            return FastTokenizer.load(path)
        with open(path, "rb") as f:
            return cls(f.read())

    def __getstate__(self):
        return {"model_proto": self._proto}

    def __setstate__(self, state):
        self.__init__(state["model_proto"])

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, special={self.special})"


def load_or_train_tokenizer(settings: TokenizerSettings, workdir: str | os.PathLike | None,
                            texts_fn: Callable[[], Iterable[str]], *, reuse_saved: bool = True
                            ) -> Tokenizer:
    """``settings.path`` if set; else ``<workdir>/tokenizer.model`` if present and ``reuse_saved``;
    else train on the first ``settings.max_train_texts`` texts of ``texts_fn()`` and save it there
    (the trainer reuses a saved one only when resuming: a run that failed before its first
    checkpoint must not leave a tokenizer that overrides the next run's config). ``workdir`` None:
    trained and returned only (the trainer saves it once the run's checks have passed).

    Training is deterministic, so several processes may each train and save the same model.
    """
    if settings.path:
        return Tokenizer.load(settings.path)
    path = None if workdir is None else os.path.join(os.fspath(workdir), "tokenizer.model")
    if path and reuse_saved and os.path.exists(path):
        logging.info("tokenizer: loading %s", path)
        return Tokenizer.load(path)
    if settings.max_train_texts <= 0:
        raise ValueError(f"data.tokenizer.max_train_texts={settings.max_train_texts} is invalid: "
                         "must be positive")
    logging.info("tokenizer: training %s (vocab %d) on up to %d texts", settings.model_type,
                 settings.vocab_size, settings.max_train_texts)
    proto = train_sentencepiece(
        itertools.islice(texts_fn(), settings.max_train_texts), vocab_size=settings.vocab_size,
        model_type=settings.model_type, num_sentinels=settings.num_sentinels,
        character_coverage=settings.character_coverage, normalization=settings.normalization)
    tok = Tokenizer(proto)
    if path:
        tok.save(path)
    return tok
