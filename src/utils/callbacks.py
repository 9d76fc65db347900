"""Callbacks the default config adds to every run (see conf/callbacks/default.yaml), and the
model selection some papers' protocols need (experiment presets swap it in)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import psutil
import pytorch_lightning as pl
import torch
from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from src.data.text import PAD_ID

log = logging.getLogger(__name__)


def token_ids(batch) -> torch.Tensor | None:
    """The (B, T) token ids of a text batch: x of language-model windows (x, y), or `input_ids`
    of a labelled batch; None for other batches (graphs, images)."""
    if isinstance(batch, (tuple, list)):
        return None if batch[0].is_floating_point() else batch[0]
    if isinstance(batch, dict):
        return batch["input_ids"]
    return None


class Throughput(pl.Callback):
    """Logs `train/tokens_per_sec`: the tokens of the input batches that all processes consume per
    second of training, validation pauses excluded; for image batches (x, y) with float x
    `train/images_per_sec`, for graph batches (PyG `Data`/`Batch`) `train/nodes_per_sec`
    instead; and once, `train/startup_sec`: seconds from the start of the process to the first
    training step."""

    def __init__(self):
        self.t0, self.count = None, 0

    @staticmethod
    def _size(batch) -> tuple[str, int]:
        if (ids := token_ids(batch)) is not None:
            return "tokens", ids.numel()
        if isinstance(batch, (tuple, list)):
            return "images", len(batch[0])
        return "nodes", batch.num_nodes

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == 0 and batch_idx == 0:
            started = psutil.Process().create_time()
            pl_module.log("train/startup_sec", time.time() - started, on_step=True, on_epoch=False)
        if self.t0 is None:
            self.t0, self.count = time.perf_counter(), 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        unit, size = self._size(batch)
        self.count += size * trainer.world_size
        if (trainer.global_step % trainer.log_every_n_steps == 0) or trainer.is_last_batch:
            now = time.perf_counter()
            pl_module.log(f"train/{unit}_per_sec", self.count / (now - self.t0))
            self.t0, self.count = now, 0

    def on_validation_start(self, trainer, pl_module) -> None:
        self.t0 = None  # restart the clock after validation


IGNORE = -100  # the label of tokens that carry none (text_cls)


def trivial_baseline(train: torch.Tensor, held_out: torch.Tensor, split: str = "val"):
    """What a model that ignores its input scores on a held-out split: for class ids (long), the
    accuracy of always answering the training split's most common class (`<split>/acc_majority`,
    IGNORE labels left out); for values (float, (N,) or (N, T)), the RMSE of always answering
    the training mean (`<split>/rmse_mean`). Returns (name, value)."""
    if train.is_floating_point():
        return f"{split}/rmse_mean", float((held_out - train.mean(0)).pow(2).mean().sqrt())
    train, held_out = train[train != IGNORE], held_out[held_out != IGNORE]
    majority = torch.bincount(train).argmax()
    return f"{split}/acc_majority", float((held_out == majority).float().mean())


class TrivialBaseline(pl.Callback):
    """Logs, beside val/acc or val/rmse (and the test split's), what a model that ignores its
    input would score (`trivial_baseline` on the data module's `trivial_targets(split)`: the
    train and that split's targets), so that every run shows how far it is above chance; and
    warns at the end of training when the model is no better: val accuracy within a point of the
    majority class's, or val RMSE no lower than the training mean's. Data without such targets
    (language modelling) is skipped."""

    def __init__(self, margin: float = 0.01):
        self.margin, self.baselines = margin, {}

    def baseline(self, trainer, split: str) -> tuple[str, float] | None:
        if split not in self.baselines:
            targets = getattr(trainer.datamodule, "trivial_targets", lambda split: None)(split)
            self.baselines[split] = targets and trivial_baseline(*targets, split)
        return self.baselines[split]

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if baseline := self.baseline(trainer, "val"):
            pl_module.log(*baseline)

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        if baseline := self.baseline(trainer, "test"):
            pl_module.log(*baseline)

    def on_fit_end(self, trainer, pl_module) -> None:
        baseline = self.baseline(trainer, "val")
        if baseline is None or not trainer.is_global_zero:
            return
        name, base = baseline
        metric = name.rsplit("_", 1)[0]  # val/acc or val/rmse
        if metric not in trainer.callback_metrics:
            return
        value = float(trainer.callback_metrics[metric])
        if value <= base + self.margin if metric == "val/acc" else value >= base:
            log.warning(
                "%s %.4f is no better than %s %.4f: the model has learned nothing beyond the "
                "targets' prior. Likely causes: the learning rate (model.optim.lr), dropout "
                "(model.net.dropout, e.g. on one-hot inputs), too few steps (trainer.max_steps, "
                "trainer.max_epochs)", metric, value, name, base,
            )  # fmt: skip


class AccuracyAndLossCheckpoint(pl.callbacks.ModelCheckpoint):
    """Veličković et al.'s (GAT) model selection and stopping: the kept checkpoint is the last
    epoch whose val accuracy is at least the best so far and whose val loss is at most the best
    so far; training stops when neither has improved for `patience` epochs. `monitor` is the
    accuracy (mode max); `loss` names the loss."""

    def __init__(self, loss: str = "val/loss", patience: int = 100, **kwargs):
        super().__init__(**{"mode": "max", "save_top_k": 1, **kwargs})
        self.loss, self.patience = loss, patience
        self.best_acc, self.best_loss, self.wait = -float("inf"), float("inf"), 0

    def check_monitor_top_k(self, trainer: pl.Trainer, current: torch.Tensor | None = None):
        if current is None:
            return False
        acc, loss = float(current), float(trainer.callback_metrics[self.loss])
        keep = acc >= self.best_acc and loss <= self.best_loss
        if acc >= self.best_acc or loss <= self.best_loss:
            self.wait = 0
        else:
            self.wait += 1
            trainer.should_stop = trainer.should_stop or self.wait >= self.patience
        self.best_acc, self.best_loss = max(acc, self.best_acc), min(loss, self.best_loss)
        return trainer.strategy.reduce_boolean_decision(keep)  # processes agree

    def state_dict(self) -> dict:
        return {**super().state_dict(), "best_acc": self.best_acc, "best_loss": self.best_loss,
                "wait": self.wait}  # fmt: skip

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self.best_acc, self.best_loss = state_dict["best_acc"], state_dict["best_loss"]
        self.wait = state_dict["wait"]


class TextSamples(pl.Callback):
    """At the end of training, generates from `prompts` with the model's generation settings,
    prints the samples, writes them to `<run dir>/samples.txt` and logs them as a wandb table.
    Does nothing for models that cannot generate text."""

    def __init__(self, prompts: list[str], seed: int = 0):
        self.prompts, self.seed = prompts, seed

    @torch.no_grad()
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        tokenizer = getattr(trainer.datamodule, "tokenizer", None)
        if not trainer.is_global_zero or not hasattr(pl_module, "generate") or tokenizer is None:
            return
        was_training = pl_module.training
        pl_module.eval()
        g = torch.Generator(pl_module.device).manual_seed(self.seed)
        rows = []
        for prompt in self.prompts:
            ids = torch.tensor([tokenizer.encode(prompt).ids], device=pl_module.device)
            out = pl_module.generate(ids, generator=g)[0].tolist()
            rows.append([prompt, tokenizer.decode(out[ids.size(1) :])])
        pl_module.train(was_training)

        console = Console()
        for prompt, text in rows:
            console.print(
                Panel(Text(prompt + text), title=f"sample | prompt {prompt!r}", expand=False)
            )
        with open(Path(trainer.default_root_dir) / "samples.txt", "w") as f:
            f.writelines(f"=== prompt {p!r}\n{p}{t}\n" for p, t in rows)
        for logger in trainer.loggers:
            if hasattr(logger, "log_text"):  # WandbLogger
                logger.log_text("samples", columns=["prompt", "sample"], data=rows)


class AttentionMaps(pl.Callback):
    """After each validation, plots the attention weights of every layer and head for the first
    `tokens` tokens of the validation split: `<run dir>/attention.png`, and an image in wandb.
    A translation model shows its decoder's cross-attention instead, its greedy translation of
    the first validation source against that source's tokens: the soft alignment of target to
    source words. Does nothing for models without MultiHeadAttention."""

    def __init__(self, tokens: int = 24):
        self.tokens = tokens

    @torch.no_grad()
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from src.nn.attention import record_attention

        tokenizer = getattr(trainer.datamodule, "tokenizer", None)
        if trainer.sanity_checking or not trainer.is_global_zero or tokenizer is None:
            return
        x = token_ids(next(iter(trainer.datamodule.val_dataloader()))).to(pl_module.device)
        queries = None
        if hasattr(pl_module, "cross_attention"):  # translation: target x source tokens
            lengths = (x != PAD_ID).sum(1)  # the batch's longest sentence, without padding
            i = int(lengths.argmax())
            x = x[i : i + 1, : min(int(lengths[i]), self.tokens)]  # (1, S)
            maps, y = pl_module.cross_attention(x, max_new_tokens=self.tokens)
            queries = readable(trainer.datamodule.target_tokenizer, y[0].tolist())
        else:
            x = x[:1, : self.tokens]  # (1, T)
            with record_attention(pl_module) as maps:
                pl_module(x)
            maps = [m[0] for m in maps]
        if not maps:
            return
        path = Path(trainer.default_root_dir) / "attention.png"
        keys = readable(tokenizer, x[0].tolist())
        plot_attention([m.float().cpu() for m in maps], keys, path, trainer.global_step, queries)
        log_image(trainer, "val/attention", path)


def log_image(trainer: pl.Trainer, key: str, path: Path) -> None:
    """A saved picture into every logger that takes images (wandb)."""
    for logger in trainer.loggers:
        if hasattr(logger, "log_image"):  # WandbLogger
            logger.log_image(key, [str(path)])


class ImagePlots(pl.Callback):
    """Pictures of an image classifier, saved in the run folder and logged as wandb images: after
    every `every_n_epochs`-th validation and at the end of training, the first `images` val
    images beside the class token's attention over the patches in the last layer (heads
    averaged) and its attention rollout through every layer (`attention.png`, ViT only); after
    testing, the test split's confusion matrix (`confusion.png`). Does nothing for other models.
    (A picture takes ~0.3 s: after each of a small dataset's short epochs, a fifth of the run.)"""

    def __init__(self, images: int = 4, every_n_epochs: int = 10):
        self.images, self.every_n_epochs = images, every_n_epochs

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking and trainer.current_epoch % self.every_n_epochs == 0:
            self.plot_attention(trainer, pl_module)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        was_training = pl_module.training
        self.plot_attention(trainer, pl_module.eval())
        pl_module.train(was_training)

    @torch.no_grad()
    def plot_attention(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from src.nn.attention import attention_rollout, record_attention

        patches = getattr(getattr(pl_module, "net", None), "patches", None)
        if not trainer.is_global_zero or patches is None:
            return
        x, y, *lengths = next(iter(trainer.datamodule.val_dataloader()))
        x, y = x[: self.images].to(pl_module.device), y[: self.images]
        lengths = lengths[0][: self.images].to(pl_module.device) if lengths else None
        with record_attention(pl_module) as maps:
            predicted = pl_module(x, lengths).argmax(-1).cpu()
        rows = patches.grid[0]  # the columns: as many as cover these images (recordings)
        grid = (len(x), rows, (maps[-1].shape[-1] - 1) // rows)
        last = maps[-1].mean(1)[:, 0, 1:].reshape(grid)  # class token -> patches, (B, rows, cols)
        rolled = attention_rollout(maps)[:, 0, 1:].reshape(grid)
        classes = trainer.datamodule.classes
        titles = [f"{classes[int(t)]} (predicted {classes[int(p)]})"
                  for t, p in zip(y, predicted, strict=True)]  # fmt: skip
        path = Path(trainer.default_root_dir) / "attention.png"
        origin = getattr(trainer.datamodule, "origin", "upper")  # spectrograms: low bands down
        plot_image_attention(x.cpu(), last.cpu(), rolled.cpu(), titles, path, trainer.global_step,
                             origin)  # fmt: skip
        log_image(trainer, "val/attention", path)

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        confusion = getattr(pl_module, "confusion", None)
        if confusion is None or not trainer.is_global_zero:
            return
        path = Path(trainer.default_root_dir) / "confusion.png"
        plot_confusion(confusion.compute().cpu(), trainer.datamodule.classes, path)
        log_image(trainer, "test/confusion", path)


def readable(tokenizer, ids: list[int]) -> list[str]:
    """Each token as the text it stands for (byte-level BPE's "Ġ" marker as the space it is)."""
    return [tokenizer.decode([i], skip_special_tokens=False) for i in ids]


def plot_attention(
    maps: list[torch.Tensor],
    labels: list[str],
    path: Path,
    step: int,
    query_labels: list[str] | None = None,
) -> None:
    """maps: one (H, T_q, T_k) tensor per layer -> a layers x heads grid of heat maps; labels
    name the keys, and the queries too unless query_labels (cross-attention) are given."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_layers, n_heads = len(maps), maps[0].size(0)
    fig, axes = plt.subplots(
        n_layers, n_heads, figsize=(2.2 * n_heads, 2.2 * n_layers), squeeze=False
    )
    ticks = [repr(t)[1:-1] for t in labels]  # show "\n" and spaces visibly
    rows = ticks if query_labels is None else [repr(t)[1:-1] for t in query_labels]
    for layer, heads in enumerate(maps):
        for h, ax in enumerate(axes[layer]):
            ax.imshow(heads[h], cmap="viridis", vmin=0, vmax=1)
            ax.set_xticks(range(len(ticks)), ticks, fontsize=4, rotation=90)
            ax.set_yticks(range(len(rows)), rows, fontsize=4)
            ax.set_title(f"layer {layer + 1}, head {h + 1}", fontsize=6)
    axes_names = "queries, columns: keys" if query_labels is None else "target, columns: source"
    fig.suptitle(f"attention weights (rows: {axes_names}), step {step}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


class ImageSamples(pl.Callback):
    """ImageGPT's pictures at the end of training: `images` samples from the start token alone,
    and as many val images with the model's completion of their bottom half beside them
    (`samples.png` in the run folder, and a wandb image). Does nothing for other models."""

    def __init__(self, images: int = 8, seed: int = 0):
        self.images, self.seed = images, seed

    @torch.no_grad()
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from src.data.images import dequantize

        if not hasattr(pl_module, "sample_images") or not trainer.is_global_zero:
            return
        _, y = next(iter(trainer.datamodule.val_dataloader()))
        tops = y[: self.images].to(pl_module.device)  # (B, H W) codes
        was_training = pl_module.training
        pl_module.eval()
        g = torch.Generator(pl_module.device).manual_seed(self.seed)
        samples, completed = pl_module.sample_images(tops, generator=g)
        pl_module.train(was_training)
        codebook, size = trainer.datamodule.codebook, pl_module.hparams.image_size
        rows = [dequantize(c.cpu(), codebook, size) for c in (samples, tops, completed)]
        path = Path(trainer.default_root_dir) / "samples.png"
        plot_image_rows(rows, ["samples", "val images", "top half given"], path)
        log_image(trainer, "samples", path)


def plot_image_rows(rows: list[torch.Tensor], names: list[str], path: Path,
                    titles: list[str] | None = None) -> None:  # fmt: skip
    """A grid with one row per (B, C, H, W) batch of images in [0, 1], named on the left;
    titles name the columns."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(rows[0])
    fig, axes = plt.subplots(len(rows), n, figsize=(1.1 * n, 1.2 * len(rows)), squeeze=False)
    for images, name, row in zip(rows, names, axes, strict=True):
        for img, ax in zip(images, row, strict=True):
            ax.imshow(img[0] if len(img) == 1 else img.permute(1, 2, 0), cmap="gray", vmin=0,
                      vmax=1)  # fmt: skip
            ax.set_xticks([])
            ax.set_yticks([])
        row[0].set_ylabel(name, fontsize=7)
    for title, ax in zip(titles or [], axes[0], strict=False):
        ax.set_title(title, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_image_attention(images: torch.Tensor, last: torch.Tensor, rollout: torch.Tensor,
                         titles: list[str], path: Path, step: int,
                         origin: str = "upper") -> None:  # fmt: skip
    """A row per image (B, C, H, W): the image, the class token's last-layer attention over the
    patch grid (B, rows, cols), and its rollout, each map stretched over the image's extent;
    origin "lower" draws row 0 at the bottom (a spectrogram's lowest band)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(images), 3, figsize=(6, 2 * len(images)), squeeze=False)
    for img, a, r, title, row in zip(images, last, rollout, titles, axes, strict=True):
        img = (img - img.min()) / (img.max() - img.min() + 1e-8)
        img = img[0] if len(img) == 1 else img.permute(1, 2, 0)  # (H, W) or (H, W, 3)
        h, w = img.shape[0] - 0.5, img.shape[1] - 0.5
        extent = (-0.5, w, h, -0.5) if origin == "upper" else (-0.5, w, -0.5, h)  # map on image
        row[0].imshow(img, cmap="gray", origin=origin)
        row[0].set_title(title, fontsize=7)
        for ax, m, name in ((row[1], a, "last layer"), (row[2], r, "rollout")):
            ax.imshow(img, cmap="gray", origin=origin)
            ax.imshow(m, cmap="inferno", alpha=0.6, extent=extent, origin=origin)
            ax.set_title(f"class token attention, {name}", fontsize=6)
        for ax in row:
            ax.axis("off")
    fig.suptitle(f"step {step}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_confusion(matrix: torch.Tensor, classes: list[str], path: Path) -> None:
    """A (K, K) confusion matrix, rows the true classes, with its counts written in."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = len(classes)
    fig, ax = plt.subplots(figsize=(1 + 0.45 * k, 1 + 0.45 * k))
    ax.imshow(matrix, cmap="Blues")
    for i in range(k):
        for j in range(k):
            ax.text(j, i, int(matrix[i, j]), ha="center", va="center", fontsize=6)
    ax.set_xticks(range(k), classes, rotation=90, fontsize=7)
    ax.set_yticks(range(k), classes, fontsize=7)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(f"test confusion matrix, accuracy {float(matrix.diag().sum() / matrix.sum()):.3f}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
