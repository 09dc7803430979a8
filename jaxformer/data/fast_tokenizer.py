"""A Hugging Face ``tokenizer.json`` (the `tokenizers` library) behind `Tokenizer`'s interface.

Checkpoints whose tokenizer is no SentencePiece model — Llama 3 and Qwen2 (byte-level BPE),
GPT-2 / RoBERTa / BART (byte-level BPE), BERT (WordPiece) — ship a ``tokenizer.json``, which the
`tokenizers` library runs exactly as transformers' fast tokenizers do. `FastTokenizer` wraps it:
``encode`` adds no special tokens (the pipeline frames sequences, as with SentencePiece),
``decode`` stops at EOS and drops special tokens. The roles of the special tokens (which is EOS,
BOS, pad, …) are not in ``tokenizer.json``; they are read from the directory's
``tokenizer_config.json`` / ``special_tokens_map.json``, else the ids in ``config.json``.

A run stores the tokenizer as one file (`FastTokenizer.save`: JSON holding the ``tokenizer.json``
and the special ids), under the name a SentencePiece run uses (``<workdir>/tokenizer.model``);
`jaxformer.data.tokenizer.Tokenizer.load` tells the two formats apart by content, so resuming,
evaluation, prediction and generation read either.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping

import numpy as np

from jaxformer.data.vocab import SpecialTokens

FORMAT = "jaxformer.fast_tokenizer"  # the ``format`` entry of a saved FastTokenizer
# SpecialTokens field → the tokenizer_config.json / special_tokens_map.json key naming its token
ROLES = {"pad_id": "pad_token", "eos_id": "eos_token", "bos_id": "bos_token",
         "unk_id": "unk_token", "mask_id": "mask_token", "cls_id": "cls_token",
         "sep_id": "sep_token"}
WORD_START = ("\u2581", "\u0120")  # SentencePiece's "▁", byte-level BPE's "Ġ"


def is_saved_fast_tokenizer(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a JSON file (a saved `FastTokenizer` or a ``tokenizer.json``), not a
    SentencePiece model (a protobuf)."""
    with open(path, "rb") as f:
        return f.read(1) == b"{"


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


class FastTokenizer:
    """`Tokenizer`'s interface over a `tokenizers.Tokenizer` with the special ids ``special``."""

    def __init__(self, tokenizer_json: str, special: Mapping[str, int]):
        try:
            from tokenizers import Tokenizer as _Backend
        except ImportError:  # pragma: no cover - a dependency of jaxformer and of transformers
            raise ValueError("reading a Hugging Face tokenizer.json needs the `tokenizers` "
                             "package (pip install tokenizers)") from None
        self._json = tokenizer_json
        self._tok = _Backend.from_str(tokenizer_json)
        self._special_ids = dict(special)
        self.special = SpecialTokens(vocab_size=self.vocab_size, sentinel_ids=(),
                                     **{k: int(special.get(k, -1)) for k in ROLES})

    # ----------------------------------------------------------------------------------------------
    @classmethod
    def from_directory(cls, directory: str | os.PathLike) -> FastTokenizer:
        """The ``tokenizer.json`` of a Hugging Face model directory, its special tokens' roles from
        ``tokenizer_config.json`` / ``special_tokens_map.json`` (else ``config.json``'s ids)."""
        d = os.fspath(directory)
        path = os.path.join(d, "tokenizer.json")
        if not os.path.isfile(path):
            raise ValueError(f"{d!r} has no tokenizer.json")
        with open(path, encoding="utf-8") as f:
            text = f.read()
        names = {**_read_json(os.path.join(d, "special_tokens_map.json")),
                 **_read_json(os.path.join(d, "tokenizer_config.json"))}
        model_config = _read_json(os.path.join(d, "config.json"))
        backend = cls(text, {})._tok
        special = {}
        for field, key in ROLES.items():
            token = _token_text(names.get(key))
            i = backend.token_to_id(token) if token is not None else None
            if i is None:
                i = model_config.get(f"{key}_id")
            if isinstance(i, list):  # e.g. Llama 3.1's eos_token_id [128001, 128008, 128009]
                i = i[0]
            if isinstance(i, int):
                special[field] = i
        return cls(text, special)

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

    def write_hf_files(self, directory: str | os.PathLike) -> list[str]:
        """``tokenizer.json`` and a ``tokenizer_config.json`` naming the special tokens, for
        ``AutoTokenizer.from_pretrained(directory)``; their names."""
        d = os.fspath(directory)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(self._json)
        config = {"tokenizer_class": "PreTrainedTokenizerFast"}
        for field, key in ROLES.items():
            i = self._special_ids.get(field, -1)
            if i >= 0:
                config[key] = self._tok.id_to_token(i)
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2)
        return ["tokenizer.json", "tokenizer_config.json"]

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
        return enc.ids, offsets

    def decode(self, ids: Iterable[int]) -> str:
        """Ids → text, stopping at the first EOS; special tokens are dropped."""
        out = []
        for i in ids:
            i = int(i)
            if i == self.special.eos_id:
                break
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} is out of range for a vocabulary of "
                                 f"{self.vocab_size}")
            out.append(i)
        return self._tok.decode(out, skip_special_tokens=True)

    def id_to_piece(self, i: int) -> str:
        return self._tok.id_to_token(int(i))

    def word_initial(self) -> np.ndarray:
        """Bool `[vocab_size]`: pieces that begin a word ("▁" / "Ġ" prefix; WordPiece: not "##")."""
        pieces = [self._tok.id_to_token(i) or "" for i in range(self.vocab_size)]
        if any(p.startswith("##") for p in pieces):
            return np.array([bool(p) and not p.startswith("##") for p in pieces], bool)
        return np.array([p.startswith(WORD_START) for p in pieces], bool)

    def __getstate__(self):
        return {"tokenizer": self._json, "special": self._special_ids}

    def __setstate__(self, state):
        self.__init__(state["tokenizer"], state["special"])

    def __repr__(self) -> str:
        return f"FastTokenizer(vocab_size={self.vocab_size}, special={self.special})"
