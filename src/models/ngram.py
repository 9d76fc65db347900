"""N-gram language models: conditional distributions counted over windows of L tokens (Bishop,
Deep Learning, sec. 12.2.3-4).

A model of order L conditions each token on the L - 1 tokens before it only,

    p(x_1, ..., x_N) = prod_n p(x_n | x_{n-L+1}, ..., x_{n-1}),

and estimates each conditional from the counts c(h w) of a context h followed by the token w in
the training stream. Over K tokens the table has K^(L-1) contexts of K - 1 free parameters each:
it grows exponentially with L (the chapter's parameter explosion), while a stream of N tokens
shows at most N of them, so a long context is mostly unseen and everything rests on smoothing:

- add-k (Laplace for k = 1), a context never seen giving the uniform distribution:

    p(w | h) = (c(h w) + k) / (c(h) + k K),   c(h) = sum_w c(h w);

- interpolated Kneser-Ney (Chen & Goodman, 1999), with a discount D in (0, 1]:

    p(w | h) = max(c(h w) - D, 0) / c(h) + D N_1+(h .) / c(h) p(w | h'),

  h' being h without its first token and N_1+(h .) the number of distinct tokens seen after h;
  a context never seen gives p(w | h'). The lower orders count continuations instead,
  c(h w) -> N_1+(. h w), the number of distinct tokens seen before h w (a token that follows
  many contexts is a likely continuation of an unseen one), down to the uniform 1/K.

Fitting is one pass over the training split's token stream, no optimiser. The n-grams of order n
are numbered by their rank among the distinct n-grams seen; the one ending at position i has the
key (rank of the (n-1)-gram ending at i - 1) K + x_i, so np.unique builds each order from the
one below and a key stays below N K whatever L. Evaluation and generation look keys up with
searchsorted. A position t of a window sees only the window's tokens before it, as GPT does,
and uses the longest context they hold.
"""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from src.models.generation import GenerationConfig, generate
from src.models.gpt import LanguageModelMetrics
from src.utils.checkpoint import class_path
from src.utils.errors import PipelineError

log = logging.getLogger(__name__)

SMOOTHINGS = ("add_k", "kneser_ney")
# one training step with neither a loss to minimise nor parameters is the design here, not the
# mistake Lightning warns of
warnings.filterwarnings("ignore", message=r".*`training_step` returned `None`")
warnings.filterwarnings("ignore", message=r".*`parameters` is an empty generator")


def count_ngrams(stream: np.ndarray, order: int, vocab_size: int, continuation: bool = False):
    """The n-grams of orders n = 1..order in a token stream (N,): per order, their sorted keys
    (G_n,) int64 and counts (G_n,) int64. continuation=True (Kneser-Ney) replaces the counts of
    the orders below `order` by continuation counts N_1+(. g)."""
    x = np.asarray(stream, dtype=np.int64)
    ranks = np.zeros(len(x) + 1, dtype=np.int64)  # the empty context, before every position
    tables = []
    for n in range(1, order + 1):
        # ranks: the (n-1)-grams ending at positions n-2 .. N-1; the n-gram ending at i >= n-1
        # has the context ending at i - 1
        keys, new_ranks, counts = np.unique(
            ranks[:-1] * vocab_size + x[n - 1 :], return_inverse=True, return_counts=True
        )
        if continuation and n > 1:
            # each distinct n-gram once, at its suffix: the (n-1)-gram ending where it ends
            suffix = np.empty(len(keys), dtype=np.int64)
            suffix[new_ranks] = ranks[1:]
            tables[-1] = (tables[-1][0], np.bincount(suffix, minlength=len(tables[-1][0])))
        tables.append((keys, counts))
        ranks = new_ranks
    return tables


def find(keys: Tensor, query: Tensor) -> Tensor:
    """The index of each query in the sorted keys, -1 where absent."""
    if len(keys) == 0:
        return torch.full_like(query, -1)
    i = torch.searchsorted(keys, query).clamp_max(len(keys) - 1)
    return torch.where(keys[i] == query, i, -1)


