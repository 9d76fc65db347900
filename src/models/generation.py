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
whole prefix) and the encoder output of a translation model; a `RecurrentDecoder` for an RNN,
whose hidden state is its cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

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


class RecurrentDecoder:
    """next_token_logits of a model that decodes one token at a time from a state, an RNN:
    step(y (B,), state) -> (logits (B, V), state), state.reorder(index) -> state. Each call
    steps through the tokens not yet read (the prompt, then the one new token); one generation
    per decoder."""

    def __init__(self, step: Callable, state):
        self.step, self.state, self.length = step, state, 0

    def __call__(self, ids: Tensor) -> Tensor:  # (B, T) -> (B, V)
        for t in range(self.length, ids.size(1)):
            logits, self.state = self.step(ids[:, t], self.state)
        self.length = ids.size(1)
        return logits

    def reorder(self, index: Tensor) -> None:
        self.state = self.state.reorder(index)


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
    suppress_ids: tuple[int, ...] = ()  # never generated (e.g. ImageGPT's start token)

    @classmethod
    def from_settings(cls, settings, eos_id: int | None) -> GenerationConfig:
        """The fields a command's config (src.sample, src.translate) sets, and the end token."""
        names = [f.name for f in fields(cls) if f.name not in ("eos_id", "suppress_ids")]
        return cls(**{k: settings[k] for k in names}, eos_id=eos_id)


def _check_filter_args(top_k: int | None, top_p: float | None) -> None:
    if top_k is not None and top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 or None disables it), got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] (1.0 or None disables it), got {top_p}")


def _check_config(cfg: GenerationConfig) -> None:
    """Every field is checked whatever the strategy, so a mistyped config fails fast."""
    if cfg.strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {cfg.strategy!r}; expected one of {STRATEGIES}")
    integer, number, none = (int,), (int, float), (type(None),)
    for name, kinds in [("max_new_tokens", integer), ("beam_width", integer),
                        ("top_k", integer + none), ("temperature", number),
                        ("top_p", number + none), ("length_penalty", number)]:  # fmt: skip
        value = getattr(cfg, name)
        # a string from the command line would crash the comparisons below, NaN pass them all
        if isinstance(value, bool) or not isinstance(value, kinds) or value != value:
            kind = "an integer" if float not in kinds else "a number"
            raise ValueError(f"{name} must be {kind}, got {value!r}")
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
        rows = _beam_search(next_token_logits, prompt, cfg)
        pad = cfg.eos_id if cfg.eos_id is not None else 0  # rows only differ in length via eos
        return pad_sequence(rows, batch_first=True, padding_value=pad)
    return _greedy_or_sample(next_token_logits, prompt, cfg, generator)


def _reorder(next_token_logits: NextTokenLogits, index: Tensor) -> None:
    if hasattr(next_token_logits, "reorder"):  # a decoder that keeps per-row state
        next_token_logits.reorder(index)


def _greedy_or_sample(
    next_token_logits: NextTokenLogits,
    prompt: Tensor,
    cfg: GenerationConfig,
    generator: torch.Generator | None,
) -> Tensor:
    """Autoregressive loop, one token per step for the live rows: ids (B', T) -> (B', T + 1); a
    row that emits eos leaves the batch (the model no longer decodes it) and is padded with eos."""
    b, t0 = prompt.shape
    out = prompt.new_full((b, t0 + cfg.max_new_tokens), 0 if cfg.eos_id is None else cfg.eos_id)
    out[:, :t0] = prompt
    ids, rows = prompt, torch.arange(b, device=prompt.device)  # the live rows and their prompts
    for step in range(cfg.max_new_tokens):
        logits = next_token_logits(ids).float()  # (B', V); fp32 so low-precision models sample OK
        logits[:, list(cfg.suppress_ids)] = float("-inf")
        if cfg.strategy == "greedy":
            next_id = logits.argmax(dim=-1, keepdim=True)  # (B', 1)
        else:
            logits = filter_logits(logits / cfg.temperature, cfg.top_k, cfg.top_p)
            next_id = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
        out[rows, t0 + step] = next_id[:, 0]
        ids = torch.cat([ids, next_id], dim=1)
        if cfg.eos_id is not None and (ended := next_id[:, 0] == cfg.eos_id).any():
            if ended.all():
                break
            live = (~ended).nonzero()[:, 0]
            ids, rows = ids[live], rows[live]
            _reorder(next_token_logits, live)
    return out[:, : t0 + step + 1]


