"""Decoding strategies for a causal language model (Bishop, Deep Learning, sec. 12.3.2).

A decoder transformer only gives p(x_{n+1} | x_1..x_n); turning that into text needs a rule
for picking tokens. The chapter's options, all here:

- greedy: take the most probable token each step. Cheap and deterministic, but the most
  probable *sequence* need not start with the most probable token, and the text tends to repeat.
- beam search: keep the beam_width most probable partial sequences, a better approximation
  to the argmax over whole sequences at beam_width times the cost of greedy.
- sampling from the softmax, reshaped by a temperature T (T -> 0 recovers greedy, T = 1 the
  model, large T flattens it) and truncated to the top-k tokens or to the nucleus (top-p), so
  the long tail of unlikely tokens cannot derail the text.

Everything talks to the model through `next_token_logits`, so any causal LM fits; cropping the
context to the model's window is the caller's job. A `TokenDecoder` is such a function for a
Transformer, with a key/value cache (each step runs the model on one new token instead of the
whole prefix) and the encoder output of a translation model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from src.nn.transformer import DecodingCache, TokenTransformer

STRATEGIES = ("greedy", "sample", "beam")

NextTokenLogits = Callable[[Tensor], Tensor]  # ids (B, T) long -> logits (B, V) for the next token


class TokenDecoder:
    """next_token_logits of a causal token Transformer: GPT, or a translation decoder that
    attends to its encoder's output Z (`context` (B, S, D), padding `context_padding_mask`).

    generate() passes the whole sequence so far, ids (B, T), at every step. With the key/value
    cache (`cache=True`) the decoder runs the model only on the positions the cache lacks (the
    prompt on the first call, then the one new token), at O(T) per token instead of O(T^2); a
    sequence no longer than the cache starts a new generation. Past block_size the positions of
    a cropped window shift at every step, so there it re-runs the last block_size tokens, as the
    uncached path always does.
    """

    def __init__(
        self,
        net: TokenTransformer,
        context: Tensor | None = None,
        context_padding_mask: Tensor | None = None,
        cache: bool = True,
    ):
        self.net, self.use_cache = net, cache
        self.context = {"context": context, "context_padding_mask": context_padding_mask}
        self.cache = DecodingCache(net.cfg.n_layer)

    def __call__(self, ids: Tensor) -> Tensor:  # (B, T) -> (B, V)
        window = self.net.cfg.block_size
        if not self.use_cache or ids.size(1) > window:
            return self.net(ids[:, -window:], last_only=True, **self.context)[:, -1]
        if ids.size(1) <= self.cache.length:
            self.cache = DecodingCache(self.net.cfg.n_layer)
        new = ids[:, self.cache.length :]  # (B, T - cached)
        return self.net(new, last_only=True, cache=self.cache, **self.context)[:, -1]

    def reorder(self, index: Tensor) -> None:
        """Keep the rows `index`: beam search continues from these hypotheses."""
        self.cache.reorder(index)
        self.context = {k: v if v is None else v[index] for k, v in self.context.items()}

    def row(self, i: int) -> TokenDecoder:
        """A decoder for row i alone (beam search runs one source at a time), cache empty."""
        context = {k: v if v is None else v[i : i + 1] for k, v in self.context.items()}
        return TokenDecoder(self.net, **context, cache=self.use_cache)


@dataclass
class GenerationConfig:
    strategy: str = "sample"  # "greedy" | "sample" | "beam"
    max_new_tokens: int = 200
    temperature: float = 1.0  # used by "sample"
    top_k: int | None = None  # used by "sample"; None or 0 = no top-k filter
    top_p: float | None = None  # used by "sample"; None or 1.0 = no nucleus filter
    beam_width: int = 4  # used by "beam"
    length_penalty: float = 1.0  # alpha in score = sum(log p) / length**alpha, "beam" only
    eos_id: int | None = None  # stop a sequence once it emits this id


def _check_filter_args(top_k: int | None, top_p: float | None) -> None:
    if top_k is not None and top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 or None disables it), got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] (1.0 or None disables it), got {top_p}")


def _check_config(cfg: GenerationConfig) -> None:
    """Every field is checked whatever the strategy, so a mistyped config fails fast."""
    if cfg.strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {cfg.strategy!r}; expected one of {STRATEGIES}")
    if cfg.temperature <= 0:
        raise ValueError(
            f"temperature must be > 0, got {cfg.temperature}; for the temperature -> 0 limit "
            "use strategy='greedy'"
        )
    _check_filter_args(cfg.top_k, cfg.top_p)
    if cfg.beam_width < 1:
        raise ValueError(f"beam_width must be >= 1, got {cfg.beam_width}")
    if cfg.max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {cfg.max_new_tokens}")


def filter_logits(logits: Tensor, top_k: int | None, top_p: float | None) -> Tensor:
    """Top-k then nucleus (top-p) truncation: logits outside the kept set become -inf.

    logits: (..., V). Top-k keeps the k largest logits. Top-p keeps the smallest set of most
    probable tokens whose total probability reaches top_p, including the token that crosses the
    threshold, so the set adapts to how peaked the distribution is. The argmax always survives.
    """
    _check_filter_args(top_k, top_p)
    if top_k and top_k < logits.size(-1):
        top = torch.topk(logits, top_k, dim=-1)
        # scatter rather than threshold at the k-th value, so ties cannot let in more than k
        logits = torch.full_like(logits, float("-inf")).scatter(-1, top.indices, top.values)
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (..., V)
        probs = F.softmax(sorted_logits, dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # mass of the strictly more probable tokens
        # a token is dropped once the tokens before it already reach top_p; the first has
        # mass_before = 0 < top_p, so the argmax is always kept
        drop = torch.zeros_like(mass_before, dtype=torch.bool).scatter(
            -1, order, mass_before >= top_p
        )
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


@torch.no_grad()
def generate(
    next_token_logits: NextTokenLogits,
    prompt: Tensor,
    cfg: GenerationConfig,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Extend each prompt row by up to cfg.max_new_tokens tokens.

    prompt: (B, T0) long, T0 >= 1. Returns (B, T0 + n) long, n <= max_new_tokens, with the
    prompt as prefix. Rows that end early (eos) are padded with eos_id. `generator` seeds the
    sampling; greedy and beam search are deterministic.
    """
    _check_config(cfg)
    if prompt.dim() != 2 or prompt.size(1) == 0:
        raise ValueError(f"prompt must be (B, T0) with T0 >= 1, got shape {tuple(prompt.shape)}")
    if cfg.max_new_tokens == 0:
        return prompt
    if cfg.strategy == "beam":
        # hypotheses of different rows cannot share a beam, so search each row on its own
        rows = [_beam_search(_row(next_token_logits, i), row[None], cfg)
                for i, row in enumerate(prompt)]  # fmt: skip
        pad = cfg.eos_id if cfg.eos_id is not None else 0  # rows only differ in length via eos
        return pad_sequence(rows, batch_first=True, padding_value=pad)
    return _greedy_or_sample(next_token_logits, prompt, cfg, generator)


