"""Decoding strategies (Bishop sec. 12.3.2) checked against brute force on tiny models."""

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from src.models.generation import GenerationConfig, TokenDecoder, filter_logits, generate


class TrigramLM:
    """Next-token logits from a fixed random table indexed by the last two tokens.

    The distribution depends on context, so the best sequence need not be the greedy one.
    Records the shape of every call to check that beam search batches its beams.
    """

    def __init__(self, vocab: int, seed: int, scale: float = 2.0, eos_bias: float = 0.0):
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(vocab, vocab, vocab, generator=g) * scale  # (prev2, prev1, next)
        self.table[..., 0] += eos_bias  # make token 0 (the eos in eos tests) more or less likely
        self.calls: list[tuple[int, ...]] = []

    def __call__(self, ids: Tensor) -> Tensor:  # (B, T) -> (B, V)
        self.calls.append(tuple(ids.shape))
        prev2 = ids[:, -2] if ids.size(1) > 1 else ids[:, -1]
        return self.table[prev2, ids[:, -1]]


class TinyGRU(nn.Module):
    def __init__(self, vocab: int = 7, hidden: int = 16):
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        self.rnn = nn.GRU(hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ids: Tensor) -> Tensor:  # (B, T) -> (B, V)
        h, _ = self.rnn(self.emb(ids))
        return self.head(h[:, -1])


def sequence_log_prob(model: TrigramLM, prompt: list[int], tokens: tuple[int, ...]) -> float:
    """sum_n log p(tokens[n] | prompt, tokens[:n]), one model call per token."""
    ids, total = list(prompt), 0.0
    for tok in tokens:
        total += F.log_softmax(model(torch.tensor([ids])), dim=-1)[0, tok].item()
        ids.append(tok)
    return total


def nucleus(logits: Tensor, top_p: float) -> set[int]:
    """Smallest set of most probable tokens with total probability >= top_p, in plain Python."""
    probs = F.softmax(logits.double(), dim=-1).tolist()
    kept, mass = set(), 0.0
    for i in sorted(range(len(probs)), key=lambda i: -probs[i]):
        kept.add(i)
        mass += probs[i]
        if mass >= top_p:
            break
    return kept


def steps(out: Tensor, t0: int):
    """(prefix, sampled token) pairs of every generation step: ((B, t), (B,))."""
    for t in range(t0, out.size(1)):
        yield out[:, :t], out[:, t]


# 1. greedy


def test_greedy_is_stepwise_argmax_gru():
    torch.manual_seed(0)
    model = TinyGRU().eval()
    prompt = torch.randint(0, 7, (3, 5))
    out = generate(model, prompt, GenerationConfig(strategy="greedy", max_new_tokens=8))

    for row in range(3):  # reference: decode one row at a time, one token at a time
        ids = prompt[row].tolist()
        for _ in range(8):
            with torch.no_grad():
                ids.append(model(torch.tensor([ids]))[0].argmax().item())
        assert out[row].tolist() == ids


def test_greedy_is_stepwise_argmax_trigram():
    model = TrigramLM(vocab=6, seed=1)
    prompt = torch.tensor([[0], [3], [5]])  # T0 = 1 is allowed
    out = generate(model, prompt, GenerationConfig(strategy="greedy", max_new_tokens=10))
    assert out.shape == (3, 11)
    assert torch.equal(out[:, :1], prompt)
    for prefix, tok in steps(out, 1):
        assert torch.equal(tok, model(prefix).argmax(-1))


# 2. beam width 1 == greedy


@pytest.mark.parametrize("eos_id", [None, 0])
def test_beam_width_one_is_greedy(eos_id):
    model = TrigramLM(vocab=6, seed=2, eos_bias=1.0)
    prompt = torch.tensor([[1, 2], [3, 4], [5, 5], [2, 1]])
    common = dict(max_new_tokens=12, eos_id=eos_id)
    greedy = generate(model, prompt, GenerationConfig(strategy="greedy", **common))
    beam = generate(model, prompt, GenerationConfig(strategy="beam", beam_width=1, **common))
    assert torch.equal(beam, greedy)


