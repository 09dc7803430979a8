"""Reference points the transformers are compared with.

- `unigram_log_probs` + `perplexity_vs_unigram`: a unigram language model on the *same*
  tokenization — add-one (Laplace) smoothed token frequencies of the training split as the pipeline
  frames it (EOS included) — scored on exactly the positions the causal LM is scored on (every
  target of `jaxformer.objectives.prepare_clm`, i.e. each token after the first of its row segment).
- `ngram_logistic_regression`: bag of word uni+bigrams (TF-IDF, sublinear tf) with L2 logistic
  regression, the inverse regularisation C picked on the validation split (scikit-learn).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import ml_collections
import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression

from demo.common import eval_batches
from jaxformer.data.pipeline import make_dataset
from jaxformer.train.step import make_eval_step


def unigram_log_probs(trainer) -> np.ndarray:
    """log p(token) `[vocab]` from the training split's token counts, add-one smoothed over the
    tokenizer's ids: p(v) = (count(v) + 1) / (N + V)."""
    data_cfg = ml_collections.ConfigDict(trainer.config.data.to_dict())
    data_cfg.shuffle, data_cfg.batch_size, data_cfg.prefetch = False, 64, 0
    vocab = trainer.tokenizer.vocab_size
    counts = np.zeros(vocab, np.int64)
    it = iter(make_dataset(data_cfg, "train", trainer.tokenizer, seed=0, num_epochs=1,
                           objective=trainer.config.objective,
                           process_index=0, process_count=1))
    for batch in it:
        ids = np.asarray(batch["inputs"])[np.asarray(batch["inputs_segment_ids"]) != 0]
        counts += np.bincount(ids, minlength=vocab)
    probs = (counts + 1.0) / (counts.sum() + vocab)
    out = np.full(trainer.model_cfg.vocab_size, -np.inf)
    out[:vocab] = np.log(probs)
    return out


def perplexity_vs_unigram(trainer, params, split: str, log_probs: np.ndarray) -> dict:
    """Model and unigram perplexity over the same target positions of a full pass over ``split``.

    Both are exp(mean negative log-likelihood) over the positions weighted by the causal-LM
    objective (the model's numbers come from the trainer's own eval step).
    """
    eval_fn = jax.jit(make_eval_step(trainer.model, trainer.prepare))
    prepare = jax.jit(trainer.prepare)
    key = jax.random.key(0)
    model_nll = uni_nll = count = 0.0
    for batch in eval_batches(trainer, split):
        sums = eval_fn(params, batch, key)
        prepared = prepare(batch, key)
        targets, weights = np.asarray(prepared["targets"]), np.asarray(prepared["weights"])
        uni_nll -= float(np.sum(log_probs[targets] * weights))
        model_nll += float(sums["loss"])
        count += float(np.sum(weights))
        if abs(float(sums["weight"]) - float(np.sum(weights))) > 0.5:
            raise AssertionError("model and unigram scored different positions")
    model_ppl, uni_ppl = math.exp(model_nll / count), math.exp(uni_nll / count)
    return {"tokens": int(count), "model_perplexity": model_ppl, "unigram_perplexity": uni_ppl,
            "ratio": model_ppl / uni_ppl}


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
