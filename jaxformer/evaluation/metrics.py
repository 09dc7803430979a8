"""Scores of a run's predictions: classification (per-class precision/recall/F1, the confusion
matrix) and generated text (BLEU, chrF, exact match). Used by ``python -m jaxformer.cli.evaluate`` and
by the trainer's in-training sequence evaluation (``eval.generate_examples``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import sacrebleu


def classification_report(labels: Sequence[int] | np.ndarray, predictions: Sequence[int] | np.ndarray,
                          num_classes: int, label_names: Sequence[str] | None = None
                          ) -> dict[str, Any]:
    """Accuracy, per-class precision / recall / F1, macro F1 and the confusion matrix.

    Args:
      labels, predictions: `[N]` int class indices in ``[0, num_classes)``.
      num_classes: C, the classifier's classes (rows and columns of the matrix).
      label_names: C names (default ``"0"``, ``"1"``, …).

    Returns:
      ``{"accuracy", "macro_f1", "per_class": [{"name", "precision", "recall", "f1", "support"}],
      "confusion": [C][C] ints (row = true class, column = predicted)}``. A ratio whose denominator
      is 0 (a class never predicted, or absent) is 0.0, as scikit-learn's ``zero_division=0``; macro
      F1 is the unweighted mean of the C per-class F1 (van Rijsbergen's F1 = 2PR / (P + R)).
    """
    labels, predictions = np.asarray(labels, np.int64), np.asarray(predictions, np.int64)
    if labels.shape != predictions.shape or labels.ndim != 1:
        raise ValueError(f"labels {labels.shape} and predictions {predictions.shape} must be two "
                         "[N] arrays")
    for what, x in (("label", labels), ("prediction", predictions)):
        if x.size and (x.min() < 0 or x.max() >= num_classes):
            raise ValueError(f"a {what} lies outside [0, num_classes={num_classes}): "
                             f"{sorted(set(x[(x < 0) | (x >= num_classes)].tolist()))[:5]}")
    names = [str(n) for n in label_names] if label_names else [str(i) for i in range(num_classes)]
    if len(names) != num_classes:
        raise ValueError(f"{len(names)} label_names {names} for num_classes={num_classes}")
    confusion = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(confusion, (labels, predictions), 1)
    true_pos = np.diag(confusion).astype(np.float64)
    predicted, support = confusion.sum(axis=0), confusion.sum(axis=1)
    precision = np.divide(true_pos, predicted, out=np.zeros(num_classes), where=predicted > 0)
    recall = np.divide(true_pos, support, out=np.zeros(num_classes), where=support > 0)
    denom = precision + recall
    f1 = np.divide(2 * precision * recall, denom, out=np.zeros(num_classes), where=denom > 0)
    per_class = [{"name": names[c], "precision": float(precision[c]), "recall": float(recall[c]),
                  "f1": float(f1[c]), "support": int(support[c])} for c in range(num_classes)]
    return {"accuracy": float(true_pos.sum() / max(labels.size, 1)), "macro_f1": float(f1.mean()),
            "per_class": per_class, "confusion": confusion.tolist()}


def exact_match(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Fraction (0–1) of hypotheses equal to their reference once leading/trailing whitespace is
    stripped (SQuAD-style EM without its lower-casing and punctuation removal)."""
    _check_pairs(hypotheses, references)
    return float(np.mean([h.strip() == r.strip() for h, r in zip(hypotheses, references)]))


def sequence_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, Any]:
    """Corpus BLEU (Papineni et al. 2002) and chrF (Popović 2015) by sacrebleu with its defaults
    (13a tokenization, exponential smoothing; chrF n=6, β=2), both on sacrebleu's 0–100 scale, and
    `exact_match` (0–1); one reference per hypothesis.

    Returns ``{"bleu", "chrf", "exact_match", "length_ratio" (hypothesis / reference length in
    BLEU tokens), "bleu_signature", "bleu_detail" (sacrebleu's one-line summary)}``.
    """
    _check_pairs(hypotheses, references)
    metric = sacrebleu.BLEU()
    bleu = metric.corpus_score(list(hypotheses), [list(references)])
    chrf = sacrebleu.CHRF().corpus_score(list(hypotheses), [list(references)])
    return {"bleu": float(bleu.score), "chrf": float(chrf.score),
            "exact_match": exact_match(hypotheses, references),
            "length_ratio": bleu.sys_len / max(bleu.ref_len, 1),
            "bleu_signature": str(metric.get_signature()), "bleu_detail": str(bleu)}


def _check_pairs(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    if isinstance(hypotheses, str) or isinstance(references, str):
        raise ValueError("hypotheses and references must be lists of strings, not one string")
    if len(hypotheses) != len(references) or not len(hypotheses):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references: need "
                         "one reference per hypothesis, and at least one")