# 3. beam search against exhaustive enumeration


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_wide_beam_finds_most_probable_sequence(length_penalty):
    vocab, length, prompt = 3, 4, [1, 2]
    model = TrigramLM(vocab=vocab, seed=3)
    scores = {
        seq: sequence_log_prob(model, prompt, seq)
        for seq in itertools.product(range(vocab), repeat=length)
    }
    best = max(scores, key=scores.get)

    cfg = GenerationConfig(
        strategy="beam",
        max_new_tokens=length,
        beam_width=vocab ** (length - 1),
        length_penalty=length_penalty,
    )
    out = generate(model, torch.tensor([prompt]), cfg)
    assert out[0, :2].tolist() == prompt
    assert tuple(out[0, 2:].tolist()) == best

    greedy = generate(
        model, torch.tensor([prompt]), GenerationConfig(strategy="greedy", max_new_tokens=length)
    )
    assert tuple(greedy[0, 2:].tolist()) != best  # this table really needs the beam


def test_wide_beam_with_eos_maximises_length_normalised_score():
    vocab, length, eos, prompt = 4, 4, 0, [1, 2]
    model = TrigramLM(vocab=vocab, seed=4, eos_bias=1.0)

    # every admissible output: ends at its first eos, or runs to max_new_tokens without one
    hypotheses = [
        seq
        for n in range(1, length + 1)
        for seq in itertools.product(range(vocab), repeat=n)
        if eos not in seq[:-1] and (seq[-1] == eos or n == length)
    ]
    log_p = {seq: sequence_log_prob(model, prompt, seq) for seq in hypotheses}

    best = {}
    for alpha in (0.0, 0.5, 1.0):
        best[alpha] = max(hypotheses, key=lambda s: log_p[s] / len(s) ** alpha)
        cfg = GenerationConfig(
            strategy="beam",
            max_new_tokens=length,
            beam_width=vocab ** (length - 1),
            length_penalty=alpha,
            eos_id=eos,
        )
        out = generate(model, torch.tensor([prompt]), cfg)
        assert tuple(out[0, 2:].tolist()) == best[alpha]
    assert len(best[0.0]) < len(best[1.0])  # normalisation changes the answer here


def test_beam_batches_beams_and_rows_are_independent():
    model = TrigramLM(vocab=4, seed=5)
    cfg = GenerationConfig(strategy="beam", max_new_tokens=4, beam_width=3)
    prompts = torch.tensor([[1, 2], [3, 0]])
    out = generate(model, prompts[:1], cfg)
    # one call per step, all live beams together
    assert model.calls == [(1, 2), (3, 3), (3, 4), (3, 5)]

    both = generate(model, prompts, cfg)
    assert both.shape == (2, 6)
    assert torch.equal(both[0], out[0])
    assert torch.equal(both[1], generate(model, prompts[1:], cfg)[0])


def test_beam_search_stops_decoding_a_row_whose_hypotheses_have_all_finished():
    calls = []

    def model(ids: Tensor) -> Tensor:  # (B, T) -> (B, 4): eos (0) at once after a 1, never else
        calls.append(tuple(ids.shape))
        logits = torch.zeros(len(ids), 4)
        logits[:, 0] = torch.where(ids[:, 0] == 1, 10.0, float("-inf"))
        return logits

    cfg = GenerationConfig(strategy="beam", max_new_tokens=4, beam_width=3, eos_id=0)
    out = generate(model, torch.tensor([[1], [2]]), cfg)
    # row 0 finishes its three hypotheses in two steps and leaves the batch; row 1 goes on
    assert calls == [(2, 1), (6, 2), (3, 3), (3, 4)]
    assert out[0, 1].item() == 0 and (out[1, 1:] != 0).all()


# 4. top-k and top-p sampling