def _beam_search(
    next_token_logits: NextTokenLogits, prompt: Tensor, cfg: GenerationConfig
) -> list[Tensor]:
    """Beam search for every row of prompt (B, T0) at once; returns each row's best hypothesis
    (T0 + n,).

    A hypothesis scores sum(log p of its n generated tokens) / n**length_penalty: a raw sum of
    log probabilities only falls as a sequence grows, so without normalisation (alpha = 0)
    search favours stopping early at eos. Each row's beam holds beam_width hypotheses in all; one
    that emits eos is finished and keeps its slot, so the live beam narrows and width 1 is
    exactly greedy decoding. The live rows' beams are stacked, (B' * W', T), so one model call
    serves them all; a slot whose score is -inf is empty, and a row whose slots are all empty
    leaves the stack (the model no longer decodes it).
    """
    w, t0 = cfg.beam_width, prompt.size(1)
    beams = prompt  # (B' * W', T): live row i's hypotheses are rows i W' .. (i + 1) W' - 1
    rows = torch.arange(prompt.size(0), device=prompt.device)  # (B',) the live rows' prompts
    scores = torch.zeros(len(rows), 1, device=prompt.device)  # (B', W') sum of log p
    finished: list[list[tuple[float, Tensor]]] = [[] for _ in rows]  # (score, ids (T,))

    def finish(slots: Tensor) -> None:  # (B', W') bool: add these hypotheses to their rows'
        n = beams.size(1) - t0  # generated tokens, eos included; the same for all
        for i, j in slots.nonzero().tolist():
            hyp = beams[i * scores.size(1) + j]
            finished[rows[i]].append((scores[i, j].item() / n**cfg.length_penalty, hyp))

    for _ in range(cfg.max_new_tokens):
        b = len(rows)
        logits = next_token_logits(beams).float()
        logits[:, list(cfg.suppress_ids)] = float("-inf")
        logp = F.log_softmax(logits, dim=-1)  # (B' * W', V)
        vocab = logp.size(-1)
        candidates = (scores[..., None] + logp.view(b, -1, vocab)).view(b, -1)  # (B', W' V)
        k = min(w, candidates.size(1))
        scores, flat = candidates.topk(k)  # (B', k), best first
        # a row with f finished hypotheses searches on with its w - f best extensions only
        left = w - torch.tensor([len(finished[r]) for r in rows.tolist()], device=scores.device)
        scores = scores.masked_fill(torch.arange(k, device=scores.device) >= left[:, None],
                                    float("-inf"))  # fmt: skip
        parents = (torch.arange(b, device=flat.device)[:, None] * (len(beams) // b)
                   + flat // vocab)  # (B', k) rows of `beams`  # fmt: skip
        beams = torch.cat([beams[parents.flatten()], (flat % vocab).view(-1, 1)], dim=1)
        if cfg.eos_id is not None:
            ended = (beams[:, -1] == cfg.eos_id).view(b, k) & scores.isfinite()
            finish(ended)
            scores = scores.masked_fill(ended, float("-inf"))
        live = scores.isfinite().any(dim=1)  # (B',)
        if not live.any():
            break
        if not live.all():  # drop the finished rows before the next model call
            rows, scores, parents = rows[live], scores[live], parents[live]
            beams = beams.view(b, k, -1)[live].flatten(0, 1)
        _reorder(next_token_logits, parents.flatten())
    else:
        finish(scores.isfinite())
    return [max(f, key=lambda h: h[0])[1] for f in finished]
