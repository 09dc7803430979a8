"""A Hugging Face tokenizer (the `tokenizers` library) behind the interface of
`jaxformer.data.tokenizer.Tokenizer`: the tokenizer a pretrained checkpoint came with.

RoBERTa and BART ship byte-level BPE (``tokenizer.json``, or the older ``vocab.json`` +
``merges.txt``), BERT and DistilBERT WordPiece (``tokenizer.json`` or ``vocab.txt``). Training,
evaluation, prediction and generation use it unchanged: `FastTokenizer.encode` gives the ids
``AutoTokenizer.from_pretrained(dir)(text, add_special_tokens=False)`` gives (the pipeline frames
sequences itself, with the roles of `special`), and `decode` inverts it.

The roles (pad, eos, bos, unk, mask, cls, sep) are read from ``tokenizer_config.json`` /
``special_tokens_map.json``; a role the directory does not name is -1 (BERT has no eos), as for
SentencePiece models, except padding, which is EOS when only that is named (GPT-2). A run stores the
tokenizer it used as ``<workdir>/tokenizer.model`` like a SentencePiece model: one JSON document
(`save`) holding ``tokenizer.json`` and the roles, which `jaxformer.data.tokenizer.Tokenizer.load`
recognises; `save_hf` writes it back as Hugging Face files for an export.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

import numpy as np

from jaxformer.data.vocab import SpecialTokens

FORMAT_KEY = "jaxformer_fast_tokenizer"  # marks a stored FastTokenizer (`save`)
ROLES = ("pad", "eos", "bos", "unk", "mask", "cls", "sep")
# Files a Hugging Face directory may hold it in, by preference.
TOKENIZER_JSON, BPE_FILES, WORDPIECE_FILE = "tokenizer.json", ("vocab.json", "merges.txt"), "vocab.txt"


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise ValueError("reading a Hugging Face tokenizer needs the `tokenizers` package "
                         "(pip install tokenizers)") from None
    return tokenizers


def is_stored(data: bytes) -> bool:
    """Whether ``data`` (a file's bytes) is a `FastTokenizer` stored by `save` (a SentencePiece
    model proto never starts with ``{``)."""
    return data[:1] == b"{" and FORMAT_KEY.encode() in data[:4096]


def has_tokenizer_files(directory: str | os.PathLike) -> bool:
    """Whether ``directory`` holds a Hugging Face tokenizer `FastTokenizer.from_directory` reads."""
    d = os.fspath(directory)
    return os.path.isdir(d) and (
        os.path.isfile(os.path.join(d, TOKENIZER_JSON))
        or all(os.path.isfile(os.path.join(d, f)) for f in BPE_FILES)
        or os.path.isfile(os.path.join(d, WORDPIECE_FILE)))


def _read_json(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _role_tokens(directory: str) -> dict[str, str]:
    """{role: token text} from ``special_tokens_map.json`` and ``tokenizer_config.json`` (values
    are strings or ``{"content": ...}`` AddedToken dicts)."""
    out = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        doc = _read_json(os.path.join(directory, name))
        for role in ROLES:
            v = doc.get(f"{role}_token")
            if isinstance(v, dict):
                v = v.get("content")
            if isinstance(v, str):
                out[role] = v
    return out


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
    unk = "[UNK]"
    tok = t.Tokenizer(t.models.WordPiece.from_file(os.path.join(directory, WORDPIECE_FILE),
                                                   unk_token=unk))
    tok.normalizer = t.normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                  strip_accents=None, lowercase=lowercase)
    tok.pre_tokenizer = t.pre_tokenizers.BertPreTokenizer()
    tok.decoder = t.decoders.WordPiece(prefix="##")
    tok.add_special_tokens([t.AddedToken(s, special=True) for s in specials])
    return tok


class FastTokenizer:
    """A `tokenizers.Tokenizer` with named special roles; the methods of
    `jaxformer.data.tokenizer.Tokenizer`. Picklable (for Grain worker processes)."""

    def __init__(self, tokenizer_json: str, roles: dict[str, str]):
        roles = dict(roles)
        if "pad" not in roles and "eos" in roles:  # GPT-2 names none: pad with EOS, as HF users do
            roles["pad"] = roles["eos"]
        self._json, self._roles = tokenizer_json, roles
        self._tok = _tokenizers().Tokenizer.from_str(tokenizer_json)
        self._tok.no_truncation()  # as transformers does for a call without truncation/padding
        self._tok.no_padding()
        unknown = {r: s for r, s in self._roles.items() if self._tok.token_to_id(s) is None}
        if unknown:
            raise ValueError(f"the tokenizer's special tokens {unknown} are not in its vocabulary")
        ids = {f"{r}_id": self._id(r) for r in ROLES}
        self.special = SpecialTokens(vocab_size=self.vocab_size, sentinel_ids=(), **ids)

    def _id(self, role: str) -> int:
        token = self._roles.get(role)
        return -1 if token is None else int(self._tok.token_to_id(token))

    # ----------------------------------------------------------------------------------------------
    @classmethod
    def from_directory(cls, directory: str | os.PathLike) -> FastTokenizer:
        """The tokenizer of a Hugging Face model directory (see the module docstring)."""
        d = os.fspath(directory)
        roles = _role_tokens(d)
        if os.path.isfile(os.path.join(d, TOKENIZER_JSON)):
            with open(os.path.join(d, TOKENIZER_JSON), encoding="utf-8") as f:
                return cls(f.read(), roles)
        config = _read_json(os.path.join(d, "tokenizer_config.json"))
        if all(os.path.isfile(os.path.join(d, f)) for f in BPE_FILES):
            roles = {"bos": "<s>", "eos": "</s>", "unk": "<unk>", "sep": "</s>", "cls": "<s>",
                     "pad": "<pad>", "mask": "<mask>", **roles}  # RobertaTokenizer's defaults
            tok = _byte_level_bpe(d, dict.fromkeys(roles.values()))
        elif os.path.isfile(os.path.join(d, WORDPIECE_FILE)):
            roles = {"unk": "[UNK]", "sep": "[SEP]", "pad": "[PAD]", "cls": "[CLS]",
                     "mask": "[MASK]", **roles}  # BertTokenizer's defaults
            tok = _wordpiece(d, dict.fromkeys(roles.values()), config.get("do_lower_case", True))
        else:
            raise ValueError(f"{d!r} holds no Hugging Face tokenizer: expected {TOKENIZER_JSON}, "
                             f"{' + '.join(BPE_FILES)} or {WORDPIECE_FILE}")
        return cls(tok.to_str(), roles)

    @classmethod
    def from_bytes(cls, data: bytes) -> FastTokenizer:
        """A tokenizer stored by `save`."""
        doc = json.loads(data.decode("utf-8"))
        return cls(json.dumps(doc["tokenizer"], ensure_ascii=False), doc["roles"])

    @classmethod
    def load_stored(cls, path: str | os.PathLike) -> FastTokenizer:
        """A tokenizer `save` wrote to ``path``."""
        with open(path, "rb") as f:
            return cls.from_bytes(f.read())

    def to_bytes(self) -> bytes:
        doc = {FORMAT_KEY: 1, "roles": self._roles, "tokenizer": json.loads(self._json)}
        return json.dumps(doc, ensure_ascii=False, sort_keys=True).encode("utf-8")

    def save(self, path: str | os.PathLike) -> None:
        """Write `to_bytes` to ``path`` (atomically, as `Tokenizer.save`)."""
        path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(self.to_bytes())
        os.replace(tmp, path)

    def save_hf(self, directory: str | os.PathLike) -> list[str]:
        """Write ``tokenizer.json`` and ``tokenizer_config.json`` (``PreTrainedTokenizerFast``
        with the special roles) into ``directory``; returns the names written."""
        d = os.fspath(directory)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, TOKENIZER_JSON), "w", encoding="utf-8") as f:
            f.write(self._json)
        config = {"tokenizer_class": "PreTrainedTokenizerFast",
                  **{f"{r}_token": s for r, s in self._roles.items()}}
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(config, f, indent=2)
        return [TOKENIZER_JSON, "tokenizer_config.json"]

    # ----------------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of ids (added tokens included): ids are ``0 .. vocab_size - 1``."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Text → ids, no special tokens added (the pipeline frames sequences)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_with_offsets(self, text: str) -> tuple[list[int], np.ndarray]:
        """Text → (ids, character offsets `[n, 2]` int32 into ``text``), as
        `Tokenizer.encode_with_offsets`: whitespace a piece absorbs is left out of its span."""
        enc = self._tok.encode(text, add_special_tokens=False)
        offsets = np.zeros((len(enc.ids), 2), np.int32)
        for i, (start, end) in enumerate(enc.offsets):
            while start < end and text[start].isspace() and not text[start:end].isspace():
                start += 1
            offsets[i] = start, end
        return list(enc.ids), offsets

    def decode(self, ids: Iterable[int]) -> str:
        """Ids → text, stopping at the first EOS, skipping padding and other special tokens."""
        out = []
        for i in ids:
            i = int(i)
            if i == self.special.eos_id:
                break
            if i == self.special.pad_id:
                continue
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} is out of range for a vocabulary of "
                                 f"{self.vocab_size}")
            out.append(i)
        return self._tok.decode(out, skip_special_tokens=True)

    def id_to_piece(self, i: int) -> str:
        return self._tok.id_to_token(int(i))

    def word_initial(self) -> np.ndarray:
        """Bool `[vocab_size]`: the tokens that begin a word, for whole-word masking. WordPiece:
        those without the ``##`` continuation prefix; byte-level BPE / SentencePiece-style: those
        starting with ``Ġ`` / ``▁`` (a space before them). Special tokens are False."""
        vocab = sorted(self._tok.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
        special = set(self.special.all_special)
        model = json.loads(self._json)["model"]
        if model.get("type") == "WordPiece":
            prefix = model.get("continuing_subword_prefix", "##")
            starts = [not t.startswith(prefix) for t, _ in vocab]
        else:
            starts = [t.startswith(("\u0120", "\u2581")) for t, _ in vocab]
        out = np.zeros(self.vocab_size, bool)
        for (_, i), s in zip(vocab, starts):
            out[i] = s and i not in special
        return out

    def __getstate__(self):
        return {"data": self.to_bytes()}

    def __setstate__(self, state):
        other = FastTokenizer.from_bytes(state["data"])
        self.__init__(other._json, other._roles)

    def __repr__(self) -> str:
        return f"FastTokenizer(vocab_size={self.vocab_size}, special={self.special})"
