"""Cloze classification through the pretrained MLM head (PET; Schick & Schütze 2021, "Exploiting
Cloze Questions for Few Shot Text Classification and Natural Language Inference", EACL, §3).

A pattern turns each row ``[CLS] text [SEP]`` into ``[CLS] text before [MASK] after [SEP]``
(``objective.cloze_pattern = "It was <mask>."``) and a verbalizer names one word per class, in label
order (``objective.verbalizers = "bad,good"``). The class score is the MLM logit of the class's
word at the row's [MASK] (eq. 1, ``s_p(l | x) = M(v(l) | P(x))``); the softmax runs over the
label words only (eq. 2) and the loss is its cross-entropy. So fine-tuning starts from the head that
pretraining trained (BERT's dense + activation + norm, the tied decoder and its bias), not from a
fresh classifier, and ``init_from`` a pretraining run initialises every parameter.

The words and the pattern are tokenized once, on the host, with the run's tokenizer
(`resolve_cloze`); the pattern is inserted into the rows on the device (`insert_pattern`), inside
the jitted step. The train and eval steps read the class logits with `class_logits`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jaxformer.config import ModelConfig
from jaxformer.objectives._common import require
from jaxformer.settings import setting
from jaxformer.vocab import SpecialTokens

Array = jnp.ndarray
MASK_PLACEHOLDER = "<mask>"


@dataclasses.dataclass(frozen=True)
class ClozeOptions:
    """The ``objective.*`` options of objective ``cloze`` (PET, Schick & Schütze 2021)."""

    cloze_pattern: str = setting(
        "It was <mask>.", f"cloze: text appended to each sentence, with one {MASK_PLACEHOLDER} where "
        "the model predicts the class's word (PET, Schick & Schütze 2021)")
    verbalizers: str = setting(
        "", "cloze: one word per class, in label order, comma-separated (e.g. 'bad,good'); each must "
        "be a single piece of the tokenizer in the pattern")


@dataclasses.dataclass(frozen=True)
class ClozeIds:
    """The pattern and the label words as token ids of one tokenizer.

    Attributes:
      before: the pattern's pieces before the [MASK] (`[p]`).
      after: its pieces after the [MASK] (`[q]`).
      label_ids: the id of each class's word at the [MASK] (`[C]`, in label order).
    """

    before: tuple[int, ...]
    after: tuple[int, ...]
    label_ids: tuple[int, ...]


def verbalizer_words(options: ClozeOptions) -> list[str]:
    """``objective.verbalizers`` split at commas (blank entries kept, so they can be refused)."""
    text = options.verbalizers
    return [w.strip() for w in text.split(",")] if text.strip() else []


def check_cloze_options(options: ClozeOptions, num_classes: int | None = None
                        ) -> tuple[str, list[str]]:
    """(pattern, words) of ``options``; ValueError naming the field when the
    pattern lacks exactly one placeholder or the words are not distinct (at least two; with
    ``num_classes``, exactly that many)."""
    pattern = options.cloze_pattern
    if not isinstance(pattern, str) or pattern.count(MASK_PLACEHOLDER) != 1:
        raise ValueError(f"objective.cloze_pattern={pattern!r} must hold {MASK_PLACEHOLDER!r} "
                         "exactly once, where the class's word goes (e.g. 'It was <mask>.')")
    words = verbalizer_words(options)
    count = len(words) if num_classes is None else num_classes
    if (len(words) != count or len(words) < 2 or not all(words)
            or len(set(words)) != len(words)):
        classes = "" if num_classes is None else f" (model.num_classes={num_classes})"
        raise ValueError(f"objective.verbalizers={options.verbalizers!r} must name "
                         f"one distinct word per class{classes}, in label order, comma-separated, "
                         "e.g. 'bad,good'")
    return pattern, words


def check_cloze_config(options: ClozeOptions, framing: str, model_cfg: ModelConfig) -> None:
    """Objective 'cloze' with ``options`` needs an encoder with the MLM head, ``[CLS] text [SEP]``
    rows (``data.framing`` = ``framing``, '' = unset) and valid options (`check_cloze_options`);
    ValueError naming the field, before compiling."""
    if model_cfg.family != "encoder" or model_cfg.head != "mlm":
        raise ValueError(f"objective.name='cloze' reads the MLM head's logits: model.family="
                         f"{model_cfg.family!r} and model.head={model_cfg.head!r} must be "
                         "'encoder' and 'mlm'")
    framing = framing or "cls_sep"
    if framing != "cls_sep":
        raise ValueError(f"data.framing={framing!r}: objective 'cloze' inserts its pattern into "
                         "[CLS] text [SEP] rows; set data.framing='cls_sep' (or leave it unset)")
    check_cloze_options(options, model_cfg.num_classes)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text)) if text.strip() else []


def resolve_cloze(options: ClozeOptions, tokenizer: Any) -> dict[str, ClozeIds]:
    """``{"cloze": ClozeIds}`` of ``options`` for ``tokenizer``.

    The pattern is tokenized filled with each word, as the model read such text in pretraining
    (sentencepiece's word-initial "▁great", a "." glued to the word before it): the pieces before
    the word are those of the text before the placeholder, the word must be one piece, and the
    pieces after it must be the same for every word. ValueError naming ``objective.verbalizers``
    (the word and its pieces) or ``objective.cloze_pattern`` otherwise.
    """
    if tokenizer is None:
        raise ValueError("objective 'cloze' needs the run's tokenizer: "
                         "bind_objective(..., tokenizer=tokenizer)")
    pattern, words = check_cloze_options(options)
    head, tail = pattern.split(MASK_PLACEHOLDER)
    before = _encode(tokenizer, head.rstrip())
    filled = [_encode(tokenizer, head + w + tail) for w in words]
    for w, ids in zip(words, filled):
        if ids[:len(before)] != before:
            raise ValueError(f"objective.cloze_pattern={pattern!r}: its text before "
                             f"{MASK_PLACEHOLDER} tokenizes differently when followed by {w!r}; "
                             f"end that text at a word boundary (a space before {MASK_PLACEHOLDER})")
    # The pieces after the word: the longest suffix shared by every filled pattern, leaving at least
    # one piece for each word.
    q = min(len(ids) - len(before) - 1 for ids in filled)
    while q > 0 and len({tuple(ids[len(ids) - q:]) for ids in filled}) > 1:
        q -= 1
    label_ids = []
    for w, ids in zip(words, filled):
        middle = ids[len(before):len(ids) - q]
        if len(middle) != 1:
            pieces = [tokenizer.id_to_piece(i) for i in middle]
            raise ValueError(f"objective.verbalizers: {w!r} is not a single piece of the tokenizer "
                             f"in objective.cloze_pattern={pattern!r} (it tokenizes as {pieces}); "
                             "choose a word the tokenizer holds whole")
        label_ids.append(middle[0])
    after = filled[0][len(filled[0]) - q:] if q else []
    if any(tuple(ids[len(ids) - q:] if q else []) != tuple(after) for ids in filled):
        raise ValueError(f"objective.cloze_pattern={pattern!r}: its text after {MASK_PLACEHOLDER} "
                         "tokenizes differently after different words")
    return {"cloze": ClozeIds(tuple(before), tuple(after), tuple(label_ids))}


def insert_pattern(tokens: Array, pattern: Sequence[int] | Array, pad_id: int
                   ) -> tuple[Array, Array]:
    """``[CLS] t_1 … t_n [SEP] pad…`` rows → ``[CLS] t_1 … t_m pattern [SEP] pad…``.

    Args:
      tokens: `[B, L]` int32 rows, one example each (first and last non-padding tokens are the
        framing's), padding at the end; an all-padding row stays all padding.
      pattern: `[k]` int32 ids (the pattern with its [MASK]).

    Returns:
      (rows `[B, L]`, lengths `[B]` of their non-padding parts). ``m = min(n, L - 2 - k)``: a long
      row loses the end of its text, never the pattern or the closing token.
    """
    pattern = jnp.asarray(pattern, jnp.int32)
    length, k = tokens.shape[1], pattern.shape[0]
    n_in = jnp.sum(tokens != pad_id, axis=1)
    text = jnp.clip(jnp.minimum(n_in - 2, length - 2 - k), 0, None)  # m [B]
    j = jnp.arange(length)[None, :]
    m = text[:, None]
    closing = jnp.take_along_axis(tokens, jnp.maximum(n_in - 1, 0)[:, None], axis=1)
    out = jnp.where(j <= m, tokens, pattern[jnp.clip(j - 1 - m, 0, k - 1)])
    out = jnp.where(j == m + 1 + k, closing, out)
    out = jnp.where((j > m + 1 + k) | (n_in[:, None] == 0), pad_id, out)
    return out.astype(jnp.int32), jnp.where(n_in > 0, text + 2 + k, 0)


def prepare_cloze(batch: Mapping[str, Array], rng: jax.Array, special: SpecialTokens,
                  options: ClozeOptions | None = None, cloze: ClozeIds | None = None) -> dict:
    """Batch ``inputs`` `[B, L]` (``[CLS] text [SEP]`` rows), ``label`` `[B]` → ``model_inputs``
    {tokens (pattern inserted), positions, segment_ids}, ``targets`` `[B]` = label, ``weights``
    `[B]` (0 for all-padding rows), ``class_positions`` `[B]` (each row's [MASK]) and
    ``class_token_ids`` `[C]` (the label words): `class_logits` reads the model's `[B, L, V]` MLM
    logits there. ``cloze`` comes from `resolve_cloze` (the trainer binds it)."""
    del rng, options  # read on the host: `resolve_cloze` made ``cloze``
    if cloze is None:
        raise ValueError("objective 'cloze' needs its pattern and words as token ids: bind it with "
                         "the tokenizer (bind_objective(..., tokenizer=tokenizer))")
    require(batch, "cloze", "inputs", "label")
    if "inputs_token_types" in batch:
        raise ValueError("objective 'cloze' takes one sentence per row, not sentence pairs")
    tokens = jnp.asarray(batch["inputs"], jnp.int32)
    pattern = (*cloze.before, special.mask_id, *cloze.after)
    if len(pattern) + 2 > tokens.shape[1]:
        raise ValueError(f"objective.cloze_pattern takes {len(pattern)} tokens: with [CLS] and "
                         f"[SEP] it does not fit rows of data.seq_len={tokens.shape[1]}")
    rows, lengths = insert_pattern(tokens, pattern, special.pad_id)
    label = jnp.asarray(batch["label"], jnp.int32)
    j = jnp.arange(rows.shape[1])[None, :]
    segment_ids = (j < lengths[:, None]).astype(jnp.int32)
    mask_at = jnp.maximum(lengths - 2 - len(cloze.after), 0)  # [MASK] before `after` and [SEP]
    return {"model_inputs": {"tokens": rows, "positions": jnp.broadcast_to(j, rows.shape),
                             "segment_ids": segment_ids},
            "targets": label, "weights": (lengths > 0).astype(jnp.float32),
            "class_positions": mask_at.astype(jnp.int32),
            "class_token_ids": jnp.asarray(cloze.label_ids, jnp.int32)}


def class_logits(logits: Array, prepared: Mapping[str, Array]) -> Array:
    """The class logits of a cloze batch: MLM logits `[B, L, V]` at ``class_positions`` `[B]`,
    columns ``class_token_ids`` `[C]` → `[B, C]` (PET eq. 1). Other objectives' logits are returned
    as they are."""
    if "class_positions" not in prepared:
        return logits
    at_mask = jnp.take_along_axis(logits, prepared["class_positions"][:, None, None], axis=1)[:, 0]
    return jnp.take(at_mask, prepared["class_token_ids"], axis=-1)


def predicts_labels(model_cfg: ModelConfig, objective_name: str) -> bool:
    """Whether the model's (class) logits predict one label per row: the classifier head, or the
    MLM head read as a cloze (objective 'cloze')."""
    return model_cfg.head == "classify" or objective_name == "cloze"
