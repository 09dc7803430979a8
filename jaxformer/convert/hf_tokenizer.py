"""A run's tokenizer written for transformers: ``tokenizer.json`` + ``tokenizer_config.json``
(``PreTrainedTokenizerFast``), so ``AutoTokenizer.from_pretrained`` on an export gives the run's ids
for every architecture, the run's framing included.

A Hugging Face tokenizer (`jaxformer.data.fast_tokenizer.FastTokenizer`: BERT's, RoBERTa's,
ALBERT's, Llama's, … as the run read them) is written as it is; a SentencePiece model is written
as ``spiece.model`` and rebuilt piece for piece as a ``tokenizer.json`` with SentencePiece's own ids
(`jaxformer.data.sentencepiece_json`, style "sentencepiece": unigram or BPE, byte fallback, the
normalizer spec), since transformers' GPT-2 and BERT classes cannot read SentencePiece, its
generic converter drops byte fallback and its T5 class appends 100 sentinels of its own. The
post-processor adds what the run put around a text (``framing``: ``[CLS] … [SEP]``, ``<s> … </s>``,
``… </s>``), so ``tokenizer(text)`` with its default ``add_special_tokens=True`` gives the run's
rows. Two differences remain, both for text that spells a piece's name: control pieces (pad, eos,
``[MASK]``, sentinels, …) are special tokens, which transformers matches where they are written in
the text, and so is a byte piece written out (``"<0x41>"``); SentencePiece produces neither from
text.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from jaxformer.data.fast_tokenizer import FastTokenizer
from jaxformer.data.sentencepiece_json import unsupported_reason
from jaxformer.data.tokenizer import Tokenizer

log = logging.getLogger(__name__)
SPIECE = "spiece.model"


def write_hf_tokenizer(tokenizer: Tokenizer | FastTokenizer, directory: str | os.PathLike,
                       framing: tuple[Sequence[int], Sequence[int]] | None = None) -> list[str]:
    """Write ``tokenizer`` into ``directory`` (module docstring); returns the names written.
    ``framing``: the (prefix, suffix) ids the post-processor adds around a text; None keeps a Hugging
    Face tokenizer's own post-processor (a SentencePiece model's adds nothing). A SentencePiece
    model that cannot be rebuilt exactly (`unsupported_reason`) is written as ``spiece.model`` alone,
    with a warning."""
    d = os.fspath(directory)
    os.makedirs(d, exist_ok=True)
    names = []
    if isinstance(tokenizer, Tokenizer):
        tokenizer.save(os.path.join(d, SPIECE))
        names.append(SPIECE)
        reason = unsupported_reason(tokenizer.model_proto)
        if reason:
            log.warning("no tokenizer.json written: %s", reason)
            return names
        tokenizer = FastTokenizer.from_sentencepiece(tokenizer.model_proto, tokenizer.special)
    if framing is not None:
        tokenizer = tokenizer.framed(*framing)
    return names + tokenizer.write_hf_files(d)
