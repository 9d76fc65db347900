"""Image classification (Bishop, Deep Learning, sec. 12.4.1): the vision Transformer, and a small
CNN beside it as the baseline with the inductive biases the Transformer lacks.

ViT (`model=vit`): the image is cut into P x P patches, each flattened and mapped linearly to a
token (src.nn.patch); a learned class token is put in front, positions are added (learned, or a
fixed 2-D sinusoidal encoding), the Transformer encoder of src.nn.transformer reads the N + 1
tokens, and a linear layer classifies the class token's output. Nothing in it knows that nearby
pixels are related: it learns that from data, unless `conv_positions` puts a depthwise
convolution of each patch's neighbours before the first layers.

CNN (`model=cnn`): convolution blocks (3 x 3 convolution, BatchNorm, ReLU, 2 x 2 max pooling)
and a linear layer on the globally averaged features: locality and translation equivariance
are built in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import (
    MulticlassAccuracy,
    MulticlassConfusionMatrix,
    MulticlassF1Score,
)

from src.models.base import TransformerModule
from src.nn.patch import PatchEmbedding
from src.nn.positional import (
    ConvPositionGenerator,
    RelativePositionBias2D,
    SinusoidalPositionalEncoding2D,
)
from src.nn.transformer import Transformer, TransformerConfig
from src.utils.errors import PipelineError


@dataclass
class ViTConfig(TransformerConfig):
    image_size: tuple[int, int] = (28, 28)  # (H, W), set by the data
    channels: int = 1  # C, set by the data
    num_classes: int = 10  # set by the data
    patch_size: int = 4  # P
    patch_stride: int | None = None  # S; None = P (no overlap)
    pos_encoding: str = "learned"  # learned | sinusoidal (2-D, fixed) | none
    relative_bias: bool = False  # attention biases by the patches' 2-D offset, beside pos_encoding
    conv_positions: int = 0  # the first layers each preceded by a ConvPositionGenerator


class ViT(nn.Module):
    """(B, C, H, W) images -> logits (B, classes) from the class token's output."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.cfg, d = cfg, cfg.d_model
        self.patches = PatchEmbedding(cfg.image_size, cfg.channels, cfg.patch_size, d,
                                      cfg.patch_stride)  # fmt: skip
        n = self.patches.num_patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        if cfg.pos_encoding == "learned":  # one vector per patch position and the class token
            self.pos = nn.Parameter(torch.randn(1, n + 1, d) * 0.02)
        elif cfg.pos_encoding == "sinusoidal":  # the class token has no position: zeros
            grid = SinusoidalPositionalEncoding2D(d, self.patches.grid).r  # (N, D)
            self.register_buffer("pos", torch.cat([torch.zeros(1, d), grid])[None], False)
        elif cfg.pos_encoding == "none":
            self.pos = None
        else:
            raise PipelineError(
                f"model.net.pos_encoding={cfg.pos_encoding!r}: choose learned, sinusoidal or none"
            )
        self.rel = None  # biases of the attention scores by offset, beside the positions above
        if cfg.relative_bias:
            self.rel = RelativePositionBias2D(cfg.n_head, self.patches.grid)
        if not 0 <= cfg.conv_positions <= cfg.n_layer:
            raise PipelineError(f"model.net.conv_positions={cfg.conv_positions}: the first "
                                f"layers (0-{cfg.n_layer}) preceded by a convolution")  # fmt: skip
        self.conv_pos = nn.ModuleList(ConvPositionGenerator(d) for _ in range(cfg.conv_positions))
        self.drop = nn.Dropout(cfg.dropout)
        self.transformer = Transformer(cfg)
        self.head = nn.Linear(d, cfg.num_classes)

    def hidden(self, images: Tensor, lengths: Tensor | None = None) -> Tensor:
        """(B, C, H, W) -> the encoder's outputs (B, 1 + N, D), the class token's first.

        Narrower images (the spectrograms of a batch of short recordings, padded to its
        longest) are read as the first columns of the patch grid, with those columns'
        positions; lengths (B,), the columns of each image before its padding, masks the
        patches that start after them."""
        rows, cols = self.patches.grid
        p, s = self.patches.patch, self.patches.stride
        width = images.shape[-1]
        used = -(-max(width - p, 0) // s) + 1  # the grid columns that cover the width
        if width < p + (used - 1) * s:  # padded on the right to them
            images = F.pad(images, (0, p + (used - 1) * s - width))
        x = self.patches(images)  # (B, rows x used, D), row by row
        x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], dim=1)  # (B, 1 + N, D)
        if self.pos is not None:
            pos = self.pos
            if used < cols:  # the positions of the first `used` columns of every row
                grid = pos[:, 1:].unflatten(1, (rows, cols))[:, :, :used].flatten(1, 2)
                pos = torch.cat([pos[:, :1], grid], dim=1)
            x = x + pos
        mask = None
        if lengths is not None:  # True at the patches that start in the padding
            after = torch.arange(used, device=x.device) * s >= lengths[:, None]  # (B, used)
            mask = torch.cat([after.new_zeros(len(x), 1),
                              after[:, None].expand(-1, rows, -1).flatten(1)], dim=1)  # fmt: skip
        bias = self.rel(used) if self.rel is not None else None  # (H, 1 + N, 1 + N)
        x = self.drop(x)
        for i, layer in enumerate(self.transformer.layers):
            if i < len(self.conv_pos):
                x = self.conv_pos[i](x, (rows, used), mask)
            x = layer(x, key_padding_mask=mask, attn_bias=bias)
        return self.transformer.norm(x)

    def forward(self, images: Tensor, lengths: Tensor | None = None) -> Tensor:
        return self.head(self.hidden(images, lengths)[:, 0])  # (B, classes)