def test_top_k_samples_only_the_k_most_likely():
    model, k = TrigramLM(vocab=12, seed=6, scale=1.0), 3
    prompt = torch.full((1000, 1), 4)
    cfg = GenerationConfig(strategy="sample", max_new_tokens=5, top_k=k)
    out = generate(model, prompt, cfg, generator=torch.Generator().manual_seed(0))

    for prefix, tok in steps(out, 1):
        allowed = model(prefix).topk(k, dim=-1).indices  # (B, k)
        assert (allowed == tok[:, None]).any(-1).all()
    assert out[:, 1].unique().numel() == k  # it really samples: every allowed token shows up

    again = generate(model, prompt, cfg, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, again)  # seeded generator -> reproducible


@pytest.mark.parametrize("top_p", [0.3, 0.6, 0.9])
def test_top_p_samples_only_from_the_nucleus(top_p):
    model = TrigramLM(vocab=12, seed=7, scale=1.0)
    prompt = torch.full((500, 2), 3)
    cfg = GenerationConfig(strategy="sample", max_new_tokens=4, top_p=top_p)
    out = generate(model, prompt, cfg, generator=torch.Generator().manual_seed(1))

    for prefix, tok in steps(out, 2):
        for logits, t in zip(model(prefix), tok.tolist(), strict=True):
            assert t in nucleus(logits, top_p)
    assert out[:, 2].unique().numel() == len(nucleus(model(prompt[:1])[0], top_p))


@pytest.mark.parametrize("top_p", [1e-6, 0.25, 0.5, 0.75, 0.95, 1.0])
def test_filter_logits_keeps_exactly_the_nucleus(top_p):
    logits = torch.randn(50, 20, generator=torch.Generator().manual_seed(8)) * 2
    kept = filter_logits(logits, top_k=None, top_p=top_p).isfinite()
    for row in range(50):
        assert set(kept[row].nonzero().flatten().tolist()) == nucleus(logits[row], top_p)


def test_filter_logits_keeps_at_least_the_argmax():
    logits = torch.randn(30, 10, generator=torch.Generator().manual_seed(9))
    argmax = logits.argmax(-1)
    for top_k, top_p in [(1, None), (None, 1e-9), (1, 1e-9), (3, 0.01)]:
        kept = filter_logits(logits, top_k, top_p).isfinite()
        assert kept.sum(-1).ge(1).all()
        assert kept.gather(-1, argmax[:, None]).all()
    # disabled filters leave the logits untouched
    for top_k, top_p in [(None, None), (0, None), (None, 1.0), (10, 1.0), (99, None)]:
        assert torch.equal(filter_logits(logits, top_k, top_p), logits)
    # top-k keeps exactly k, even with ties
    tied = torch.zeros(2, 6)
    assert filter_logits(tied, 2, None).isfinite().sum(-1).tolist() == [2, 2]


# 5. temperature -> 0


def test_low_temperature_sampling_is_greedy():
    model = TrigramLM(vocab=8, seed=10)
    prompt = torch.tensor([[0, 1], [2, 3], [4, 5], [6, 7]])
    greedy = generate(model, prompt, GenerationConfig(strategy="greedy", max_new_tokens=15))
    cold = GenerationConfig(strategy="sample", max_new_tokens=15, temperature=1e-4)
    for seed in range(3):
        out = generate(model, prompt, cold, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(out, greedy)


# 6. eos and validation


def counting_model(vocab: int = 5):
    """Deterministic LM: next token = last token + 1 (mod vocab), strongly peaked."""

    def next_token_logits(ids: Tensor) -> Tensor:
        return F.one_hot((ids[:, -1] + 1) % vocab, vocab).float() * 50

    return next_token_logits


@pytest.mark.parametrize("strategy", ["greedy", "sample", "beam"])
def test_eos_stops_and_pads(strategy):
    cfg = GenerationConfig(strategy=strategy, max_new_tokens=10, eos_id=4, beam_width=2)
    prompt = torch.tensor([[0], [2]])
    out = generate(counting_model(), prompt, cfg, generator=torch.Generator().manual_seed(0))
    # row 0 needs 4 tokens to reach eos, row 1 only 2 and is then padded; nothing runs to 10
    assert out.tolist() == [[0, 1, 2, 3, 4], [2, 3, 4, 4, 4]]


def test_no_eos_runs_to_max_new_tokens():
    for strategy in ["greedy", "sample", "beam"]:
        cfg = GenerationConfig(strategy=strategy, max_new_tokens=7)
        out = generate(counting_model(), torch.tensor([[0, 1]]), cfg)
        assert out.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3]]
        cfg.max_new_tokens = 0
        assert generate(counting_model(), torch.tensor([[0, 1]]), cfg).tolist() == [[0, 1]]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(temperature=0.0), "greedy"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(beam_width=0), "beam_width"),
        (dict(max_new_tokens=-1), "max_new_tokens"),
        (dict(strategy="nucleus"), "greedy.*sample.*beam"),
    ],
)
def test_invalid_settings_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        generate(counting_model(), torch.tensor([[0]]), GenerationConfig(**kwargs))


