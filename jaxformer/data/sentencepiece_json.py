"""A SentencePiece model (Kudo & Richardson 2018) as a `tokenizers.Tokenizer` (a ``tokenizer.json``),
in the behaviour of one of three readers of the same ``.model`` file (`STYLES`):

- ``"sentencepiece"``: SentencePiece's own ids, which `jaxformer.data.tokenizer.Tokenizer` gives;
  exports of runs whose tokenizer is a SentencePiece model. Unigram pieces keep their scores, BPE
  merges are rebuilt from the vocabulary (a merge's rank is the id of the piece it makes, as
  SentencePiece ranks them), text is split before each ``▁`` as SentencePiece splits words; byte
  fallback to ``<0x00>``…``<0xFF>``; the normalizer spec (precompiled character map,
  extra-whitespace removal, the dummy ``▁`` prefix, always added). Control pieces (pad, eos,
  ``[MASK]``, sentinels, …) are special tokens, which `tokenizers` matches where the text spells
  them (SentencePiece never produces them from text), and so is a byte piece written out.
- ``"albert"``: transformers' ``AlbertTokenizer`` on ALBERT's ``spiece.model``: ``\\`\\``` and
  ``''`` become ``"``, NFKD and accent stripping (unless ``keep_accents``), lowercasing
  (``do_lower_case``), the character map, then a ``▁`` before every whitespace-separated word.
- ``"llama"``: transformers' (5.x) ``LlamaTokenizer`` on a Llama / Mistral ``tokenizer.model``: no
  normalizer, spaces become ``▁`` and one ``▁`` is prepended unless the text starts with one
  (``Metaspace(prepend_scheme="first", split=False)``; "always" with ``legacy``), so a text
  starting with a space gets one ``▁`` less than SentencePiece gives it; BPE with byte fallback.

A directory holding such a model is read in the last two styles
(`jaxformer.data.fast_tokenizer.FastTokenizer.from_directory`), also when it holds a
``tokenizer.json`` (transformers 5's ``LlamaTokenizer`` builds its pipeline anew whatever that file
says), so a run whose tokenizer comes from an ALBERT or Llama checkpoint encodes as
``AutoTokenizer`` does.
"""

from __future__ import annotations

from sentencepiece import sentencepiece_model_pb2

STYLES = ("sentencepiece", "albert", "llama")
# sentencepiece ModelProto.SentencePiece.Type; TrainerSpec.ModelType
NORMAL, UNKNOWN, CONTROL, USER_DEFINED = 1, 2, 3, 4
UNIGRAM, BPE = 1, 2
_NEVER = -1e9  # score of pieces the segmentation must never choose from text
WORD_BOUNDARY = "\u2581"  # "▁"


def model_proto(proto_bytes: bytes):
    """The parsed ``ModelProto`` of a serialized SentencePiece model."""
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(proto_bytes)
    return proto


def unsupported_reason(proto_bytes: bytes, style: str = "sentencepiece") -> str | None:
    """Why the model cannot be written as an exact ``tokenizer.json`` of ``style``, or None if it
    can (transformers' styles read user-defined pieces as added tokens, and the ALBERT one skips a
    missing character map)."""
    proto = model_proto(proto_bytes)
    if proto.trainer_spec.model_type not in (UNIGRAM, BPE):
        return "only unigram and BPE SentencePiece models are converted (this one is neither)"
    if style != "sentencepiece":
        return None
    if any(p.type == USER_DEFINED for p in proto.pieces):
        return "user-defined pieces are not converted"
    if proto.normalizer_spec.name not in ("identity", "") and \
            not proto.normalizer_spec.precompiled_charsmap:
        return f"normalizer {proto.normalizer_spec.name!r} has no precompiled character map"
    return None


def bpe_merges(pieces: list[str]) -> list[tuple[str, str]]:
    """The merges of a SentencePiece BPE vocabulary (``pieces`` in id order): every split of a
    piece into two pieces, ranked by the id of the piece they make (SentencePiece learns pieces in
    merge order), then by the left and right parts' lengths (transformers' ``generate_merges``)."""
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = []
    for piece, rank in vocab.items():
        local = [(piece[:k], piece[k:]) for k in range(1, len(piece))
                 if piece[:k] in vocab and piece[k:] in vocab]
        merges += [(left, right, rank) for left, right in
                   sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]]))]
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])))
    return [(left, right) for left, right, _ in merges]


