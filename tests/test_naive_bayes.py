"""Multinomial naive Bayes (src/models/naive_bayes.py): the posterior by hand, separable toy data,
and the accuracy / macro-F1 helper."""

from __future__ import annotations

import math

import numpy as np
import pytest

from src.models.naive_bayes import NaiveBayes, evaluate, words


def test_words_lowercase_regex():
    assert words("Romeo, ROMEO! wherefore art thou--Romeo? 'tis 42") == [
        "romeo", "romeo", "wherefore", "art", "thou", "romeo", "'tis", "42",
    ]  # fmt: skip


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_posterior_matches_hand_computation(alpha):
    """Two classes, vocabulary {a, b, c}:
    class 0 ("a a b", "a"): counts a=3 b=1 c=0, 4 words; class 1 ("b c"): a=0 b=1 c=1, 2 words.
    p(w|k) = (n_kw + alpha) / (n_k + 3 alpha); p(k) = 2/3, 1/3. The text "A c zzz" has the
    counts a=1, c=1 (zzz is not in the vocabulary and is ignored)."""
    nb = NaiveBayes(alpha).fit(["a a b", "a", "b c"], [0, 0, 1])
    p_a0, p_c0 = (3 + alpha) / (4 + 3 * alpha), (0 + alpha) / (4 + 3 * alpha)
    p_a1, p_c1 = (0 + alpha) / (2 + 3 * alpha), (1 + alpha) / (2 + 3 * alpha)
    joint = np.array([2 / 3 * p_a0 * p_c0, 1 / 3 * p_a1 * p_c1])
    expected = joint / joint.sum()
    log_post = nb.predict_log_proba(["A c zzz"])
    assert log_post.shape == (1, 2)
    np.testing.assert_allclose(np.exp(log_post[0]), expected, rtol=1e-12)
    assert nb.predict(["A c zzz"]).tolist() == [int(expected.argmax())]
    # no known word at all: the prior decides
    np.testing.assert_allclose(np.exp(nb.predict_log_proba(["zzz"])[0]), [2 / 3, 1 / 3])
    # a word repeated counts as often as it occurs: p(k | "c c") ∝ p(k) p(c|k)^2
    joint = np.array([2 / 3 * p_c0**2, 1 / 3 * p_c1**2])
    np.testing.assert_allclose(np.exp(nb.predict_log_proba(["c c"])[0]), joint / joint.sum())


def test_long_texts_stay_finite():
    """Log space: thousands of words do not underflow to 0/0."""
    nb = NaiveBayes().fit(["x y", "y z"], [0, 1])
    log_post = nb.predict_log_proba(["x " * 5000 + "z " * 4999])
    assert np.isfinite(log_post).all()
    assert math.isclose(np.exp(log_post).sum(), 1.0)
    assert nb.predict(["x " * 5000 + "z " * 4999]).tolist() == [0]


def test_separable_toy_data_is_learnt_perfectly():
    """Disjoint vocabularies per class: every held-out text is classified right; string labels
    come back as given."""
    rng = np.random.default_rng(0)
    vocab = {"sport": ["goal", "match", "team", "score"],
             "food": ["bread", "soup", "salt", "spoon"],
             "sea": ["wave", "ship", "tide", "sail"]}  # fmt: skip
    filler = ["the", "a", "and", "of"]

    def sample(n):
        labels = rng.choice(list(vocab), size=n)
        texts = [" ".join(rng.choice(vocab[c] + filler, size=8)) for c in labels]
        return texts, labels.tolist()

    train_x, train_y = sample(60)
    test_x, test_y = sample(30)
    nb = NaiveBayes().fit(train_x, train_y)
    assert nb.classes_.tolist() == ["food", "sea", "sport"]
    assert nb.predict(test_x).tolist() == test_y
    ids = {c: i for i, c in enumerate(nb.classes_)}
    m = evaluate([ids[p] for p in nb.predict(test_x)], [ids[t] for t in test_y], 3)
    assert m == {"accuracy": 1.0, "macro_f1": 1.0}


def test_evaluate_accuracy_and_macro_f1():
    """Per-class F1 = 2tp / (2tp + fp + fn) by hand: class 0 tp=2 fp=1 fn=0 -> 4/5; class 1
    tp=1 fp=1 fn=1 -> 1/2; class 2 tp=1 fp=0 fn=1 -> 2/3. Accuracy: 4 of 6."""
    target = [0, 0, 1, 1, 2, 2]
    pred = np.array([0, 0, 0, 1, 2, 1])
    m = evaluate(pred, target, 3)
    assert m["accuracy"] == pytest.approx(4 / 6)
    assert m["macro_f1"] == pytest.approx((4 / 5 + 1 / 2 + 2 / 3) / 3)


def test_bad_arguments():
    with pytest.raises(ValueError, match="alpha"):
        NaiveBayes(alpha=0)
    with pytest.raises(ValueError, match="as many"):
        NaiveBayes().fit(["a", "b"], [0])
