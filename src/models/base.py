"""What the Transformer LightningModules (GPT, BERT) share: AdamW with warm-up and cosine decay,
a NaN check, the model class recorded in every checkpoint, and a token embedding initialised
from pre-trained word vectors (`model.embedding`)."""

from __future__ import annotations

import math

import pytorch_lightning as pl
import torch
from torch import Tensor, nn

from src.utils.checkpoint import class_path
from src.utils.errors import PipelineError


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


class TransformerModule(pl.LightningModule):
    """A LightningModule whose hparams hold `optim` (lr, betas, weight_decay, warmup_steps,
    decay_steps, min_lr)."""

    def configure_optimizers(self):
        o = self.hparams.optim
        opt = adamw(self, o)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, warmup_cosine(o["warmup_steps"], o["decay_steps"], o["min_lr"] / o["lr"])
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def setup(self, stage: str) -> None:
        # the chapter's "pre-trained layer" (sec. 12.2.1): word vectors, e.g. a word2vec run's,
        # as the token embedding of a word-level tokenizer; a resumed run's checkpoint then
        # restores the trained values over them
        emb = self.hparams.get("embedding") or {}
        if emb.get("init") and stage == "fit":
            from src.models.word2vec import init_token_embedding

            init_token_embedding(self.net.tok_emb, self.trainer.datamodule.tokenizer,
                                 emb["init"], emb.get("freeze", False))  # fmt: skip

    def on_train_start(self) -> None:
        # the model's size in metrics.json, beside what it buys
        self.log("params/total", float(sum(p.numel() for p in self.parameters())))

    def check_finite(self, loss: Tensor) -> None:
        if not torch.isfinite(loss):
            raise PipelineError(
                f"training loss became {loss.item()} at step {self.global_step}; "
                "lower model.optim.lr or check the data"
            )

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["model_class"] = class_path(self)
