"""GPT: a decoder-only Transformer trained as a causal language model (Bishop, sec. 12.3.2).

    p(x_1, ..., x_N) = prod_n p(x_n | x_1, ..., x_{n-1})

Token embeddings + positional encodings go through L masked (causal) Transformer layers; a linear
layer whose weights are tied to the token embedding matrix gives the logits of the next token.

ImageGPT (sec. 12.4.2) is the same model on images: pixels quantised to K codes (the image data
module's codebook, data.codes) and read in raster order as tokens.
"""

from __future__ import annotations

import dataclasses
import math

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanMetric

from src.models.base import TransformerModule
from src.models.generation import GenerationConfig, TokenDecoder, generate
from src.nn.transformer import TokenTransformer, TokenTransformerConfig

GPTConfig = TokenTransformerConfig  # GPT's hyper-parameters are the token Transformer's


class GPT(TokenTransformer):
    """The causal token Transformer, with the next-token distribution that generation samples."""

    def __init__(self, cfg: GPTConfig):
        super().__init__(cfg, causal=True)

    def next_token_logits(self, idx: Tensor) -> Tensor:
        """(B, T) -> (B, K): the distribution over x_{T+1}, seeing at most block_size tokens."""
        return self.forward(idx[:, -self.cfg.block_size :], last_only=True)[:, -1]


def flops_per_token(m: dict, params: float, vocab: int) -> float:
    """Training FLOPs per token: 6 N for the matrix multiplications of N non-embedding
    parameters (2 forward, 4 backward) plus 12 L D T for attention's QK^T and AV."""
    embedding = vocab * m["d_model"] + m["block_size"] * m["d_model"]
    return 6 * (params - embedding) + 12 * m["n_layer"] * m["d_model"] * m["block_size"]


class LanguageModelMetrics(pl.LightningModule):
    """val/ and test/ loss (nats per token), perplexity and bits per token of a causal language
    model over the data's evaluation windows (x, y). Subclasses give `_loss(batch)`."""

    def __init__(self):
        super().__init__()
        self.val_loss, self.test_loss = MeanMetric(), MeanMetric()

    def _loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        """x, y: (B, T) -> the mean cross-entropy of the next tokens y."""
        raise NotImplementedError

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self.val_loss.update(self._loss(batch), weight=batch[0].numel())

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self.test_loss.update(self._loss(batch), weight=batch[0].numel())

    def _log_eval(self, stage: str, metric: MeanMetric) -> None:
        loss = metric.compute()  # synchronised over processes
        metric.reset()
        self.log(f"{stage}/loss", loss, prog_bar=True, sync_dist=False)
        self.log(f"{stage}/ppl", loss.exp())
        self.log(f"{stage}/bits_per_token", loss / math.log(2))

    def on_validation_epoch_end(self) -> None:
        self._log_eval("val", self.val_loss)

    def on_test_epoch_end(self) -> None:
        self._log_eval("test", self.test_loss)


class LanguageModelModule(LanguageModelMetrics, TransformerModule):
    """Trains a causal language model on windows (x, y) of the token stream with AdamW, linear
    warm-up and cosine decay; logs loss, perplexity and lr. Subclasses give `_loss(batch)`."""

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = self._loss(batch)
        self.check_finite(loss)
        # each self.log costs ~0.3 ms, 1% of a small model's step: log on the steps the loggers
        # write (every trainer.log_every_n_steps) and the last; the progress bar shows the latest
        step, t = self.global_step + 1, self.trainer
        if step % t.log_every_n_steps == 0 or step == t.max_steps or t.is_last_batch:
            self.log("train/loss", loss, prog_bar=True)
            self.log("train/ppl", loss.exp())
            self.log("train/lr", self.optimizers().param_groups[0]["lr"])
        return loss


class GPTLitModule(LanguageModelModule):
    """Trains GPT; generates through the key/value cache."""

    def __init__(
        self,
        net: dict,
        optim: dict,
        vocab_size: int,
        generation: dict | None = None,
        compile: bool = False,
        embedding: dict | None = None,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.net = GPT(GPTConfig(**net, vocab_size=vocab_size))
        self.generation = GenerationConfig(**(generation or {}))

    def configure_model(self) -> None:
        if self.hparams.compile and not isinstance(
            self.net.transformer, torch._dynamo.OptimizedModule
        ):
            self.net.transformer = torch.compile(self.net.transformer)

    def forward(self, idx: Tensor) -> Tensor:
        return self.net(idx)

    def _loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch  # (B, T), (B, T)
        logits = self.net(x)  # (B, T, K)
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())

    def generate(
        self, prompt: Tensor, cfg: GenerationConfig | None = None, cache: bool = True, **kw
    ) -> Tensor:
        """prompt: (B, T0) -> (B, T0 + n); see src.models.generation for the strategies.
        cache=False re-runs the whole window for every token (the reference path)."""
        return generate(TokenDecoder(self.net, cache=cache), prompt, cfg or self.generation, **kw)


class ImageGPT(GPTLitModule):
    """GPT over images as code sequences (B, H W) (the image data module with data.codes=K):
    K codes and a start token (id K), a window of H W positions. Samples images from the start
    token alone, and completes images whose top half is given."""

    def __init__(
        self,
        net: dict,
        optim: dict,
        vocab_size: int,
        image_size: list[int],
        channels: int,
        codes: int,
        generation: dict | None = None,
        compile: bool = False,
        embedding: dict | None = None,
    ):
        net = {**net, "block_size": image_size[0] * image_size[1]}  # start + H W - 1 codes
        super().__init__(net, optim, vocab_size, generation, compile, embedding)
        # the start token begins an image and is never a pixel
        self.generation = dataclasses.replace(self.generation, suppress_ids=(codes,))

    @torch.no_grad()
    def sample_images(
        self, tops: Tensor, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """tops: (B, H W) codes of images whose top halves are kept -> (B, H W) samples from the
        start token alone, and (B, H W) completions of the top halves."""
        h, w = self.hparams.image_size
        start = tops.new_full((len(tops), 1), self.hparams.codes)  # (B, 1)
        half = h // 2 * w
        whole = dataclasses.replace(self.generation, max_new_tokens=h * w)
        samples = self.generate(start, whole, generator=generator)
        rest = dataclasses.replace(self.generation, max_new_tokens=h * w - half)
        completed = self.generate(torch.cat([start, tops[:, :half]], 1), rest, generator=generator)
        return samples[:, 1:], completed[:, 1:]
