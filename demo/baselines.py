"""Reference points the transformers are compared with.

- `ngram_logistic_regression`: bag of word uni+bigrams (TF-IDF, sublinear tf) with L2 logistic
  regression, the inverse regularisation C picked on the validation split (scikit-learn).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression


def ngram_logistic_regression(train: Sequence[dict], validation: Sequence[dict],
                              test: Sequence[dict], *, ngram_range: tuple[int, int] = (1, 2),
                              cs: Sequence[float] = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)) -> dict:
    """Train on ``train`` records ({"text", "label"}), pick C by validation accuracy, report
    validation and test accuracy of that C."""
    def xy(records):
        return [r["text"] for r in records], np.array([r["label"] for r in records])

    (xt, yt), (xv, yv), (xs, ys) = xy(train), xy(validation), xy(test)
    vec = TfidfVectorizer(ngram_range=ngram_range, sublinear_tf=True, lowercase=True)
    ft = vec.fit_transform(xt)
    fv, fs = vec.transform(xv), vec.transform(xs)
    best = None
    for c in cs:
        clf = LogisticRegression(C=c, solver="liblinear").fit(ft, yt)
        acc = float(np.mean(clf.predict(fv) == yv))
        if best is None or acc > best[0]:
            best = (acc, c, clf)
    acc, c, clf = best
    return {"validation_accuracy": acc, "test_accuracy": float(np.mean(clf.predict(fs) == ys)),
            "C": c, "ngram_range": list(ngram_range), "train_examples": len(train)}
