"""A Hugging Face tokenizer (the `tokenizers` library) behind the interface of
`jaxformer.data.tokenizer.Tokenizer`: the tokenizer a pretrained checkpoint came with.

Checkpoints whose tokenizer is no SentencePiece model ship a ``tokenizer.json`` — Llama 3 and Qwen2,
GPT-2, RoBERTa and BART (byte-level BPE), BERT and DistilBERT (WordPiece) — or, older ones, the
slow tokenizer's files: ``vocab.json`` + ``merges.txt`` (byte-level BPE) or ``vocab.txt``
(WordPiece), which `FastTokenizer.from_directory` builds into the same fast tokenizer transformers'
converter builds. ALBERT and Llama checkpoints ship a SentencePiece model that
transformers does not read as SentencePiece does (ALBERT lowercases and strips accents; Llama gives a
leading space no extra ``▁``): their directories are read in transformers' way
(`jaxformer.data.sentencepiece_json`, `sentencepiece_style`). Mistral's name LlamaTokenizer, but
transformers 5 reads them with its generic backend (`GENERIC_MODEL_TYPES`): their
``tokenizer.json``. ``encode`` gives the ids
``AutoTokenizer.from_pretrained(dir)(text, add_special_tokens=False)`` gives (the pipeline frames
sequences itself, as with SentencePiece); ``decode`` stops at EOS and drops padding and other
special tokens.

The roles of the special tokens (pad, eos, bos, unk, mask, cls, sep) are not in ``tokenizer.json``;
they are read from ``tokenizer_config.json`` / ``special_tokens_map.json``, else the ids in
``config.json``, else the tokenizer class's defaults. A role nothing names is -1 (BERT has no eos,
Llama no padding), as for SentencePiece models, except padding, which is EOS when only that is named
and the tokenizer is no SentencePiece model (GPT-2).

A run stores the tokenizer as one file (`FastTokenizer.save`: JSON holding the ``tokenizer.json``
and the special ids), under the name a SentencePiece run uses (``<workdir>/tokenizer.model``);
`jaxformer.data.tokenizer.Tokenizer.load` tells the formats apart by content, so resuming,
evaluation, prediction and generation read either; `FastTokenizer.write_hf_files` writes it back as
Hugging Face files for an export, with a post-processor that frames text as the run framed its rows
(`FastTokenizer.framed`). `FastTokenizer.from_sentencepiece` gives a SentencePiece run's tokenizer
the same way out.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from jaxformer.data.sentencepiece_json import sentencepiece_backend
from jaxformer.vocab import SpecialTokens

FORMAT = "jaxformer.fast_tokenizer"  # the ``format`` entry of a saved FastTokenizer
# SpecialTokens field → the tokenizer_config.json / special_tokens_map.json key naming its token
ROLES = {"pad_id": "pad_token", "eos_id": "eos_token", "bos_id": "bos_token",
         "unk_id": "unk_token", "mask_id": "mask_token", "cls_id": "cls_token",
         "sep_id": "sep_token"}
WORD_START = ("\u2581", "\u0120")  # SentencePiece's "▁", byte-level BPE's "Ġ"
# Files a Hugging Face directory may hold its tokenizer in, by preference.
TOKENIZER_JSON, BPE_FILES, WORDPIECE_FILE = "tokenizer.json", ("vocab.json", "merges.txt"), "vocab.txt"
SENTENCEPIECE_FILES = ("spiece.model", "sentencepiece.bpe.model", "tokenizer.model")
# transformers' tokenizer classes that read a SentencePiece model their own way
# (`jaxformer.data.sentencepiece_json.STYLES`), by tokenizer_config.json's tokenizer_class, else by
# config.json's model_type
STYLE_OF_CLASS = {"AlbertTokenizer": "albert", "LlamaTokenizer": "llama"}
STYLE_OF_MODEL_TYPE = {"albert": "albert", "llama": "llama"}
# Model types whose tokenizer transformers 5 reads with its generic TokenizersBackend whatever
# tokenizer_config.json's class says (Mistral checkpoints name LlamaTokenizer; transformers'
# MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS): their tokenizer.json as written, else their
# SentencePiece model as SentencePiece reads it (a leading space keeps its own ``▁``).
GENERIC_MODEL_TYPES = ("mistral", "mixtral")
# their tokenizer_config.json options (`jaxformer.data.sentencepiece_json.sentencepiece_backend`)
SENTENCEPIECE_OPTIONS = ("do_lower_case", "keep_accents", "add_prefix_space", "legacy")
# The role tokens the slow tokenizer classes assume when the directory names none.
LEGACY_ROLES = {
    BPE_FILES: {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "sep_token": "</s>",
                "cls_token": "<s>", "pad_token": "<pad>", "mask_token": "<mask>"},  # RoBERTa's
    WORDPIECE_FILE: {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                     "cls_token": "[CLS]", "mask_token": "[MASK]"},  # BERT's
    "albert": {"pad_token": "<pad>", "unk_token": "<unk>", "cls_token": "[CLS]",
               "sep_token": "[SEP]", "mask_token": "[MASK]", "bos_token": "[CLS]",
               "eos_token": "[SEP]"},
    "llama": {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"},
}


def _tokenizers():
    try:
        import tokenizers
    except ImportError:  # pragma: no cover - a dependency of jaxformer and of transformers
        raise ValueError("reading a Hugging Face tokenizer needs the `tokenizers` package "
                         "(pip install tokenizers)") from None
    return tokenizers


def is_saved_fast_tokenizer(path: str | os.PathLike) -> bool:
    """Whether the file ``path`` is JSON (a saved `FastTokenizer` or a ``tokenizer.json``), not a
    SentencePiece model (a protobuf, which never starts with ``{``)."""
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        return f.read(1) == b"{"


def has_tokenizer_files(directory: str | os.PathLike) -> bool:
    """Whether ``directory`` holds a Hugging Face tokenizer `FastTokenizer.from_directory` reads."""
    return _layout(os.fspath(directory)) is not None


def sentencepiece_file(directory: str | os.PathLike) -> str | None:
    """Path of the SentencePiece model in ``directory`` (`SENTENCEPIECE_FILES`), else None."""
    for name in SENTENCEPIECE_FILES:
        path = os.path.join(os.fspath(directory), name)
        if os.path.isfile(path):
            return path
    return None


def sentencepiece_style(directory: str | os.PathLike) -> str | None:
    """"albert" / "llama" when ``directory`` holds a SentencePiece model that transformers reads
    with its ALBERT / Llama tokenizer class (`jaxformer.data.sentencepiece_json`), else None
    (T5's is read as SentencePiece reads it)."""
    d = os.fspath(directory)
    if sentencepiece_file(d) is None or read_generically(d):
        return None
    name = _read_json(os.path.join(d, "tokenizer_config.json")).get("tokenizer_class")
    if isinstance(name, str) and name:
        return STYLE_OF_CLASS.get(name.removesuffix("Fast"))
    return STYLE_OF_MODEL_TYPE.get(_read_json(os.path.join(d, "config.json")).get("model_type"))


def read_generically(directory: str | os.PathLike) -> bool:
    """Whether transformers reads ``directory``'s tokenizer with its generic backend, whatever
    class ``tokenizer_config.json`` names (`GENERIC_MODEL_TYPES`, by ``config.json``'s model type)."""
    config = _read_json(os.path.join(os.fspath(directory), "config.json"))
    return config.get("model_type") in GENERIC_MODEL_TYPES


def _layout(d: str) -> str | tuple[str, str] | None:
    """Which of the SentencePiece styles (`sentencepiece_style`), `TOKENIZER_JSON`, `BPE_FILES`,
    `WORDPIECE_FILE` the directory ``d`` holds first."""
    if style := sentencepiece_style(d):
        return style
    for layout in (TOKENIZER_JSON, BPE_FILES, WORDPIECE_FILE):
        names = layout if isinstance(layout, tuple) else (layout,)
        if os.path.isdir(d) and all(os.path.isfile(os.path.join(d, n)) for n in names):
            return layout
    return None


def _token_text(entry) -> str | None:
    """``"<s>"`` or ``{"content": "<s>", ...}`` (tokenizer_config.json's two spellings) → text."""
    if isinstance(entry, Mapping):
        return entry.get("content")
    return entry if isinstance(entry, str) else None


def _read_json(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _byte_level_bpe(directory: str, specials: Iterable[str]):
    """RoBERTa / BART / GPT-2's slow-tokenizer files as a fast byte-level BPE (the construction
    transformers' converter uses; no prefix space, RoBERTa's default)."""
    t = _tokenizers()
    vocab, merges = (os.path.join(directory, f) for f in BPE_FILES)
    tok = t.Tokenizer(t.models.BPE.from_file(vocab, merges))
    tok.pre_tokenizer = t.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = t.decoders.ByteLevel()
    tok.add_special_tokens([t.AddedToken(s, special=True) for s in specials])
    return tok


def _wordpiece(directory: str, specials: Iterable[str], lowercase: bool):
    """BERT / DistilBERT's ``vocab.txt`` as a fast WordPiece tokenizer (BERT's basic tokenizer:
    clean text, CJK characters split, lowercase and accent stripping when ``lowercase``)."""
    t = _tokenizers()
    tok = t.Tokenizer(t.models.WordPiece.from_file(os.path.join(directory, WORDPIECE_FILE),
                                                   unk_token="[UNK]"))
    tok.normalizer = t.normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                  strip_accents=None, lowercase=lowercase)
    tok.pre_tokenizer = t.pre_tokenizers.BertPreTokenizer()
    tok.decoder = t.decoders.WordPiece(prefix="##")
    tok.add_special_tokens([t.AddedToken(s, special=True) for s in specials])
    return tok


class FastTokenizer:
    """`Tokenizer`'s interface over a `tokenizers.Tokenizer` with the special ids ``special``
    (`SpecialTokens` field → id). Picklable (for Grain worker processes)."""

    def __init__(self, tokenizer_json: str, special: Mapping[str, int]):
        self._json = tokenizer_json
        self._tok = _tokenizers().Tokenizer.from_str(tokenizer_json)
        self._tok.no_truncation()  # as transformers does for a call without truncation/padding
        self._tok.no_padding()
        self._special_ids = {k: int(v) for k, v in special.items()}
        self.special = SpecialTokens(vocab_size=self.vocab_size, sentinel_ids=(),
                                     **{k: int(special.get(k, -1)) for k in ROLES})

    # ----------------------------------------------------------------------------------------------
    @classmethod
    def from_directory(cls, directory: str | os.PathLike) -> FastTokenizer:
        """The tokenizer of a Hugging Face model directory (see the module docstring)."""
        d = os.fspath(directory)
        layout = _layout(d)
        if layout is None:
            raise ValueError(f"{d!r} holds no Hugging Face tokenizer: expected {TOKENIZER_JSON}, "
                             f"{' + '.join(BPE_FILES)}, {WORDPIECE_FILE}, or the SentencePiece "
                             "model of an ALBERT or Llama checkpoint")
        config = _read_json(os.path.join(d, "tokenizer_config.json"))
        names = {k: _token_text(v) for k, v in {
            **_read_json(os.path.join(d, "special_tokens_map.json")), **config}.items()}
        names = {k: v for k, v in names.items() if k in ROLES.values() and v is not None}
        if layout == TOKENIZER_JSON:
            with open(os.path.join(d, TOKENIZER_JSON), encoding="utf-8") as f:
                text = f.read()
        elif layout in STYLE_OF_CLASS.values():  # an ALBERT / Llama SentencePiece model
            names = {**LEGACY_ROLES[layout], **names}
            with open(sentencepiece_file(d), "rb") as f:
                text = sentencepiece_backend(f.read(), layout, **{  # the class's options
                    k: bool(config[k]) for k in SENTENCEPIECE_OPTIONS if config.get(k) is not None
                }).to_str()
        else:
            names = {**LEGACY_ROLES[layout], **names}
            specials = dict.fromkeys(names.values())
            tok = (_byte_level_bpe(d, specials) if layout == BPE_FILES else
                   _wordpiece(d, specials, config.get("do_lower_case", True)))
            text = tok.to_str()
        return cls(text, _special_ids(cls(text, {})._tok, names,
                                      _read_json(os.path.join(d, "config.json")),
                                      pad_with_eos=layout != "llama"))

    @classmethod
    def from_sentencepiece(cls, proto_bytes: bytes, special: SpecialTokens) -> FastTokenizer:
        """The SentencePiece model ``proto_bytes`` with its ids (`jaxformer.data.sentencepiece_json`,
        style "sentencepiece") and its roles ``special`` (those >= 0)."""
        text = sentencepiece_backend(proto_bytes).to_str()
        return cls(text, {k: getattr(special, k) for k in ROLES if getattr(special, k) >= 0})

    @classmethod
    def load(cls, path: str | os.PathLike) -> FastTokenizer:
        """A file `save` wrote, or a ``tokenizer.json`` (roles from the files beside it)."""
        doc = _read_json(os.fspath(path))
        if doc.get("format") == FORMAT:
            return cls(doc["tokenizer"], doc["special"])
        return cls.from_directory(os.path.dirname(os.path.abspath(path)))

    def save(self, path: str | os.PathLike) -> None:
        """One JSON file: the ``tokenizer.json`` text and the special ids (atomically)."""
        path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"format": FORMAT, "special": self._special_ids, "tokenizer": self._json}, f)
        os.replace(tmp, path)

    def framed(self, prefix: Sequence[int], suffix: Sequence[int]) -> FastTokenizer:
        """A copy whose post-processor adds the ids ``prefix`` before a text and ``suffix`` after
        it (a pair: ``prefix A suffix B suffix``, B with token type 1), as a run frames its rows;
        what ``AutoTokenizer``'s ``add_special_tokens=True`` adds. Empty both: nothing added. A
        byte-level tokenizer keeps its offset trimming (RoBERTa's, GPT-2's ``ByteLevel`` step)."""
        t = _tokenizers()
        tok = t.Tokenizer.from_str(self._json)
        names = [self._tok.id_to_token(int(i)) for i in (*prefix, *suffix)]
        pre, suf = names[:len(prefix)], names[len(prefix):]
        template = t.processors.TemplateProcessing(
            single=[*pre, "$A:0", *suf], pair=[*pre, "$A:0", *suf, "$B:1", *(f"{n}:1" for n in suf)],
            special_tokens=[(n, self._tok.token_to_id(n)) for n in dict.fromkeys(names)])
        trim = _byte_level_step(json.loads(self._json).get("post_processor"))
        tok.post_processor = t.processors.Sequence([trim, template]) if trim else template
        return FastTokenizer(tok.to_str(), self._special_ids)

    def write_hf_files(self, directory: str | os.PathLike) -> list[str]:
        """``tokenizer.json`` and a ``tokenizer_config.json`` (``PreTrainedTokenizerFast``) naming
        the special tokens, for ``AutoTokenizer.from_pretrained(directory)``; their names. Roles
        the tokenizer lacks are left out."""
        d = os.fspath(directory)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, TOKENIZER_JSON), "w", encoding="utf-8") as f:
            f.write(self._json)
        config = {"tokenizer_class": "PreTrainedTokenizerFast"}
        for field, key in ROLES.items():
            i = self._special_ids.get(field, -1)
            if i >= 0:
                config[key] = self._tok.id_to_token(i)
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2)
        return [TOKENIZER_JSON, "tokenizer_config.json"]

    # ----------------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (ids are ``0 .. vocab_size - 1``)."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Text → ids, no special tokens added (the pipeline frames sequences)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_with_offsets(self, text: str) -> tuple[list[int], np.ndarray]:
        """(ids, character offsets `[n, 2]` int32 into ``text``) with the conventions of
        `Tokenizer.encode_with_offsets`: a word-initial piece's span leaves out the whitespace it
        absorbs; a character split over pieces (byte-level BPE cuts "ï" into two bytes, and
        `tokenizers` gives both pieces its span) belongs to the last of them, so the spans do not
        overlap."""
        enc = self._tok.encode(text, add_special_tokens=False)
        raw = np.asarray(enc.offsets, np.int32).reshape(-1, 2)
        offsets = raw.copy()
        for i, (start, end) in enumerate(raw):
            if i + 1 < len(raw) and raw[i + 1, 0] < end:
                end = max(raw[i + 1, 0], start)
            while start < end and text[start].isspace() and not text[start:end].isspace():
                start += 1
            offsets[i] = start, end
        return list(enc.ids), offsets

    def decode(self, ids: Iterable[int]) -> str:
        """Ids → text, stopping at the first EOS, skipping padding and other special tokens."""
        return self._tok.decode(self.special.ids_to_decode(ids), skip_special_tokens=True)

    def id_to_piece(self, i: int) -> str:
        return self._tok.id_to_token(int(i))

    def word_initial(self) -> np.ndarray:
        """Bool `[vocab_size]`: the pieces that begin a word, for whole-word masking. WordPiece:
        those without the ``##`` continuation prefix; byte-level BPE / SentencePiece-style: those
        starting with ``Ġ`` / ``▁`` (a space before them). Special tokens are False."""
        model = json.loads(self._json)["model"]
        pieces = [self._tok.id_to_token(i) or "" for i in range(self.vocab_size)]
        if model.get("type") == "WordPiece":
            prefix = model.get("continuing_subword_prefix") or "##"
            out = np.array([bool(p) and not p.startswith(prefix) for p in pieces], bool)
        else:
            out = np.array([p.startswith(WORD_START) for p in pieces], bool)
        out[[i for i in self.special.all_special if 0 <= i < self.vocab_size]] = False
        return out

    def __getstate__(self):
        return {"tokenizer": self._json, "special": self._special_ids}

    def __setstate__(self, state):
        self.__init__(state["tokenizer"], state["special"])

    def __repr__(self) -> str:
        return f"FastTokenizer(vocab_size={self.vocab_size}, special={self.special})"