def _row(next_token_logits: NextTokenLogits, i: int) -> NextTokenLogits:
    return (
        next_token_logits.row(i)
        if isinstance(next_token_logits, TokenDecoder)
        else next_token_logits
    )


def _reorder(next_token_logits: NextTokenLogits, index: Tensor) -> None:
    if isinstance(next_token_logits, TokenDecoder):
        next_token_logits.reorder(index)


def _greedy_or_sample(
    next_token_logits: NextTokenLogits,
    prompt: Tensor,
    cfg: GenerationConfig,
    generator: torch.Generator | None,
) -> Tensor:
    """Autoregressive loop, one token per step for the whole batch: ids (B, T) -> (B, T + 1)."""
    ids = prompt
    done = torch.zeros(prompt.size(0), dtype=torch.bool, device=prompt.device)  # (B,) hit eos
    for _ in range(cfg.max_new_tokens):
        logits = next_token_logits(ids).float()  # (B, V); fp32 so low-precision models sample OK
        if cfg.strategy == "greedy":
            next_id = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
        else:
            logits = filter_logits(logits / cfg.temperature, cfg.top_k, cfg.top_p)
            next_id = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
        if cfg.eos_id is not None:
            next_id = next_id.masked_fill(done[:, None], cfg.eos_id)  # finished rows only pad
            done |= next_id[:, 0] == cfg.eos_id
        ids = torch.cat([ids, next_id], dim=1)
        if done.all():
            break
    return ids


def _beam_search(
    next_token_logits: NextTokenLogits, prompt: Tensor, cfg: GenerationConfig
) -> Tensor:
    """Beam search for one prompt (1, T0); returns the best hypothesis (T0 + n,).

    A hypothesis scores sum(log p of its n generated tokens) / n**length_penalty: a raw sum of
    log probabilities only falls as a sequence grows, so without normalisation (alpha = 0)
    search favours stopping early at eos. The beam holds beam_width hypotheses in all; one that
    emits eos is finished and keeps its slot, so the live beam narrows and width 1 is exactly
    greedy decoding.
    """
    beams = prompt  # (W, T) live hypotheses, W <= beam_width
    scores = torch.zeros(1, device=prompt.device)  # (W,) sum of log p over generated tokens
    finished: list[tuple[float, Tensor]] = []  # (normalised score, ids (T,))

    def finish(sums: Tensor, hyps: Tensor) -> None:  # (k,), (k, T)
        n = hyps.size(1) - prompt.size(1)  # generated tokens, eos included; same for all k
        finished.extend(zip((sums / n**cfg.length_penalty).tolist(), hyps, strict=True))

    for _ in range(cfg.max_new_tokens):
        logp = F.log_softmax(next_token_logits(beams).float(), dim=-1)  # (W, V), all beams at once
        vocab = logp.size(-1)
        candidates = (scores[:, None] + logp).flatten()  # (W * V,) every one-token extension
        k = min(cfg.beam_width - len(finished), candidates.numel())
        scores, flat = candidates.topk(k)  # (k,)
        parents = flat // vocab
        beams = torch.cat([beams[parents], (flat % vocab)[:, None]], dim=1)  # (k, T + 1)
        _reorder(next_token_logits, parents)
        if cfg.eos_id is not None:
            ended = beams[:, -1] == cfg.eos_id  # (k,)
            finish(scores[ended], beams[ended])
            beams, scores = beams[~ended], scores[~ended]
            _reorder(next_token_logits, ~ended)
            if len(beams) == 0:
                break
    finish(scores, beams)
    return max(finished, key=lambda f: f[0])[1]
