"""Text <-> image with the translation model (Bishop, Deep Learning, sec. 12.4.4): once an image
is a sequence of codebook tokens (src.data.vq over P x P patches), generating a picture from a
caption is translation into the image's "language", and captioning is translation back.

- Parti (`model=parti`, Yu et al. 2022): the encoder reads the caption ("a thick seven"), the
  decoder writes the image's H/P x W/P codes in raster order, sampled (temperature, top-k)
  through src.models.generation with only code tokens allowed.
- A captioner (`model=captioner`): the encoder reads the codes, the decoder writes the words.
- CM3Leon's idea (`model=cm3leon`, Yu et al. 2023): one model for both, the first source token
  saying which way (src.data.captions lays out the shared vocabulary and the pairs).

Test metrics: for text -> image, 3 captions (thick, thin, plain) per digit x `samples_per_prompt`
samples, scored by `judge` (an image classifier's checkpoint, model=cnn | vit on the same
images: does it see the prompted digit?), the stroke (P(ink of a "thick" sample > ink of a
"thin" one) for the same digit, chance 0.5) and diversity (distinct code sequences, mean
pixel distance between samples of one prompt against real test images of one digit); for
image -> text, greedy captions of the test images: the digit right, and the whole caption.
A grid of samples, `samples.png`, is saved in the run folder and logged.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from src.data.captions import DIGITS, CaptionVocab, ink
from src.data.images import dequantize
from src.data.text import PAD_ID
from src.data.translation import EOS_ID, pad
from src.models.seq2seq import Seq2SeqLitModule
from src.utils.callbacks import log_image, plot_image_rows

STROKES = ("thick ", "thin ", "")


def prompts(samples: int) -> tuple[list[str], np.ndarray]:
    """Every digit's three captions, each `samples` times -> (captions, digits)."""
    texts = [f"a {s}{d}" for d in DIGITS for s in STROKES for _ in range(samples)]
    return texts, np.repeat(np.arange(len(DIGITS)), len(STROKES) * samples)


def mean_pairwise_distance(images: Tensor) -> float:
    """Mean L2 distance between the (N, C, H, W) images' pairs, in [0, 1] pixel units."""
    flat = images.flatten(1)
    d = torch.cdist(flat, flat)
    n = len(flat)
    return float(d.sum() / (n * (n - 1)))