def _byte_level_step(post_processor: Mapping | None):
    """The ``ByteLevel`` offset-trimming step of a post-processor (RoBERTa's ``RobertaProcessing``
    holds its options), as a `tokenizers.processors.ByteLevel`; None without one."""
    steps = (post_processor or {}).get("processors") or [post_processor or {}]
    for step in steps:
        if step.get("type") in ("ByteLevel", "RobertaProcessing"):
            return _tokenizers().processors.ByteLevel(
                add_prefix_space=step.get("add_prefix_space", False),
                trim_offsets=step.get("trim_offsets", True))
    return None


def _special_ids(backend, names: Mapping[str, str], model_config: Mapping, *,
                 pad_with_eos: bool = True) -> dict[str, int]:
    """{`SpecialTokens` field: id} of the role tokens ``names`` (tokenizer_config.json key →
    text) in ``backend``'s vocabulary, else ``model_config``'s ``<role>_token_id``; padding is EOS
    when nothing names it and ``pad_with_eos``."""
    special = {}
    for field, key in ROLES.items():
        token = names.get(key)
        i = backend.token_to_id(token) if token is not None else None
        if i is None:
            i = model_config.get(f"{key}_id")
        if isinstance(i, list):  # e.g. Llama 3.1's eos_token_id [128001, 128008, 128009]
            i = i[0]
        if isinstance(i, int) and i >= 0:
            special[field] = i
    if pad_with_eos and "pad_id" not in special and "eos_id" in special:  # GPT-2: pad with EOS
        special["pad_id"] = special["eos_id"]
    return special
