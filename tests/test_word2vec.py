"""Word embeddings (model=word2vec): the word tokenizer, training pairs and noise words, the
loss, the evaluation code, the GPT embedding initialised from word vectors, and the pipeline."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from src.data.text import SPECIAL_TOKENS, UNK, load_tokenizer, train_tokenizer
from src.models.word2vec import (
    N_SPECIAL,
    Word2Vec,
    Word2VecConfig,
    WordTable,
    WordVectors,
    context_band,
    draw_noise,
    evaluate,
    gensim_test_file,
    init_token_embedding,
    keep_probability,
    load_word_vectors,
    noise_distribution,
    pack,
    read_analogies,
    read_wordsim,
    save_word_vectors,
)
from src.utils.errors import PipelineError
from tests.conftest import assert_ok, run_module

pytestmark = pytest.mark.usefixtures("one_thread")

# a toy corpus with structure: animals go with "eats", tools with "cuts"
TOY = " ".join(
    f"the {a} eats {f} . the {t} cuts {m} ."
    for a, f, t, m in zip(
        ["cat", "dog", "cow", "horse"] * 50,
        ["fish", "meat", "grass", "hay"] * 50,
        ["knife", "saw", "axe", "blade"] * 50,
        ["bread", "wood", "logs", "rope"] * 50,
        strict=True,
    )
)


# --------------------------------------------------------------------------- tokenizer


def test_word_tokenizer_round_trip_and_unknown_word():
    """Lowercase words, punctuation and line breaks as tokens; rarer words than min_count are
    <unk>; decoding joins the words with spaces."""
    tok = train_tokenizer("word", ["The cat sat.\nThe cat ran; the dog sat."], None, 2)
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == list(range(N_SPECIAL))
    assert set(tok.get_vocab()) - set(SPECIAL_TOKENS) == {"the", "cat", "sat", "."}
    enc = tok.encode("The CAT sat.\nthe cat")
    assert enc.tokens == ["the", "cat", "sat", ".", UNK, "the", "cat"]  # "\n" seen once: <unk>
    assert tok.decode(tok.encode("the cat sat .").ids) == "the cat sat ."
    again = train_tokenizer("word", ["a b\nc\n"], None, 1)
    assert again.decode(again.encode("A b\nc").ids) == "a b \n c"
    assert train_tokenizer("word", ["a a a b b c"], N_SPECIAL + 2).get_vocab_size() == 8


# --------------------------------------------------------------------------- pairs and noise


def test_context_pairs_within_each_radius_and_window():
    """Every (centre, context) pair of positions from one window within the centre's radius,
    once; none across two windows packed into a row, none with the padding (-1)."""
    window = torch.tensor([[3, 3, 3, 3, 3, 4, 4, -1]])
    radius = torch.tensor([[1, 2, 1, 2, 1, 2, 2, 2]])
    got = sorted(map(tuple, context_band(window, radius)[0].nonzero().tolist()))
    want = sorted(
        (c, o) for c in range(7) for o in range(7)
        if c != o and abs(c - o) <= radius[0, c] and (c < 5) == (o < 5)
    )  # fmt: skip
    assert got == want


def test_cbow_averages_each_centres_context_and_skipgram_scores_it_word_by_word():
    """'the cat sat on mats', radius 1 but 2 around 'sat': skip-gram's loss is each context
    word's from its centre, CBOW's each centre's from the mean of its context words' vectors;
    both with S = 1 noise word per true word, which each window draws once: 'on'."""
    torch.manual_seed(0)
    words = N_SPECIAL + torch.arange(5)  # the cat sat on mats
    band = context_band(torch.zeros(1, 5, dtype=torch.long), torch.tensor([[1, 1, 2, 1, 1]]))
    pairs = [(0, 1), (1, 0), (1, 2), (2, 0), (2, 1), (2, 3), (2, 4), (3, 2), (3, 4), (4, 3)]
    assert sorted(map(tuple, band[0].nonzero().tolist())) == pairs
    for mode in ("skipgram", "cbow"):
        net = Word2Vec(Word2VecConfig(vocab_size=N_SPECIAL + 5, dim=3, mode=mode, negative=1,
                                      noise_words=1))  # fmt: skip
        nn.init.normal_(net.emb_out.weight)
        net.noise.zero_()
        net.noise[N_SPECIAL + 3] = 1.0  # every noise word is 'on'
        net.windows = lambda tokens, generator=None: (tokens, band)
        v, u, k = net.emb_in.weight[words], net.emb_out.weight[words], net.emb_out.weight[words[3]]
        if mode == "skipgram":
            terms = [F.logsigmoid(u[o] @ v[c]) + (o != 3) * F.logsigmoid(-k @ v[c])
                     for c, o in pairs]  # fmt: skip
        else:
            contexts = [[o for c_, o in pairs if c_ == c] for c in range(5)]
            h = [v[ctx].mean(0) for ctx in contexts]
            terms = [F.logsigmoid(u[c] @ h[c]) + (c != 3) * F.logsigmoid(-k @ h[c])
                     for c in range(5)]  # fmt: skip
        want = -torch.stack(terms).mean()
        torch.testing.assert_close(net(words[None]), want)


def test_subsampled_words_vanish_and_the_kept_ones_pack_into_rows():
    tokens = torch.tensor([[10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]])
    keep = torch.tensor([[1, 0, 1, 0], [1, 1, 1, 0], [0, 0, 0, 1]], dtype=torch.bool)
    packed, window = pack(tokens, keep)
    assert packed.tolist() == [[10, 12, 20, 21], [22, 33, 0, 0]]
    assert window.tolist() == [[0, 0, 1, 1], [1, 2, -1, -1]]
    packed, window = pack(tokens, torch.zeros_like(keep))  # nothing kept: one empty row
    assert packed.shape == (1, 4) and (window == -1).all()


def test_noise_distribution_and_subsampling():
    """Noise ∝ count^0.75 over words only; frequent words are kept less often."""
    counts = torch.tensor([50, 9, 0, 0, 0, 0, 1000, 100, 10, 0])
    p = noise_distribution(counts)
    assert p[:N_SPECIAL].sum() == 0 and p[-1] == 0
    ratio = (torch.tensor([1000.0, 100, 10]) ** 0.75) / (1000**0.75 + 100**0.75 + 10**0.75)
    assert torch.allclose(p[6:9], ratio)
    draws = torch.multinomial(
        p, 200_000, replacement=True, generator=torch.Generator().manual_seed(0)
    )
    freq = torch.bincount(draws, minlength=10).float() / len(draws)
    assert torch.allclose(freq, p, atol=5e-3)
    keep = keep_probability(counts, 1e-2)
    assert keep[:N_SPECIAL].sum() == 0 and keep[8] == 1 and keep[6] < keep[7] < 1


def test_noise_words_of_a_window_and_two_words_at_least():
    p = torch.tensor([0.0, 0.9, 0.05, 0.05, 0.0])
    draws = draw_noise(p, 4000, 5, torch.Generator().manual_seed(0))
    assert draws.shape == (4000, 5) and not ((draws == 0) | (draws == 4)).any()
    assert abs((draws == 1).float().mean() - 0.9) < 0.01
    net = Word2Vec(Word2VecConfig(vocab_size=N_SPECIAL + 2))
    with pytest.raises(PipelineError, match="two words"):
        net.set_counts(torch.tensor([0] * N_SPECIAL + [7, 0]))


def test_shared_noise_words_give_each_pairs_own_loss_in_expectation():
    """The loss with noise words drawn per window and shared by its centres, against the same
    vectors' loss written pair by pair with S of their own, averaged over many draws."""
    torch.manual_seed(0)
    net = Word2Vec(Word2VecConfig(vocab_size=N_SPECIAL + 6, dim=4, window=1, sample=0,
                                  noise_words=3))  # fmt: skip
    net.set_counts(torch.tensor([0] * N_SPECIAL + [5, 4, 3, 3, 2, 1]))
    nn.init.normal_(net.emb_out.weight)
    tokens = N_SPECIAL + torch.tensor([[0, 1, 2, 3, 4, 5, 0, 2]])
    g = torch.Generator().manual_seed(0)
    shared = torch.stack([net(tokens, g) for _ in range(3000)]).mean()
    _, band = net.windows(tokens)
    c, o = (tokens[0, i] for i in band[0].nonzero().T)
    assert len(c) == 2 * 7  # radius 1: each of the 7 neighbouring pairs both ways
    v, u = net.emb_in.weight, net.emb_out.weight
    true = F.logsigmoid((u[o] * v[c]).sum(1))
    # S times the expectation over k of log σ(-u_k v_c), a k = o skipped (its term 0)
    p = net.noise[None].repeat(len(o), 1)
    p[torch.arange(len(o)), o] = 0
    expected = -(true + 5 * (p * F.logsigmoid(-(v[c] @ u.T))).sum(1)).mean()
    with torch.no_grad():
        assert shared.item() == pytest.approx(expected.item(), rel=0.02)


