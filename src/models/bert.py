"""BERT: a bidirectional Transformer encoder, pre-trained as a masked language model and then
fine-tuned (Bishop, Deep Learning, sec. 12.3.3).

Pre-training (`model=bert data=text`): 15% of the tokens are chosen; of those, 80% become
<mask>, 10% a random token and 10% stay as they are, and the loss is the cross-entropy of the
original tokens at the chosen positions only. Every position sees the whole sequence, so the
model learns from context on both sides.

Fine-tuning (`model=bert_cls data=text_cls`, `model=bert_tagger data=text_tag`): a linear layer +
softmax on the output of the first token, <cls>, classifies the sequence (or, with
`model.pool=mean`, on the mean of the outputs of its real tokens); the same linear layer
shared by every position labels tokens. The encoder starts from a pre-trained checkpoint
(`model.pretrained=PATH`) or from scratch, and with `model.lora.rank=R` only low-rank adapters
of its weights are trained (sec. 12.3.x, LoRA).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

from src.data.text import CLS_ID, MASK_ID, PAD_ID, SPECIAL_TOKENS, checkpoint_tokenizer
from src.data.text_cls import IGNORE
from src.models.base import TransformerModule
from src.nn.lora import add_lora, count_parameters, merge_lora
from src.nn.transformer import TokenTransformer, TokenTransformerConfig
from src.utils.checkpoint import class_path, load_checkpoint
from src.utils.errors import PipelineError

log = logging.getLogger(__name__)

N_SPECIAL = len(SPECIAL_TOKENS)  # ids below this are <pad>, <cls>, <mask>, ...: never chosen


def mask_tokens(
    ids: Tensor,
    vocab_size: int,
    p: float = 0.15,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """BERT's corruption of a batch of token ids (B, T) -> (inputs, targets), both (B, T).

    Each ordinary token (not <pad>, <cls> or another special token) is chosen with probability
    p; a chosen token becomes <mask> with probability 0.8, a uniformly random ordinary token with
    probability 0.1, and stays with probability 0.1. targets holds the original token at the
    chosen positions and IGNORE elsewhere, so the loss sees the chosen tokens only.
    """

    def uniform() -> Tensor:
        return torch.rand(ids.shape, generator=generator, device=ids.device)

    chosen = (uniform() < p) & (ids >= N_SPECIAL)
    targets = ids.masked_fill(~chosen, IGNORE)
    r = uniform()  # one draw splits the chosen tokens 80 / 10 / 10
    to_mask = chosen & (r < 0.8)
    to_random = chosen & (r >= 0.8) & (r < 0.9)
    random_ids = torch.randint(
        N_SPECIAL, vocab_size, ids.shape, generator=generator, device=ids.device
    )
    inputs = ids.masked_fill(to_mask, MASK_ID)
    inputs = torch.where(to_random, random_ids, inputs)
    return inputs, targets


def as_ids(batch) -> Tensor:
    """The token ids of a batch: `input_ids` of a labelled batch, or x of a language-model
    window (x, y) from data=text, whose first token is replaced by <cls> so that pre-training
    sees sequences shaped like the fine-tuning ones."""
    if isinstance(batch, dict):
        return batch["input_ids"]
    ids = batch[0].clone()
    ids[:, 0] = CLS_ID
    return ids


def encode(net: TokenTransformer, ids: Tensor) -> Tensor:
    """ids: (B, T) -> the encoder's outputs (B, T, D); no position attends to <pad>."""
    return net.hidden(ids, key_padding_mask=ids == PAD_ID)