def sentencepiece_backend(proto_bytes: bytes, style: str = "sentencepiece", *,
                          do_lower_case: bool = True, keep_accents: bool = False,
                          add_prefix_space: bool = True, legacy: bool = False):
    """The `tokenizers.Tokenizer` that reads text as ``style`` (`STYLES`, module docstring) reads
    it with the SentencePiece model ``proto_bytes``; no post-processor (no special tokens added).
    The options of transformers' classes (``tokenizer_config.json``): ``do_lower_case`` and
    ``keep_accents`` (ALBERT's), ``add_prefix_space`` (False: no ``▁`` prepended) and ``legacy``
    (Llama's: ``prepend_scheme`` "always" instead of "first"). ValueError for a model
    `unsupported_reason` names or an unknown style."""
    from tokenizers import AddedToken, Tokenizer

    if style not in STYLES:
        raise ValueError(f"tokenizer style {style!r} is unknown; choose one of {STYLES}")
    reason = unsupported_reason(proto_bytes, style)
    if reason:
        raise ValueError(f"this SentencePiece model cannot be converted: {reason}")
    proto = model_proto(proto_bytes)
    tok = Tokenizer(_model(proto, style))
    prepend = "never" if not add_prefix_space else (
        "first" if style == "llama" and not legacy else "always")
    _pipeline(tok, proto, style, do_lower_case, keep_accents, prepend)
    specials = [p.piece for p in proto.pieces
                if p.type == CONTROL or (style != "sentencepiece" and p.type == UNKNOWN)]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.add_tokens([AddedToken(p.piece, special=False, normalized=False)  # transformers' styles
                    for p in proto.pieces if p.type == USER_DEFINED])
    return tok


def _model(proto, style: str):
    from tokenizers import models

    pieces = [p.piece for p in proto.pieces]
    unk = next(i for i, p in enumerate(proto.pieces) if p.type == UNKNOWN)
    byte_fallback = proto.trainer_spec.byte_fallback
    if proto.trainer_spec.model_type == BPE:
        return models.BPE({p: i for i, p in enumerate(pieces)}, bpe_merges(pieces),
                          unk_token=pieces[unk], fuse_unk=True, byte_fallback=byte_fallback)
    if style == "sentencepiece":  # only normal pieces segment text; byte pieces by fallback alone
        scores = [p.score if p.type == NORMAL else _NEVER for p in proto.pieces]
    else:  # transformers keeps the file's scores
        scores = [p.score for p in proto.pieces]
    return models.Unigram(list(zip(pieces, scores)), unk_id=unk,
                          byte_fallback=byte_fallback and style != "albert")


def _pipeline(tok, proto, style: str, do_lower_case: bool, keep_accents: bool, prepend: str
              ) -> None:
    """Normalizer, pre-tokenizer and decoder of ``style`` (``prepend``: the ``▁`` prefix's
    ``Metaspace`` scheme, transformers' styles)."""
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers

    spec, w = proto.normalizer_spec, WORD_BOUNDARY
    charsmap = [normalizers.Precompiled(spec.precompiled_charsmap)] \
        if spec.precompiled_charsmap else []
    if style == "albert":
        steps = [normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
        steps += [] if keep_accents else [normalizers.NFKD(), normalizers.StripAccents()]
        steps += [normalizers.Lowercase()] if do_lower_case else []
        tok.normalizer = normalizers.Sequence(steps + charsmap)
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(w, prepend_scheme=prepend)])
        tok.decoder = decoders.Metaspace(w, prepend_scheme=prepend)
        return
    if style == "llama":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(w, prepend_scheme=prepend, split=False)
        tok.decoder = decoders.Sequence(
            [decoders.Replace(w, " "), decoders.ByteFallback(), decoders.Fuse()]
            + ([decoders.Strip(" ", 1, 0)] if prepend != "never" else []))
        return
    steps = list(charsmap)
    if spec.remove_extra_whitespaces:
        steps += [normalizers.Strip(left=True, right=True), normalizers.Replace(Regex(" {2,}"), " ")]
    if spec.add_dummy_prefix:
        steps.append(normalizers.Prepend(w))
    if spec.escape_whitespaces:
        steps.append(normalizers.Replace(" ", w))
    tok.normalizer = normalizers.Sequence(steps)
    if proto.trainer_spec.model_type == BPE:  # SentencePiece merges within words only
        tok.pre_tokenizer = pre_tokenizers.Split(w, behavior="merged_with_next")
    tok.decoder = decoders.Sequence(
        [decoders.Replace(w, " "), decoders.ByteFallback(), decoders.Fuse()]
        + ([decoders.Strip(" ", 1, 0)] if spec.add_dummy_prefix else []))
