"""N-gram language models (src/models/ngram.py): counts against a brute-force count, add-k and
Kneser-Ney by hand and against a dictionary implementation, every conditional distribution
normalised, and a fit through `python -m src.train`."""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict

import numpy as np
import pytest
import torch

from src.models.ngram import NGram, NGramLitModule, count_ngrams
from src.utils.errors import PipelineError
from tests.conftest import FAST, assert_ok, run_module

STREAM = np.array([1, 2, 1, 2, 3, 1, 2, 1])  # K = 4: token 0 never seen


def decode(keys: np.ndarray, tables: list, k: int) -> list[tuple[int, ...]]:
    """The n-grams that the keys of one order stand for, from the tables of the orders below."""
    if not tables:
        return [(int(w),) for w in keys]
    below = decode(tables[-1][0], tables[:-1], k)
    return [(*below[key // k], int(key % k)) if tables else (int(key),) for key in keys]


def test_counts_by_hand():
    """1 2 1 2 3 1 2 1: unigrams 1:4 2:3 3:1; bigrams 12:3 21:2 23:1 31:1; continuation counts
    (distinct tokens before): 1 after {2, 3}, 2 after {1}, 3 after {2}; 12 after {2, 3} (212,
    312), 21 after {1}, 23 after {1}, 31 after {2}."""
    raw = count_ngrams(STREAM, 3, 4)
    cont = count_ngrams(STREAM, 3, 4, continuation=True)
    grams = [decode(keys, raw[: n - 1], 4) for n, (keys, _) in enumerate(raw, 1)]
    assert dict(zip(grams[0], raw[0][1].tolist(), strict=True)) == {(1,): 4, (2,): 3, (3,): 1}
    assert dict(zip(grams[1], raw[1][1].tolist(), strict=True)) == {
        (1, 2): 3, (2, 1): 2, (2, 3): 1, (3, 1): 1,
    }  # fmt: skip
    assert cont[0][1].tolist() == [2, 1, 1]
    assert cont[1][1].tolist() == [2, 1, 1, 1]
    assert cont[2][1].tolist() == raw[2][1].tolist()  # the highest order keeps its counts


@pytest.mark.parametrize("order", [1, 2, 3, 4, 5])
def test_counts_match_a_counter(order):
    """Every order's n-grams and counts, and continuation counts, against collections.Counter."""
    stream = np.random.default_rng(order).integers(0, 4, 300)
    raw = count_ngrams(stream, order, 4)
    cont = count_ngrams(stream, order, 4, continuation=True)
    for n in range(1, order + 1):
        grams = decode(raw[n - 1][0], raw[: n - 1], 4)
        counter = Counter(tuple(stream[i : i + n].tolist()) for i in range(len(stream) - n + 1))
        assert dict(zip(grams, raw[n - 1][1].tolist(), strict=True)) == counter
        if n < order:
            longer = {tuple(stream[i : i + n + 1].tolist()) for i in range(len(stream) - n)}
            before = Counter(g[1:] for g in longer)
            assert [before[g] for g in grams] == cont[n - 1][1].tolist()


def test_add_k_by_hand():
    """Order 3, k = 1, K = 4. Context 12 is followed by 1 twice and by 3 once: p(w | 12) =
    (c(12w) + 1) / (3 + 4); context 01 was never seen: uniform. A window's first position holds
    one token of context, 1, so the bigram counts serve: 12 three times (the stream's last 1 is
    followed by nothing), p(w | 1) = (c(1w) + 1) / (3 + 4)."""
    m = NGram(3, 4, "add_k", 1.0, 0.75).fit(STREAM)
    p = m(torch.tensor([[1, 2], [0, 1]])).exp().double()  # (2, 2, K)
    torch.testing.assert_close(p[0, 1], torch.tensor([1, 3, 1, 2.0]).double() / 7)
    torch.testing.assert_close(p[1, 1], torch.full((4,), 0.25).double())
    torch.testing.assert_close(p[0, 0], torch.tensor([1, 1, 4, 1.0]).double() / 7)
    log_p = m.log_prob(torch.tensor([[1, 2]]), torch.tensor([[2, 1]]))
    torch.testing.assert_close(log_p, torch.tensor([[4 / 7, 3 / 7]]).double().log())


def test_kneser_ney_by_hand():
    """Order 2, D = 0.75, K = 4. Unigrams from continuation counts 1:2 2:1 3:1 (sum 4, 3 types):
    p(w) = max(c' - D, 0) / 4 + D 3 / 4 * 1/4. Context 2: c(21) = 2, c(23) = 1, 2 types:
    p(w | 2) = max(c(2w) - D, 0) / 3 + D 2 / 3 p(w). Unseen context 0: p(w)."""
    d = 0.75
    uni = np.array([0, 2 - d, 1 - d, 1 - d]) / 4 + d * 3 / 4 / 4
    given_2 = np.array([0, 2 - d, 0, 1 - d]) / 3 + d * 2 / 3 * uni
    m = NGram(2, 4, "kneser_ney", 1.0, d).fit(STREAM)
    p = m(torch.tensor([[2, 0]])).exp().double()
    np.testing.assert_allclose(p[0, 0].numpy(), given_2, rtol=1e-6)
    np.testing.assert_allclose(p[0, 1].numpy(), uni, rtol=1e-6)
    assert math.isclose(uni.sum(), 1) and math.isclose(given_2.sum(), 1)


def kneser_ney_reference(stream: list[int], order: int, k: int, d: float):
    """Interpolated Kneser-Ney from dictionaries of n-grams, as the formulas read."""
    grams = [Counter(tuple(stream[i : i + n]) for i in range(len(stream) - n + 1))
             for n in range(order + 1)]  # fmt: skip
    counts = [defaultdict(int) for _ in range(order + 1)]  # the counts each order uses
    counts[order].update(grams[order])
    for n in range(1, order):
        for g in grams[n + 1]:
            counts[n][g[1:]] += 1  # N_1+(. g)

    def p(w: int, h: tuple[int, ...]) -> float:
        n = len(h) + 1
        lower = 1 / k if n == 1 else p(w, h[1:])
        followers = [c for g, c in counts[n].items() if g[:-1] == h and c > 0]
        if not followers:
            return lower
        total = sum(followers)
        return (max(counts[n].get((*h, w), 0) - d, 0) + d * len(followers) * lower) / total

    return p


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_kneser_ney_matches_reference(order):
    """Every position of a window (a context partly before it, seen and unseen contexts) and
    every token, against the dictionary implementation with the context the window holds."""
    stream = np.random.default_rng(order).integers(1, 5, 400)  # K = 6: tokens 0, 5 unseen
    ref = kneser_ney_reference(stream.tolist(), order, 6, 0.6)
    m = NGram(order, 6, "kneser_ney", 1.0, 0.6).fit(stream)
    window = [3, 1, 5, 2, 2, 4, 1, 3, 0, 1]
    p = m(torch.tensor([window])).exp()[0].double()  # (T, K)
    for t in range(len(window)):
        h = tuple(window[max(0, t - order + 2) : t + 1]) if order > 1 else ()
        expected = [ref(w, h) for w in range(6)]
        np.testing.assert_allclose(p[t].numpy(), expected, rtol=1e-5, err_msg=f"t={t}")


@pytest.mark.parametrize("smoothing", ["add_k", "kneser_ney"])
@pytest.mark.parametrize("order", [1, 2, 3, 4, 5])
def test_every_conditional_sums_to_one(smoothing, order):
    """Contexts seen, unseen, holding tokens never seen (6, 7), and cut by the window's start."""
    stream = np.random.default_rng(0).integers(0, 6, 2000)  # K = 8
    m = NGram(order, 8, smoothing, 0.3, 0.75).fit(stream)
    windows = torch.tensor([stream[100:116].tolist(), [7, 6, 1, 2, 6, 3, 3, 3, 0, 1, 2, 3, 4,
                                                      5, 7, 7]])  # fmt: skip
    p = m(windows).exp().double()  # (2, 16, K)
    assert (p > 0).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(2, 16, dtype=torch.float64))
    # generation's next-token distribution is the last position's
    logits = m.next_token_logits(windows)
    torch.testing.assert_close(logits, m(windows[:, -max(order - 1, 1) :])[:, -1])


def test_contexts_seen_per_order():
    """1 2 1 2 3 1 2 1: contexts followed by a token, of 0 tokens: 1; of 1: {1, 2, 3}; of 2:
    {12, 21, 23, 31} (the final 21 is followed by nothing, but 21 also occurs earlier)."""
    m = NGram(3, 4, "kneser_ney", 1.0, 0.75).fit(STREAM)
    assert m.contexts.tolist() == [1, 3, 4]


def test_bad_settings():
    for kw, match in [({"order": 0}, "order"), ({"smoothing": "witten_bell"}, "smoothing"),
                      ({"k": 0.0}, "k="), ({"discount": 1.5}, "discount"),
                      ({"max_tokens": 1}, "max_tokens")]:  # fmt: skip
        with pytest.raises(PipelineError, match=match):
            NGramLitModule(**{"order": 2, "vocab_size": 8, **kw})


def test_fit_through_src_train(tmp_path, shakespeare):
    """`python -m src.train model=ngram`: one pass, val and test in nats per token, the contexts
    per order in metrics.json and plotted, samples, and a checkpoint that holds the counts."""
    run = tmp_path / "run"
    fast = [o for o in FAST if not o.startswith(("experiment=", "model."))]
    proc = run_module(
        "src.train", *fast, "model=ngram", "data=shakespeare", "model.order=3", "logger=csv",
        "model.generation.max_new_tokens=40", f"data.path={shakespeare}",
        f"hydra.run.dir={run}", f"paths.data_dir={tmp_path}/data",
    )  # fmt: skip
    assert_ok(proc)
    metrics = json.loads((run / "metrics.json").read_text())
    assert {"val/loss", "val/ppl", "val/bits_per_token", "test/loss", "test/ppl", "train/loss",
            "params/total"} <= set(metrics)  # fmt: skip
    assert [metrics[f"params/contexts_order{n}"] for n in (1, 2)] == [1, 65]  # 65 characters
    assert 65 < metrics["params/contexts_order3"] < 65**2
    assert 1.5 < metrics["val/loss"] < 2.5  # far below the uniform log 71 = 4.26
    assert math.isclose(metrics["val/bits_per_token"], metrics["val/loss"] / math.log(2),
                        rel_tol=1e-5)  # fmt: skip
    assert (run / "ngram_contexts.png").stat().st_size > 10_000
    assert len((run / "samples.txt").read_text()) > 40
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    model = NGramLitModule(**ckpt["hyper_parameters"])
    model.load_state_dict(ckpt["state_dict"])
    assert model.net.contexts.tolist() == [1, 65, metrics["params/contexts_order3"]]
    # a data budget: the first 2,000 train characters only (bench/ladder.py's rungs)
    proc = run_module(
        "src.train", *fast, "model=ngram", "data=shakespeare", "model.order=3", "logger=csv",
        "model.max_tokens=2000", "test=false", f"data.path={shakespeare}",
        f"hydra.run.dir={tmp_path}/small", f"paths.data_dir={tmp_path}/data",
    )  # fmt: skip
    assert_ok(proc)
    assert "of 2000 train tokens" in (tmp_path / "small/train.log").read_text()
    small = json.loads((tmp_path / "small/metrics.json").read_text())
    assert small["params/contexts_order3"] < metrics["params/contexts_order3"]
