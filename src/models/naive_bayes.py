"""Multinomial naive Bayes over a bag of words: the baseline a fine-tuned Transformer must beat.

A text is its word counts x_w (words: lowercase runs of letters, digits and apostrophes). Naive
Bayes assumes the words independent given the class C_k (Bishop, Deep Learning sec. 12.2.1), so

    p(C_k | x) ∝ p(C_k) Π_w p(w | C_k)^{x_w},

with p(C_k) the class frequencies of the training texts and p(w | C_k) the word frequencies
within class k smoothed additively (Laplace for alpha = 1):

    p(w | C_k) = (n_kw + alpha) / (Σ_v n_kv + alpha V),

V being the training vocabulary; words outside it are ignored. Everything is computed in log
space, one sparse (texts × vocabulary) count matrix times the (classes × vocabulary) log
likelihoods.

    nb = NaiveBayes(alpha=1.0).fit(dm.texts("train"), dm.labels("train"))
    evaluate(nb.predict(dm.texts("test")), dm.labels("test"), dm.model_kwargs["num_classes"])
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp
import torch

WORD = re.compile(r"[a-z0-9']+")


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


class NaiveBayes:
    """Multinomial naive Bayes with additive smoothing `alpha`; labels may be any sortable
    values (`classes_` holds them in column order of `predict_log_proba`)."""

    def __init__(self, alpha: float = 1.0):
        if alpha <= 0:
            raise ValueError(f"alpha={alpha} must be positive (zero counts would give log 0)")
        self.alpha = alpha
        self.vocab: dict[str, int] = {}

    def counts(self, texts: Sequence[str]) -> sp.csr_matrix:
        """Word counts (texts × vocabulary), words outside the vocabulary dropped."""
        rows, cols = [], []
        for i, text in enumerate(texts):
            ids = [self.vocab[w] for w in words(text) if w in self.vocab]
            rows += [i] * len(ids)
            cols += ids
        data = np.ones(len(rows), dtype=np.float64)
        return sp.csr_matrix((data, (rows, cols)), shape=(len(texts), len(self.vocab)))

    def fit(self, texts: Sequence[str], labels: Sequence) -> NaiveBayes:
        if len(texts) != len(labels) or not texts:
            raise ValueError(f"{len(texts)} texts and {len(labels)} labels: need as many, > 0")
        self.vocab = {}
        for text in texts:
            for w in words(text):
                self.vocab.setdefault(w, len(self.vocab))
        self.classes_, y = np.unique(np.asarray(labels), return_inverse=True)
        onehot = sp.csr_matrix(
            (np.ones(len(y)), (y, np.arange(len(y)))), shape=(len(self.classes_), len(y))
        )
        n_kw = np.asarray((onehot @ self.counts(texts)).todense())  # (K, V) word counts per class
        smoothed = n_kw + self.alpha
        self.log_likelihood = np.log(smoothed) - np.log(smoothed.sum(1, keepdims=True))
        self.log_prior = np.log(np.bincount(y) / len(y))
        return self

    def predict_log_proba(self, texts: Sequence[str]) -> np.ndarray:
        """log p(C_k | x) for every text (rows) and class (columns, in `classes_` order)."""
        joint = self.counts(texts) @ self.log_likelihood.T + self.log_prior  # (N, K)
        joint = np.asarray(joint)
        top = joint.max(1, keepdims=True)
        return joint - top - np.log(np.exp(joint - top).sum(1, keepdims=True))

    def predict(self, texts: Sequence[str]) -> np.ndarray:
        return self.classes_[self.predict_log_proba(texts).argmax(1)]


def evaluate(pred, target, num_classes: int) -> dict[str, float]:
    """Accuracy (micro: the fraction right) and macro F1 (the mean of the per-class F1 scores),
    as torchmetrics computes them for the fine-tuned models."""
    from torchmetrics.functional.classification import multiclass_accuracy, multiclass_f1_score

    p, t = torch.as_tensor(np.asarray(pred)), torch.as_tensor(np.asarray(target))
    return {
        "accuracy": multiclass_accuracy(p, t, num_classes, average="micro").item(),
        "macro_f1": multiclass_f1_score(p, t, num_classes, average="macro").item(),
    }