class BertMLM(TransformerModule):
    """Masked-LM pre-training of a bidirectional encoder; logs loss and masked-token accuracy."""

    def __init__(
        self,
        net: dict,
        optim: dict,
        vocab_size: int,
        mask_prob: float = 0.15,
        embedding: dict | None = None,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.net = TokenTransformer(TokenTransformerConfig(**net, vocab_size=vocab_size), False)
        self.eval_loss, self.eval_acc = MeanMetric(), MeanMetric()

    def forward(self, ids: Tensor) -> Tensor:
        """ids: (B, T) -> logits (B, T, K) over the vocabulary at every position."""
        return self.net.lm_head(encode(self.net, ids))

    def _step(self, batch, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        ids = as_ids(batch)  # (B, T)
        inputs, targets = mask_tokens(ids, self.hparams.vocab_size, self.hparams.mask_prob,
                                      generator)  # fmt: skip
        chosen = targets != IGNORE  # (B, T), ~15% True
        h = encode(self.net, inputs)  # (B, T, D)
        # the K-way head only where the loss looks, not at all T positions: a faster step
        logits = self.net.lm_head(h[chosen])  # (N, K)
        loss = F.cross_entropy(logits, targets[chosen])
        acc = (logits.argmax(-1) == targets[chosen]).float().mean()
        return loss, acc

    def training_step(self, batch, batch_idx: int) -> Tensor:
        loss, acc = self._step(batch)
        self.check_finite(loss)
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/masked_acc", acc)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"])
        return loss

    def _eval_step(self, batch, batch_idx: int) -> None:
        # the same masks in every evaluation, so that val/loss is comparable across epochs
        g = torch.Generator(self.device).manual_seed(batch_idx)
        loss, acc = self._step(batch, g)
        n = as_ids(batch).numel()
        self.eval_loss.update(loss, weight=n)
        self.eval_acc.update(acc, weight=n)

    def _log_eval(self, stage: str) -> None:
        self.log(f"{stage}/loss", self.eval_loss.compute(), prog_bar=True)
        self.log(f"{stage}/masked_acc", self.eval_acc.compute())
        self.eval_loss.reset()
        self.eval_acc.reset()

    validation_step = test_step = _eval_step

    def on_validation_epoch_end(self) -> None:
        self._log_eval("val")

    def on_test_epoch_end(self) -> None:
        self._log_eval("test")