def test_word_table_gradient_is_embeddings_and_noise_words_default_by_mode():
    """WordTable's backward (index_add_) gives F.embedding's gradient, repeated words summed."""
    table = WordTable(7, 3)
    idx = torch.tensor([[1, 4, 1], [6, 1, 0]])
    grad = torch.randn(2, 3, 3)
    table(idx).backward(grad)
    ref = table.weight.detach().clone().requires_grad_()
    F.embedding(idx, ref).backward(grad)
    torch.testing.assert_close(table.weight.grad, ref.grad)
    assert Word2Vec(Word2VecConfig(mode="skipgram")).noise_words == 40
    assert Word2Vec(Word2VecConfig(mode="cbow")).noise_words == 20
    assert Word2Vec(Word2VecConfig(mode="cbow", noise_words=7)).noise_words == 7


# --------------------------------------------------------------------------- training


@pytest.mark.parametrize("mode", ["skipgram", "cbow"])
def test_loss_decreases_on_a_toy_corpus(mode):
    tok = train_tokenizer("word", [TOY])
    ids = torch.tensor(tok.encode(TOY).ids)
    torch.manual_seed(0)
    net = Word2Vec(Word2VecConfig(vocab_size=tok.get_vocab_size(), dim=16, mode=mode, window=2,
                                  sample=0))  # fmt: skip
    net.set_counts(torch.bincount(ids, minlength=tok.get_vocab_size()))
    assert net.E.shape == (16, tok.get_vocab_size())  # D × K, v_n = E x_n its columns
    opt = torch.optim.Adam(net.parameters(), lr=0.05)
    windows = ids[: len(ids) // 20 * 20].view(-1, 20)  # (B, T)
    g = torch.Generator().manual_seed(0)
    first = net(windows, torch.Generator().manual_seed(1)).item()
    for _ in range(60):
        loss = net(windows, g)
        opt.zero_grad()
        loss.backward()
        opt.step()
    last = net(windows, torch.Generator().manual_seed(1)).item()
    # u = 0: σ(0) = 1/2 for the true word and each of 5 noise words (fewer: a drawn true word
    # is skipped, and on this toy corpus the commonest words are drawn often)
    assert 4 * math.log(2) < first <= 6 * math.log(2)
    assert last < 0.7 * first
    vocab = tok.get_vocab()
    vectors = WordVectors(list(vocab), net.emb_in.weight[list(vocab.values())].detach())
    assert vectors.nearest("cat", 1)[0][0] in {"dog", "cow", "horse"}


# --------------------------------------------------------------------------- evaluation


def test_evaluation_on_hand_made_sets(tmp_path):
    words = ["man", "woman", "king", "queen", "apple", "boy", "girl"]
    v = torch.tensor(
        [[1.0, 0, 0], [1, 1, 0], [1, 0, 1], [1, 1, 1], [0, 0.1, -1], [0.9, 0, 0.1], [0.9, 1, 0.1]]
    )
    vectors = WordVectors(words, v)
    (tmp_path / "q.txt").write_text(
        ": family\nman woman king queen\nman woman boy girl\nman king woman apple\n"
        "Man Woman Prince Princess\n"  # not in the vocabulary: not covered
    )
    (tmp_path / "ws.tsv").write_text(
        "# comment\nking\tqueen\t9\nman\twoman\t8\napple\tking\t1\nfoo\tbar\t5\n"
    )
    questions = read_analogies(tmp_path / "q.txt")
    pairs = read_wordsim(tmp_path / "ws.tsv")
    assert questions[0] == ("man", "woman", "king", "queen") and len(pairs) == 4
    scores = evaluate(vectors, questions, pairs)
    assert scores["analogy_acc"] == pytest.approx(2 / 3)  # the third's answer is not apple
    assert scores["analogy_coverage"] == 0.75 and scores["analogy_questions"] == 3
    assert scores["wordsim_spearman"] == pytest.approx(1.0)
    assert scores["wordsim_coverage"] == 0.75
    assert [w for w, _ in vectors.nearest("king", 2)] == ["queen", "boy"]


def test_gensims_evaluation_files_are_read():
    path = gensim_test_file("questions-words.txt")
    if path is None:
        pytest.skip("gensim is not installed (pip install -e '.[dev]'): its evaluation files")
    assert len(read_analogies(path)) == 19544
    assert len(read_wordsim(gensim_test_file("wordsim353.tsv"))) == 353


def test_word_vectors_file_round_trip(tmp_path):
    vectors = WordVectors(["a", "b", "\n"], torch.randn(3, 4))
    save_word_vectors(vectors, tmp_path / "v.txt")
    words, loaded = load_word_vectors(tmp_path / "v.txt")
    assert words == ["a", "b"]  # a word with whitespace cannot be written
    assert torch.allclose(loaded, vectors.raw[:2], atol=1e-5)


@pytest.mark.parametrize("freeze", [False, True])
def test_gpt_token_embedding_from_word_vectors(tmp_path, freeze):
    from src.models.gpt import GPTLitModule

    tok = train_tokenizer("word", ["the cat sat on the mat"])
    vectors = torch.randn(3, 8)
    save_word_vectors(WordVectors(["cat", "mat", "zebra"], vectors), tmp_path / "v.txt")
    net = {"n_layer": 1, "n_head": 2, "d_model": 8, "block_size": 4}
    gpt = GPTLitModule(net, {}, tok.get_vocab_size(), embedding={"init": "x"})
    before = gpt.net.tok_emb.weight.detach().clone()
    assert init_token_embedding(gpt.net.tok_emb, tok, str(tmp_path / "v.txt"), freeze) == 2
    w = gpt.net.tok_emb.weight
    for word, i in (("cat", 0), ("mat", 1)):
        assert torch.allclose(w[tok.token_to_id(word)], vectors[i], atol=1e-5)
    assert torch.equal(w[tok.token_to_id("the")], before[tok.token_to_id("the")])
    assert w.requires_grad is not freeze
    assert gpt.net.lm_head.weight is w  # tied: the output layer shares (and freezes) them
    with pytest.raises(PipelineError, match="dimensions"):
        init_token_embedding(torch.nn.Embedding(10, 5), tok, str(tmp_path / "v.txt"), freeze)


# --------------------------------------------------------------------------- pipeline


def test_train_word2vec_then_gpt_from_its_vectors(tmp_path, shakespeare):
    """src.train model=word2vec on Shakespeare's words logs the scores and writes the vectors;
    a word-level GPT then starts from them, frozen."""
    common = [
        f"data.path={shakespeare}", "data.tokenizer=word", "data.vocab_size=2000",
        "data.block_size=32", "data.steps_per_epoch=5", "trainer.max_steps=10",
        "trainer.limit_val_batches=2", "logger=csv", "test=false",
        "callbacks.progress_bar.refresh_rate=0", f"paths.data_dir={tmp_path}/data",
    ]  # fmt: skip
    w2v = tmp_path / "w2v"
    assert_ok(run_module("src.train", "model=word2vec", "data=text", *common,
                         "model.net.dim=16", f"hydra.run.dir={w2v}"))  # fmt: skip
    metrics = json.loads((w2v / "metrics.json").read_text())
    assert metrics["val/loss"] < metrics["train/loss"] * 1.5
    if gensim_test_file("questions-words.txt") is not None:
        assert 0 < metrics["val/analogy_coverage"] < 1 and 0 < metrics["val/wordsim_coverage"] < 1
    assert "king:" in (w2v / "neighbours.txt").read_text()
    words, vectors = load_word_vectors(w2v / "word_vectors.txt")
    assert vectors.shape == (len(words), 16) and len(words) > 1000

    gpt = tmp_path / "gpt"
    assert_ok(run_module(
        "src.train", "model=gpt", "data=text", *common, "model.net.n_layer=1",
        "model.net.d_model=16", f"model.embedding.init={w2v / 'word_vectors.txt'}",
        "model.embedding.freeze=true", "model.generation.max_new_tokens=5",
        f"hydra.run.dir={gpt}",
    ))  # fmt: skip
    ckpt = torch.load(gpt / "checkpoints" / "last.ckpt", weights_only=True)
    emb = ckpt["state_dict"]["net.tok_emb.weight"]  # after 10 steps: frozen
    tok = load_tokenizer(ckpt["TextDataModule"]["tokenizer"])
    for word in ("king", "the", "love"):
        assert torch.allclose(emb[tok.token_to_id(word)], vectors[words.index(word)], atol=1e-5)