class ImageTextSeq2Seq(Seq2SeqLitModule):
    """The translation model's training on caption/code pairs, with image and caption metrics
    (see the module docstring). `captions`: text2image | image2text | both."""

    def __init__(self, codes: int, patch: int, captions: str, judge: str | None = None,
                 samples_per_prompt: int = 10, **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        self.save_hyperparameters()
        self.vocab = CaptionVocab(codes)
        self.judge_net = None

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if self.hparams.judge and self.judge_net is None:
            from src.models.image import load_classifier

            # kept out of the module's children: it is not trained, nor saved with this model
            object.__setattr__(self, "judge_net", load_classifier(self.hparams.judge))

    # -- generation
    @torch.no_grad()
    def generate_images(self, captions: list[str], n_codes: int,
                        generator: torch.Generator | None = None) -> Tensor:  # fmt: skip
        """Captions -> codes (N, n_codes), sampled as `generation` says, codes only."""
        cfg = dataclasses.replace(self.generation, max_new_tokens=n_codes, eos_id=None,
                                  suppress_ids=tuple(range(self.vocab.code_offset)))  # fmt: skip
        task = self.vocab.task("text2image")
        rows = [[task, *self.vocab.encode_text(c)] for c in captions]
        out = []
        for i in range(0, len(rows), 256):
            src = pad(rows[i : i + 256], PAD_ID).to(self.device)
            out += self.translate(src, cfg, generator=generator)
        return torch.from_numpy(self.vocab.image_codes(np.array(out)))

    @torch.no_grad()
    def caption_images(self, codes: np.ndarray) -> list[str]:
        """Codes (N, H/P W/P) -> greedy captions."""
        words = range(self.vocab.index["a"], self.vocab.code_offset)
        banned = tuple(i for i in range(len(self.vocab)) if i != EOS_ID and i not in words)
        cfg = dataclasses.replace(self.generation, strategy="greedy", max_new_tokens=6,
                                  eos_id=EOS_ID, suppress_ids=banned)  # fmt: skip
        task = self.vocab.task("image2text")
        src = torch.from_numpy(np.concatenate(
            [np.full((len(codes), 1), task), self.vocab.image_ids(codes)], axis=1))  # fmt: skip
        out = []
        for i in range(0, len(src), 512):
            out += self.translate(src[i : i + 512].to(self.device), cfg)
        return [self.vocab.decode_text(ids) for ids in out]

    def images(self, codes: Tensor) -> Tensor:
        """Codes (N, H/P W/P) -> images (N, C, H, W) in [0, 1], with the data's codebook."""
        data = self.trainer.datamodule
        return dequantize(codes.cpu(), data.codebook, data.meta["image_size"], self.hparams.patch)

    def judge(self, images: Tensor) -> Tensor:
        """Images (N, C, H, W) in [0, 1] -> the judge's predicted classes (N,)."""
        meta = self.trainer.datamodule.meta
        mean = torch.tensor(meta["mean"])[:, None, None] / 255
        std = torch.tensor(meta["std"])[:, None, None] / 255
        with torch.no_grad():
            logits = [self.judge_net((x - mean) / std) for x in images.split(512)]
        return torch.cat(logits).argmax(-1)

    # -- metrics
    def _directions(self) -> tuple[bool, bool]:
        c = self.hparams.captions
        return c in ("text2image", "both"), c in ("image2text", "both")

    def _caption_scores(self, split: str, limit: int | None = None) -> dict[str, float]:
        pairs = self.trainer.datamodule.splits[split]
        n = min(len(pairs.captions), limit or len(pairs.captions))
        rows = list(zip(self.caption_images(pairs.codes[:n]), pairs.captions[:n], strict=True))
        digit = [said.split()[-1:] == truth.split()[-1:] for said, truth in rows]
        exact = [said == truth for said, truth in rows]
        return {"caption_digit_acc": float(np.mean(digit)), "caption_exact": float(np.mean(exact))}

    def _image_scores(self) -> tuple[dict[str, float], Tensor]:
        k = self.hparams.samples_per_prompt
        texts, digits = prompts(k)
        g = torch.Generator(self.device).manual_seed(0)
        h, w = self.trainer.datamodule.meta["image_size"]
        codes = self.generate_images(
            texts, (h // self.hparams.patch) * (w // self.hparams.patch), g
        )
        images = self.images(codes)  # (10 x 3 x k, C, H, W)
        scores = {"image_distinct": len({tuple(c.tolist()) for c in codes}) / len(codes)}
        per_prompt = images.view(len(DIGITS) * len(STROKES), k, *images.shape[1:])
        scores["image_spread"] = float(np.mean([mean_pairwise_distance(p) for p in per_prompt]))
        amount = ink(images.numpy()).reshape(len(DIGITS), len(STROKES), k)
        thicker = amount[:, 0, :, None] > amount[:, 1, None, :]  # thick against thin, same digit
        scores["stroke_auc"] = float(thicker.mean())
        if self.judge_net is not None:
            said = self.judge(images).numpy()
            scores["image_digit_acc"] = float((said == digits).mean())
        return scores, images

    def _log_scores(self, stage: str, scores: dict[str, float]) -> None:
        for name, value in scores.items():
            self.log(f"{stage}/{name}", value)

    def on_validation_epoch_end(self) -> None:
        self._log_eval("val")
        if self.trainer.sanity_checking or not self._directions()[1]:
            return
        self._log_scores("val", self._caption_scores("val", self.hparams.val_sentences))

    def on_test_epoch_end(self) -> None:
        self._log_eval("test")
        to_image, to_text = self._directions()
        was_training = self.training
        self.eval()
        if to_text:
            self._log_scores("test", self._caption_scores("test"))
        if to_image:
            scores, images = self._image_scores()
            self._log_scores("test", scores)
            self._plot(images)
        self.train(was_training)

    def _plot(self, images: Tensor) -> None:
        """Rows: the digits; columns: `shown` samples each of "a thick d", then "a thin d", then
        "a d"."""
        if not self.trainer.is_global_zero:
            return
        k, shown = self.hparams.samples_per_prompt, min(3, self.hparams.samples_per_prompt)
        grid = images.view(len(DIGITS), len(STROKES), k, *images.shape[1:])[:, :, :shown]
        rows = list(grid.flatten(1, 2))  # (10) x (3 shown, C, H, W)
        names = list(DIGITS)
        path = Path(self.trainer.default_root_dir) / "samples.png"
        plot_image_rows(rows, names, path)
        log_image(self.trainer, "test/samples", path)


def load_image_text(path) -> tuple[ImageTextSeq2Seq, Tensor, tuple[int, int]]:
    """A checkpoint of model=parti | captioner | cm3leon -> (model in eval mode, its codebook
    (K, C P P), the image size), loaded with weights_only=True."""
    from src.utils.checkpoint import load_checkpoint

    ckpt = load_checkpoint(path, expected_class=f"{__name__}.ImageTextSeq2Seq")
    model = ImageTextSeq2Seq(**ckpt["hyper_parameters"])
    model.load_state_dict(ckpt["state_dict"])
    data = ckpt["ImageDataModule"]
    return model.eval(), torch.tensor(data["codebook"]), tuple(data["image_size"])