class BertClassifier(TransformerModule):
    """Fine-tuning: sequence labels from the <cls> output or the mean output (task cls, `pool`),
    or a label per token (task tag), through one linear layer. Logs cross-entropy, accuracy and
    macro-F1."""

    def __init__(
        self,
        net: dict,
        optim: dict,
        vocab_size: int,
        num_classes: int,
        task: str = "cls",
        pool: str = "cls",
        head_dropout: float = 0.1,
        pretrained: str | None = None,
        lora: dict | None = None,
    ):
        super().__init__()
        self.save_hyperparameters()
        if task not in ("cls", "tag"):
            raise PipelineError(f"model.task={task!r}: choose cls (sequence) or tag (tokens)")
        if pool not in ("cls", "mean"):
            raise PipelineError(f"model.pool={pool!r}: choose cls (the <cls> output) or mean")
        ckpt = (
            load_checkpoint(pretrained, expected_class=class_path(BertMLM)) if pretrained else None
        )
        if ckpt is not None:  # the encoder's shape is the pre-trained one; dropout is ours
            shape = ckpt.get("hyper_parameters", {}).get("net", net)
            net = self.hparams.net = {**shape, "dropout": net.get("dropout", 0.0)}
        self.net = TokenTransformer(TokenTransformerConfig(**net, vocab_size=vocab_size), False)
        self._pretrained_tokenizer: str | None = None  # set by _load_encoder, checked in setup()
        if ckpt is not None:
            self._load_encoder(pretrained, ckpt)
        d = self.net.cfg.d_model
        self.head = nn.Sequential(nn.Dropout(head_dropout), nn.Linear(d, num_classes))  # D -> C
        lora = lora or {}
        if lora.get("rank"):
            # only the adapters and the head learn: W_0 and the embeddings stay as pre-trained
            self.net.requires_grad_(False)
            add_lora(self.net.transformer, lora["targets"], lora["rank"], lora["alpha"],
                     lora.get("dropout", 0.0))  # fmt: skip
            if lora.get("lr"):
                self.hparams.optim = {**optim, "lr": lora["lr"]}
        metrics = {
            "acc": lambda: MulticlassAccuracy(num_classes, average="micro", ignore_index=IGNORE),
            "f1": lambda: MulticlassF1Score(num_classes, average="macro", ignore_index=IGNORE),
        }
        self.metrics = nn.ModuleDict(
            {f"{s}_{m}": make() for s in ("val", "test") for m, make in metrics.items()}
        )

    def _load_encoder(self, path: str, ckpt: dict) -> None:
        state = {k[4:]: v for k, v in ckpt["state_dict"].items() if k.startswith("net.")}
        try:
            self.net.load_state_dict(state)
        except RuntimeError as e:
            reason = next(ln.strip() for ln in str(e).splitlines()[1:] if ln.strip())
            raise PipelineError(
                f"the pre-trained encoder in {path} does not fit the data's tokenizer ({reason})"
            ) from None
        # the tokenizer the encoder learnt its embeddings with (in the text data module's state);
        # setup() checks that the fine-tuning data encodes text with the same one
        self._pretrained_tokenizer = checkpoint_tokenizer(ckpt)
        log.info("encoder initialised from %s", path)

    def setup(self, stage: str) -> None:
        # same vocabulary size, other tokenizer: every embedding would be silently misread
        tok, data = self._pretrained_tokenizer, self.trainer.datamodule
        if tok and getattr(data, "tokenizer", None) and data.tokenizer.to_str() != tok:
            raise PipelineError(
                f"the pre-trained encoder in {self.hparams.pretrained} learnt another tokenizer "
                "than the data's; set data.tokenizer_file=<pre-training data>/tokenizer.json"
            )

    def forward(self, ids: Tensor) -> Tensor:
        """ids: (B, T) -> logits (B, C) for task cls, (B, T, C) for task tag."""
        h = encode(self.net, ids)  # (B, T, D)
        if self.hparams.task == "tag":
            return self.head(h)
        if self.hparams.pool == "cls":
            return self.head(h[:, 0])
        real = (ids != PAD_ID).unsqueeze(-1).to(h.dtype)  # (B, T, 1)
        return self.head((h * real).sum(1) / real.sum(1).clamp(min=1))  # mean of non-pad: (B, D)

    def _step(self, batch: dict) -> tuple[Tensor, Tensor, Tensor]:
        ids, labels = batch["input_ids"], batch["labels"]
        if (labels.dim() == 2) != (self.hparams.task == "tag"):
            kind = "token" if labels.dim() == 2 else "sequence"
            raise PipelineError(
                f"the data has {kind} labels but model.task={self.hparams.task}; use "
                "model=bert_tagger with data=text_tag, model=bert_cls with data=text_cls"
            )
        logits = self(ids)
        loss = F.cross_entropy(logits.flatten(0, -2), labels.flatten(), ignore_index=IGNORE)
        return loss, logits.flatten(0, -2), labels.flatten()

    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        loss, _, _ = self._step(batch)
        self.check_finite(loss)
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch["input_ids"]))
        return loss

    def _eval_step(self, stage: str, batch: dict) -> None:
        loss, logits, labels = self._step(batch)
        n = len(batch["input_ids"])
        self.log(f"{stage}/loss", loss, batch_size=n)
        for m in ("acc", "f1"):
            metric = self.metrics[f"{stage}_{m}"]
            metric.update(logits, labels)
            self.log(f"{stage}/{m}", metric, prog_bar=m == "acc", batch_size=n)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step("val", batch)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step("test", batch)

    def on_train_start(self) -> None:
        super().on_train_start()
        trainable, total = count_parameters(self)
        log.info("trainable parameters: %d of %d (%.2f%%)", trainable, total,
                 100 * trainable / total)  # fmt: skip
        # in metrics.json too, beside the accuracy they buy
        self.log("params/trainable", float(trainable))
        self.log("params/fraction", trainable / total)

    def merged(self) -> BertClassifier:
        """This model with every LoRA adapter folded into its weight, W_0 + (alpha/R) A B."""
        merge_lora(self.net)
        return self