class NGram(nn.Module):
    """Counts of orders 1..L as buffers (they travel in checkpoints), and the smoothed
    conditional distributions they give. `fit` fills them; until then every order is empty."""

    def __init__(self, order: int, vocab_size: int, smoothing: str, k: float, discount: float):
        super().__init__()
        self.order, self.vocab_size = order, vocab_size
        self.smoothing, self.k, self.discount = smoothing, k, discount
        for n in range(1, order + 1):
            for name in ("keys", "counts", "totals", "types"):
                self.register_buffer(f"{name}{n}", torch.zeros(0, dtype=torch.long))
        self.register_buffer("contexts", torch.zeros(order, dtype=torch.long))

    def table(self, n: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Order n: n-gram keys (G_n,), counts (G_n,), and per context, the (n-1)-grams, the
        counts' sum c(h) (G_{n-1},) and the number of tokens counted after it N_1+(h .)."""
        return tuple(getattr(self, f"{name}{n}") for name in ("keys", "counts", "totals", "types"))

    def fit(self, stream: np.ndarray) -> NGram:
        """Count the token stream (N,): one pass per order."""
        k = self.vocab_size
        tables = count_ngrams(stream, self.order, k, self.smoothing == "kneser_ney")
        n_contexts = 1  # the empty context of the unigrams
        for n, (keys, counts) in enumerate(tables, 1):
            context = keys // k  # (G_n,) rank of each n-gram's context among the (n-1)-grams
            totals = np.bincount(context, weights=counts, minlength=n_contexts)
            types = np.bincount(context, weights=counts > 0, minlength=n_contexts)
            for name, a in (("keys", keys), ("counts", counts), ("totals", totals),
                            ("types", types)):  # fmt: skip
                setattr(self, f"{name}{n}", torch.as_tensor(a.astype(np.int64)))
            self.contexts[n - 1] = len(np.unique(context))  # contexts followed by a token
            n_contexts = len(keys)
        return self

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # the tables' sizes are those of the fitted corpus, not of the empty ones made in __init__
        for name, buf in self._buffers.items():
            if prefix + name in state_dict:
                self._buffers[name] = buf.new_empty(state_dict[prefix + name].shape)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def ranks(self, x: Tensor) -> list[Tensor]:
        """x: (B, T) -> for n = 0..L-1, (B, T): the rank of the n-gram x[t-n+1..t] among those
        seen, -1 when unseen or when it would start before the window."""
        ranks = [torch.zeros_like(x)]
        for n in range(1, self.order):
            # the empty context precedes every position; no longer one precedes t = 0
            before = torch.full_like(x[:, :1], 0 if n == 1 else -1)
            context = torch.cat([before, ranks[-1][:, :-1]], 1)  # the (n-1)-gram ending at t-1
            # an unseen context (-1) makes a negative key, never found
            ranks.append(find(self.table(n)[0], context * self.vocab_size + x))
        return ranks

    def probs(self, contexts: list[Tensor], w: Tensor, available: Tensor) -> Tensor:
        """p(w | h): contexts, for n = 1..L, (M,) the rank of the n-1 tokens of h nearest w
        among the (n-1)-grams (-1: unseen); w (M, V) tokens; available (M,) how many tokens of
        h there are (fewer than L - 1 at a window's start) -> (M, V) float64."""
        p = torch.full(w.shape, 1 / self.vocab_size, dtype=torch.float64, device=w.device)
        by_order = []
        for n, context in enumerate(contexts, 1):
            keys, counts, totals, types = self.table(n)
            h = context[:, None]  # (M, 1)
            i = find(keys, h * self.vocab_size + w)  # (M, V)
            c_hw = torch.where(i >= 0, counts[i.clamp_min(0)], 0).double()
            c_h = torch.where(h >= 0, totals[h.clamp_min(0)], 0).double()  # (M, 1)
            if self.smoothing == "add_k":
                p = (c_hw + self.k) / (c_h + self.k * self.vocab_size)
            else:
                d = self.discount
                n_h = torch.where(h >= 0, types[h.clamp_min(0)], 0).double()
                kn = ((c_hw - d).clamp_min(0) + d * n_h * p) / c_h.clamp_min(1)
                p = torch.where(c_h > 0, kn, p)
            by_order.append(p)
        # the longest context the window holds; Kneser-Ney's missing ranks already fell back
        longest = available.clamp_max(self.order - 1)  # (M,) the order used, minus 1
        return torch.stack(by_order)[longest, torch.arange(len(w), device=w.device)]

    def _window_probs(self, x: Tensor, w: Tensor) -> Tensor:
        """x: (B, T) windows, w: (B T, V) candidate next tokens -> (B T, V) p(w | x_..t)."""
        available = torch.arange(1, x.size(1) + 1, device=x.device).expand_as(x)  # (B, T)
        return self.probs([r.flatten() for r in self.ranks(x)], w, available.flatten())

    def log_prob(self, x: Tensor, y: Tensor) -> Tensor:
        """x, y: (B, T) windows and their next tokens -> (B, T) log p(y_t | x_..t), float64."""
        return self._window_probs(x, y.reshape(-1, 1)).view_as(x).log()

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, T) -> (B, T, K) log p(x_{t+1} = k | x_..t), normalised over the K tokens."""
        b, t = x.shape
        w = torch.arange(self.vocab_size, device=x.device).expand(b * t, -1)  # (B T, K)
        return self._window_probs(x, w).view(b, t, -1).log().float()

    def next_token_logits(self, idx: Tensor) -> Tensor:
        """(B, T) -> (B, K): log p(x_{T+1} | the last L - 1 tokens), for generate()."""
        return self.forward(idx[:, -max(self.order - 1, 1) :])[:, -1]


class NGramLitModule(LanguageModelMetrics):
    """Fits the counts of the train split's whole token stream when fitting starts, then takes
    one step that only logs the training loss (no optimiser), then validates and tests like GPT:
    val/loss etc. in nats per token. Logs `params/contexts_order{n}` (the distinct contexts of
    n - 1 tokens seen) and plots them against the K^(n-1) possible (`ngram_contexts.png`)."""

    def __init__(
        self,
        order: int,
        vocab_size: int,
        smoothing: str = "kneser_ney",
        k: float = 1.0,
        discount: float = 0.75,
        max_tokens: int | None = None,
        generation: dict | None = None,
    ):
        super().__init__()
        if isinstance(order, bool) or not isinstance(order, int) or order < 1:
            raise PipelineError(f"model.order={order!r} must be a positive integer")
        if smoothing not in SMOOTHINGS:
            raise PipelineError(f"model.smoothing={smoothing!r}: choose one of {SMOOTHINGS}")
        if not k > 0:  # `not >`: NaN fails too
            raise PipelineError(f"model.k={k!r} must be positive (0 gives log 0 for unseen)")
        if not 0 < discount <= 1:
            raise PipelineError(f"model.discount={discount!r} must be in (0, 1]")
        if max_tokens is not None and max_tokens < order:
            raise PipelineError(f"model.max_tokens={max_tokens!r}: at least the order, or null")
        self.save_hyperparameters()
        self.net = NGram(order, vocab_size, smoothing, k, discount)
        self.generation = GenerationConfig(**(generation or {}))

    def configure_optimizers(self) -> None:
        return None  # counting needs no optimiser

    def forward(self, idx: Tensor) -> Tensor:
        return self.net(idx)

    def setup(self, stage: str) -> None:
        if self.trainer.world_size > 1:  # DDP refuses a module without trainable parameters
            raise PipelineError(
                "model=ngram counts in one process (seconds for a million tokens): run it with "
                "trainer.devices=1, not a multi-process trainer"
            )

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["model_class"] = class_path(self)

    def on_fit_start(self) -> None:
        stream = self.trainer.datamodule.splits["train"].data  # (N,) memmap of the whole split
        stream = stream[: self.hparams.max_tokens]  # a data budget (bench/ladder.py)
        start = time.perf_counter()
        self.net.fit(stream)
        self.net.to(self.device)
        k = self.net.vocab_size
        log.info("counted orders 1-%d of %d train tokens in %.2f s",
                 self.net.order, len(stream), time.perf_counter() - start)  # fmt: skip
        for n, seen in enumerate(self.net.contexts.tolist(), 1):
            log.info("order %d: %d distinct contexts seen of K^%d = %.3g possible",
                     n, seen, n - 1, float(k) ** (n - 1))  # fmt: skip
        if self.trainer.is_global_zero:
            from src.utils.callbacks import log_image

            path = Path(self.trainer.default_root_dir) / "ngram_contexts.png"
            plot_contexts(self.net.contexts.tolist(), k, len(stream), path)
            log_image(self.trainer, "params/contexts", path)

    def on_train_start(self) -> None:
        for n, seen in enumerate(self.net.contexts.tolist(), 1):
            self.log(f"params/contexts_order{n}", float(seen))
        # the distinct n-grams counted, all orders: the model's size, beside what it buys
        stored = sum(len(self.net.table(n)[0]) for n in range(1, self.net.order + 1))
        self.log("params/total", float(stored))

    def _loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch  # (B, T), (B, T)
        return -self.net.log_prob(x, y).mean()

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        # the counts are the fit: this one step shows the loss on training windows, then stops
        loss = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/ppl", loss.exp())
        self.trainer.should_stop = True

    def generate(self, prompt: Tensor, cfg: GenerationConfig | None = None, **kw) -> Tensor:
        """prompt: (B, T0) -> (B, T0 + n); see src.models.generation for the strategies."""
        return generate(self.net.next_token_logits, prompt, cfg or self.generation, **kw)


def plot_contexts(contexts: list[int], vocab_size: int, tokens: int, path: Path) -> None:
    """The distinct contexts seen per order L against the K^(L-1) possible, log scale; no
    corpus of N tokens shows more than N."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    orders = np.arange(1, len(contexts) + 1)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.semilogy(
        orders, float(vocab_size) ** (orders - 1), "o--", label=f"possible, K^(L-1), K={vocab_size}"
    )
    ax.semilogy(orders, contexts, "o-", label="seen in the train split")
    ax.axhline(tokens, color="gray", lw=0.8, ls=":", label=f"train tokens N = {tokens:,}")
    ax.set_xticks(orders)
    ax.set_xlabel("order L")
    ax.set_ylabel("contexts of L - 1 tokens")
    ax.set_title("n-gram contexts: the parameter explosion")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
