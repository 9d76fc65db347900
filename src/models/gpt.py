"""GPT: a decoder-only Transformer trained as a causal language model (Bishop, sec. 12.3.2).

    p(x_1, ..., x_N) = prod_n p(x_n | x_1, ..., x_{n-1})

Token embeddings + positional encodings go through L masked (causal) Transformer layers; a linear
layer whose weights are tied to the token embedding matrix gives the logits of the next token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanMetric

from src.models.generation import GenerationConfig, generate
from src.nn.positional import positional_encoding
from src.nn.transformer import Transformer, TransformerConfig
from src.utils.checkpoint import class_path
from src.utils.errors import PipelineError


@dataclass
class GPTConfig(TransformerConfig):
    vocab_size: int = 256  # K, set from the tokenizer by the data module
    block_size: int = 128  # the context window: the longest sequence the model sees
    pos_encoding: str = "learned"  # "learned", "sinusoidal" or "none"
    pos_base: float = 10000.0  # L in the sinusoidal encoding
    tie_weights: bool = True  # share the token embedding and output matrices


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_enc = positional_encoding(
            cfg.pos_encoding, cfg.d_model, cfg.block_size, cfg.pos_base
        )
        self.drop = nn.Dropout(cfg.dropout)
        self.transformer = Transformer(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.lm_head.weight = self.tok_emb.weight  # fewer parameters, better perplexity
        self.apply(self._init_weights)
        # GPT-2: scale the projections into the residual stream by 1/sqrt(2L) so that the
        # variance of the residual sum does not grow with depth
        for name, p in self.named_parameters():
            if name.endswith(("w_o.weight", "mlp.2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: Tensor, last_only: bool = False) -> Tensor:
        """idx: (B, T) token ids, T <= block_size -> logits (B, T, K), or (B, 1, K) if last_only."""
        t = idx.size(1)
        if t > self.cfg.block_size:
            raise ValueError(f"sequence of {t} tokens exceeds block_size {self.cfg.block_size}")
        x = self.tok_emb(idx)  # (B, T, D)
        if self.pos_enc is not None:
            x = x + self.pos_enc(torch.arange(t, device=idx.device))
        x = self.transformer(self.drop(x), causal=True)
        if last_only:  # generation needs only the next token: skip T-1 rows of the K-way head
            x = x[:, -1:]
        return self.lm_head(x)

    def next_token_logits(self, idx: Tensor) -> Tensor:
        """(B, T) -> (B, K): the distribution over x_{T+1}, seeing at most block_size tokens."""
        return self.forward(idx[:, -self.cfg.block_size :], last_only=True)[:, -1]


class GPTLitModule(pl.LightningModule):
    """Trains GPT with AdamW, linear warm-up and cosine decay; logs loss, perplexity and lr."""

    def __init__(
        self,
        net: dict,
        optim: dict,
        vocab_size: int,
        generation: dict | None = None,
        compile: bool = False,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.net = GPT(GPTConfig(**net, vocab_size=vocab_size))
        self.generation = GenerationConfig(**(generation or {}))
        self.val_loss, self.test_loss = MeanMetric(), MeanMetric()

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

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = self._loss(batch)
        if not torch.isfinite(loss):
            raise PipelineError(
                f"training loss became {loss.item()} at step {self.global_step}; "
                "lower model.optim.lr or check the data"
            )
        # each self.log costs ~0.3 ms, 1% of a small model's step: log on the steps the loggers
        # write (every trainer.log_every_n_steps) and the last; the progress bar shows the latest
        step, t = self.global_step + 1, self.trainer
        if step % t.log_every_n_steps == 0 or step == t.max_steps or t.is_last_batch:
            self.log("train/loss", loss, prog_bar=True)
            self.log("train/ppl", loss.exp())
            self.log("train/lr", self.optimizers().param_groups[0]["lr"])
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self.val_loss.update(self._loss(batch), weight=batch[0].numel())

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self.test_loss.update(self._loss(batch), weight=batch[0].numel())

    def _log_eval(self, stage: str, metric: MeanMetric) -> None:
        loss = metric.compute()  # synchronised over processes
        metric.reset()
        self.log(f"{stage}/loss", loss, prog_bar=True, sync_dist=False)
        self.log(f"{stage}/ppl", loss.exp())

    def on_validation_epoch_end(self) -> None:
        self._log_eval("val", self.val_loss)

    def on_test_epoch_end(self) -> None:
        self._log_eval("test", self.test_loss)

    def generate(self, prompt: Tensor, cfg: GenerationConfig | None = None, **kw) -> Tensor:
        """prompt: (B, T0) -> (B, T0 + n); see src.models.generation for the strategies."""
        return generate(self.net.next_token_logits, prompt, cfg or self.generation, **kw)

    def configure_optimizers(self):
        o = self.hparams.optim
        opt = adamw(self, o)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, warmup_cosine(o["warmup_steps"], o["decay_steps"], o["min_lr"] / o["lr"])
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["model_class"] = class_path(self)


def adamw(model: nn.Module, o: dict) -> torch.optim.AdamW:
    """AdamW that decays matrices only: biases, LayerNorm gains and the like are not pulled
    toward 0 (nanoGPT's and GPT-2's choice)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": o["weight_decay"]},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=o["lr"], betas=tuple(o["betas"]))


def warmup_cosine(warmup: int, decay: int, min_ratio: float):
    """lr multiplier: linear warm-up over `warmup` steps, cosine down to `min_ratio` at `decay`."""

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, decay - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f