@dataclass
class CNNConfig:
    image_size: tuple[int, int] = (28, 28)
    channels: int = 1
    num_classes: int = 10
    widths: tuple[int, ...] = (32, 64, 128)  # output channels of each block
    dropout: float = 0.0  # before the linear layer


class CNN(nn.Module):
    """(B, C, H, W) -> logits (B, classes): conv blocks, global average pooling, linear."""

    def __init__(self, cfg: CNNConfig):
        super().__init__()
        blocks, c = [], cfg.channels
        for i, w in enumerate(cfg.widths):
            side = min(cfg.image_size) // 2**i
            pool = [nn.MaxPool2d(2)] if side >= 2 else []  # an 8 x 8 image cannot halve 4 times
            blocks += [nn.Conv2d(c, w, 3, padding=1), nn.BatchNorm2d(w), nn.ReLU(), *pool]
            c = w
        self.features = nn.Sequential(*blocks)
        self.head = nn.Sequential(nn.Dropout(cfg.dropout), nn.Linear(c, cfg.num_classes))
        # NHWC weights: oneDNN's convolutions run ~1.5x faster on CPU (a one-channel image
        # cannot be NHWC itself; the weights carry the format to every activation after it)
        self.to(memory_format=torch.channels_last)

    def forward(self, images: Tensor, lengths: Tensor | None = None) -> Tensor:
        """lengths (B,): the columns of each image before its padding (spectrograms batched by
        length); the features after them are left out of the average."""
        h = self.features(images)  # (B, C', H', W')
        if lengths is None:
            return self.head(h.mean(dim=(2, 3)))
        seen = -(-lengths * h.shape[-1] // images.shape[-1])  # feature columns that see the image
        keep = (torch.arange(h.shape[-1], device=h.device) < seen[:, None]).to(h.dtype)  # (B, W')
        pooled = (h.mean(2) * keep[:, None]).sum(-1) / keep.sum(-1, keepdim=True)  # (B, C')
        return self.head(pooled)


def build_net(net: dict, **sizes) -> ViT | CNN:
    """net.arch: vit (the default) | cnn; sizes: image_size, channels, num_classes."""
    net = dict(net)
    sizes["image_size"] = tuple(sizes["image_size"])
    if net.pop("arch", "vit") == "cnn":
        return CNN(CNNConfig(**net, **sizes))
    return ViT(ViTConfig(**net, **sizes))


class ImageClassifier(TransformerModule):
    """Cross-entropy training of a ViT or CNN with AdamW, warm-up and cosine decay, optionally
    with label smoothing, and mixup or CutMix (see `mixed`); logs loss, accuracy and macro-F1 on
    every split. With a teacher (the checkpoint of a classifier trained on the same data, say the
    CNN), DeiT's hard distillation (Touvron et al. 2021): the teacher's label of each training
    input, augmented and mixed as the student sees it, is a second target, weighted by `distill`;
    a Transformer learns the convolution's biases from it."""

    def __init__(self, net: dict, optim: dict, image_size, channels: int, num_classes: int,
                 mixup: float = 0.0, label_smoothing: float = 0.0, teacher: str | None = None,
                 distill: float = 0.5, cutmix: float = 0.0):  # fmt: skip
        super().__init__()
        self.save_hyperparameters()
        self.net = build_net(net, image_size=image_size, channels=channels,
                             num_classes=num_classes)  # fmt: skip
        self.metrics = nn.ModuleDict({
            f"{s}_{m}": MulticlassAccuracy(num_classes, average="micro") if m == "acc"
            else MulticlassF1Score(num_classes, average="macro")
            for s in ("val", "test") for m in ("acc", "f1")
        })  # fmt: skip
        self.confusion = MulticlassConfusionMatrix(num_classes)  # test split; plotted by ImagePlots
        if not 0 <= distill <= 1:
            raise PipelineError(f"model.distill={distill}: the teacher's share of the loss, 0-1")
        self.teacher: nn.Module | None = None  # loaded at fit start from model.teacher

    def on_fit_start(self) -> None:
        hp = self.hparams
        if hp.teacher:  # not a submodule: checkpoints hold the student alone
            net = load_classifier(hp.teacher, hp.image_size, hp.num_classes,
                                  self.trainer.datamodule).to(self.device)  # fmt: skip
            object.__setattr__(self, "teacher", net)

    def forward(self, images: Tensor, lengths: Tensor | None = None) -> Tensor:
        return self.net(images, lengths)

    def mixed(self, x: Tensor) -> tuple[Tensor, Tensor | None, float]:
        """The batch x (B, C, H, W) mixed with a shuffled copy of itself, the shuffle and lambda,
        the original's share, ~ Beta(alpha, alpha): mixup (Zhang et al. 2018) a convex mix of
        the two images, CutMix (Yun et al. 2019) a box of the other image pasted in, lambda then
        the share of pixels kept. With both alphas set, one of them per batch, as DeiT does. The
        targets are mixed alike, in the loss."""
        hp = self.hparams
        kinds = [(k, a) for k, a in (("mixup", hp.mixup), ("cutmix", hp.cutmix)) if a]
        if not kinds:
            return x, None, 1.0
        kind, alpha = kinds[int(torch.randint(len(kinds), ()))]
        lam = float(torch.distributions.Beta(alpha, alpha).sample())
        perm = torch.randperm(len(x), device=x.device)
        if kind == "mixup":
            return lam * x + (1 - lam) * x[perm], perm, lam
        h, w = x.shape[-2:]
        side = (1 - lam) ** 0.5  # the box's share of each side
        cy, cx = int(torch.randint(h, ())), int(torch.randint(w, ()))
        top, bottom = max(cy - round(h * side / 2), 0), min(cy + round(h * side / 2), h)
        left, right = max(cx - round(w * side / 2), 0), min(cx + round(w * side / 2), w)
        x = x.clone()
        x[..., top:bottom, left:right] = x[perm][..., top:bottom, left:right]
        return x, perm, 1 - (bottom - top) * (right - left) / (h * w)

    def training_step(self, batch, batch_idx: int) -> Tensor:
        x, y, lengths = unpack(batch)
        smooth = self.hparams.label_smoothing
        x, perm, lam = self.mixed(x)
        if perm is not None and lengths is not None:  # a mix is as long as its longer part
            lengths = torch.maximum(lengths, lengths[perm])
        logits = self(x, lengths)
        loss = lam * F.cross_entropy(logits, y, label_smoothing=smooth)
        if perm is not None:  # trained toward the same mix of labels
            loss = loss + (1 - lam) * F.cross_entropy(logits, y[perm], label_smoothing=smooth)
        if self.teacher is not None:  # DeiT: the teacher's label of the same input, a 2nd target
            with torch.no_grad():
                y_teacher = self.teacher(x, lengths).argmax(-1)
            w = self.hparams.distill
            loss = (1 - w) * loss + w * F.cross_entropy(logits, y_teacher)
        self.check_finite(loss)
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/acc", (logits.argmax(-1) == y).float().mean())
        self.log("train/lr", self.optimizers().param_groups[0]["lr"])
        return loss

    def _eval_step(self, stage: str, batch) -> Tensor:
        x, y, lengths = unpack(batch)
        logits = self(x, lengths)
        self.log(f"{stage}/loss", F.cross_entropy(logits, y), prog_bar=True, batch_size=len(y))
        for m in ("acc", "f1"):
            metric = self.metrics[f"{stage}_{m}"]
            metric.update(logits, y)
            self.log(f"{stage}/{m}", metric, prog_bar=m == "acc", batch_size=len(y))
        return logits

    def validation_step(self, batch, batch_idx: int) -> None:
        self._eval_step("val", batch)

    def test_step(self, batch, batch_idx: int) -> None:
        self.confusion.update(self._eval_step("test", batch), batch[1])


def unpack(batch) -> tuple[Tensor, Tensor, Tensor | None]:
    """(x, y) or, from recordings batched by length, (x, y, lengths) -> x, y, lengths or None."""
    x, y, *lengths = batch
    return x, y, lengths[0] if lengths else None


def load_classifier(path, image_size=None, num_classes: int | None = None,
                    datamodule=None) -> ViT | CNN:  # fmt: skip
    """An image classifier's checkpoint (model=vit | cnn | ast) -> its network in eval mode,
    loaded with weights_only=True; with image_size and num_classes, checked to fit them, and with
    a datamodule, checked to have been trained on data prepared as that one's."""
    from src.utils.checkpoint import load_checkpoint

    ckpt = load_checkpoint(path, expected_class=f"{__name__}.ImageClassifier")
    check_same_preparation(path, ckpt, datamodule)
    hp = ckpt["hyper_parameters"]
    made_for = (tuple(hp["image_size"]), hp["num_classes"])
    if image_size is not None and made_for != (tuple(image_size), num_classes):
        raise PipelineError(
            f"{path} classifies {made_for[0][0]} x {made_for[0][1]} images into {made_for[1]} "
            f"classes; this data has {image_size[0]} x {image_size[1]} and {num_classes}"
        )
    model = ImageClassifier(**hp)
    model.load_state_dict(ckpt["state_dict"])
    return model.net.eval()


def check_same_preparation(path, ckpt: dict, datamodule) -> None:
    """A teacher must see inputs prepared as the student's (the same mel settings, the same
    per-speaker normalisation): its data's saved settings are compared with this data's, all but
    the split's own mean and std."""
    if datamodule is None:  # dataloaders passed to fit directly: nothing saved to compare
        return
    seen = ckpt.get(type(datamodule).__qualname__, {})
    ours = datamodule.state_dict()
    shared = sorted(seen.keys() & ours.keys() - {"mean", "std"})
    if differ := [f"data.{k}={seen[k]} (here {ours[k]})" for k in shared if seen[k] != ours[k]]:
        raise PipelineError(f"model.teacher={path} was trained on data prepared otherwise: "
                            + ", ".join(differ))  # fmt: skip