def test_invalid_arguments_raise():
    with pytest.raises(ValueError, match="top_p"):
        filter_logits(torch.zeros(1, 3), None, 2.0)
    with pytest.raises(ValueError, match="top_k"):
        filter_logits(torch.zeros(1, 3), -2, None)
    with pytest.raises(ValueError, match="prompt"):
        generate(counting_model(), torch.tensor([0, 1]), GenerationConfig())
    with pytest.raises(ValueError, match="prompt"):
        generate(counting_model(), torch.zeros(2, 0, dtype=torch.long), GenerationConfig())


# 7. the key/value cache: the same logits and outputs as re-running the prefix


def tiny_gpt(**kw):
    from src.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    cfg = dict(n_layer=2, n_head=2, d_model=16, vocab_size=9, block_size=12, dropout=0.0)
    return GPT(GPTConfig(**{**cfg, **kw})).double().eval()


@pytest.mark.parametrize("kw", [{}, {"pos_encoding": "sinusoidal"}, {"naive_attention": True}])
def test_cached_logits_equal_the_uncached_ones_step_by_step(kw):
    gpt = tiny_gpt(**kw)
    cached, ids = TokenDecoder(gpt), torch.randint(0, 9, (3, 4))
    with torch.no_grad():
        for _ in range(14):  # past block_size 12: the cropped window, re-run
            torch.testing.assert_close(cached(ids), gpt.next_token_logits(ids))
            ids = torch.cat([ids, torch.randint(0, 9, (3, 1))], dim=1)
    assert cached.cache.length == 12


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
@pytest.mark.parametrize("eos_id", [None, 3])
def test_cached_decoding_gives_the_uncached_tokens(strategy, eos_id):
    gpt = tiny_gpt(vocab_size=5)  # few tokens: eos is often chosen, so beams finish early
    prompt = torch.randint(0, 5, (3, 2))
    cfg = GenerationConfig(strategy=strategy, max_new_tokens=9, beam_width=3, eos_id=eos_id)
    assert torch.equal(
        generate(TokenDecoder(gpt), prompt, cfg), generate(gpt.next_token_logits, prompt, cfg)
    )


def test_cached_cross_attention_decoder_equals_the_full_pass():
    """A decoder stack with cross-attention fed one position at a time, its K, V cached, gives
    the outputs of the causal pass over the whole sequence (the encoder output Z padded)."""
    from src.nn.transformer import DecodingCache, Transformer, TransformerConfig

    torch.manual_seed(0)
    stack = Transformer(TransformerConfig(n_layer=2, n_head=2, d_model=16), cross_attention=True)
    stack = stack.double().eval()
    x, z = torch.randn(2, 7, 16).double(), torch.randn(2, 5, 16).double()
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])  # (B, T_enc)
    enc = dict(context=z, context_padding_mask=pad, causal=True)
    cache = DecodingCache(2)
    with torch.no_grad():
        full = stack(x, **enc)
        steps = [stack(x[:, t : t + 1], cache, **enc) for t in range(7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)
    assert cache.length == 7 and cache.layers[0][1].k.shape == (2, 2, 5, 8)
