"""Our SentencePiece model as a Hugging Face fast tokenizer (``tokenizer.json``), for exports.

transformers' GPT-2 (byte-level BPE) and BERT (WordPiece) tokenizer classes cannot read a
SentencePiece model, and its generic SentencePiece converter drops byte fallback.
`write_fast_tokenizer` rebuilds the model with the `tokenizers` library piece for piece: the
unigram vocabulary and scores, byte fallback to the pieces ``<0x00>``…``<0xFF>``, the normalizer
spec (precompiled character map, extra-whitespace removal, the dummy ``▁`` prefix). So
``AutoTokenizer.from_pretrained`` on the export gives the ids `jaxformer.data.tokenizer.Tokenizer`
gives (tested on held-out text of the built-in corpora). Two differences remain, both for text
that spells a piece's name: control pieces (pad, eos, ``[MASK]``, sentinels, …) are special
tokens, which transformers matches where they are written in the text, and so is a byte piece
written out (``"<0x41>"``); SentencePiece produces neither from text.
"""

from __future__ import annotations

import json
import os

from sentencepiece import sentencepiece_model_pb2

# sentencepiece ModelProto.SentencePiece.Type
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED = 1, 2, 3, 4
_NEVER = -1e9  # score of pieces the segmentation must never choose from text


def _model_proto(spm_path: str | os.PathLike):
    proto = sentencepiece_model_pb2.ModelProto()
    with open(spm_path, "rb") as f:
        proto.ParseFromString(f.read())
    return proto


def fast_tokenizer_reason(spm_path: str | os.PathLike) -> str | None:
    """Why ``spm_path`` cannot be written as an exact fast tokenizer, or None if it can."""
    return _reason(_model_proto(spm_path))


def _reason(proto) -> str | None:
    if proto.trainer_spec.model_type != 1:  # BPE stores no merges to rebuild
        return "only unigram SentencePiece models are converted (this one is not)"
    if any(p.type == _USER_DEFINED for p in proto.pieces):
        return "user-defined pieces are not converted"
    if proto.normalizer_spec.name not in ("identity", "") and \
            not proto.normalizer_spec.precompiled_charsmap:
        return f"normalizer {proto.normalizer_spec.name!r} has no precompiled character map"
    return None


def build_fast_tokenizer(spm_path: str | os.PathLike):
    """The `tokenizers.Tokenizer` equivalent of a unigram SentencePiece model (see module doc)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers

    proto = _model_proto(spm_path)
    reason = _reason(proto)
    if reason:
        raise ValueError(f"{spm_path}: {reason}")
    # Only normal pieces segment text; byte pieces are reached by byte fallback alone (by name)
    vocab = [(p.piece, p.score if p.type == _NORMAL else _NEVER) for p in proto.pieces]
    unk = next(i for i, p in enumerate(proto.pieces) if p.type == _UNKNOWN)
    tok = Tokenizer(models.Unigram(vocab, unk_id=unk,
                                   byte_fallback=proto.trainer_spec.byte_fallback))
    spec, steps = proto.normalizer_spec, []
    if spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(spec.precompiled_charsmap))
    if spec.remove_extra_whitespaces:
        steps += [normalizers.Strip(left=True, right=True),
                  normalizers.Replace(Regex(" {2,}"), " ")]
    if spec.add_dummy_prefix:
        steps.append(normalizers.Prepend("▁"))
    if spec.escape_whitespaces:
        steps.append(normalizers.Replace(" ", "▁"))
    tok.normalizer = normalizers.Sequence(steps)
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        + ([decoders.Strip(" ", 1, 0)] if spec.add_dummy_prefix else []))
    tok.add_special_tokens([AddedToken(p.piece, special=True, normalized=False)
                            for p in proto.pieces if p.type == _CONTROL])
    return tok


def write_fast_tokenizer(spm_path: str | os.PathLike, directory: str | os.PathLike,
                         special) -> list[str]:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` (``PreTrainedTokenizerFast``, with
    the pad / eos / bos / unk / mask / cls / sep tokens of ``special``, a `SpecialTokens`) into
    ``directory``; returns the names written."""
    tok = build_fast_tokenizer(spm_path)
    tok.save(os.path.join(directory, "tokenizer.json"))
    names = {"pad_token": special.pad_id, "eos_token": special.eos_id,
             "bos_token": special.bos_id, "unk_token": special.unk_id,
             "mask_token": special.mask_id, "cls_token": special.cls_id,
             "sep_token": special.sep_id}
    config = {"tokenizer_class": "PreTrainedTokenizerFast",
              **{k: tok.id_to_token(i) for k, i in names.items() if i >= 0}}
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return ["tokenizer.json", "tokenizer_config.json"]
