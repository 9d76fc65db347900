"""Images and captions as token pairs, for text -> image (Parti), image -> text (a captioner)
and both in one model (CM3Leon's idea): Bishop, Deep Learning, sec. 12.4.4's multimodal
Transformers, on digit images.

A caption names the digit and, where the image is clearly so, its stroke: "a thick seven",
"a thin seven", or "a seven". Thickness is measured, not invented: an image's ink (its mean
intensity) against the terciles of its own digit's ink over the training images (MNIST's digits
are scaled to one box, so more ink means wider strokes).

One vocabulary serves both directions, so one encoder-decoder can learn both:

    0..5    the special tokens of src.data.text (EOS ends a target and starts the decoder)
    6, 7    the task tokens <image>, <text>: what the decoder is asked to write
    8..20   the caption words: a, thick, thin, zero, ..., nine
    21..    the K image codes (src.data.vq over P x P patches)

A pair is (source, target): text -> image is ([<image>, caption words], [codes in raster
order]); image -> text is ([<text>, codes], [caption words]).
"""

from __future__ import annotations

import numpy as np
from torch.utils.data import Dataset

from src.data.text import SPECIAL_TOKENS

DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
TASKS = ("<image>", "<text>")
WORDS = ("a", "thick", "thin", *DIGITS)
DIRECTIONS = ("text2image", "image2text", "both")


class CaptionVocab:
    """Ids of the special tokens, task tokens, caption words and K image codes."""

    def __init__(self, codes: int):
        self.tokens = [*SPECIAL_TOKENS, *TASKS, *WORDS]
        self.index = {t: i for i, t in enumerate(self.tokens)}
        self.code_offset, self.codes = len(self.tokens), codes

    def __len__(self) -> int:
        return self.code_offset + self.codes

    def task(self, direction: str) -> int:
        return self.index["<image>" if direction == "text2image" else "<text>"]

    def encode_text(self, caption: str) -> list[int]:
        return [self.index[w] for w in caption.split()]

    def decode_text(self, ids: list[int]) -> str:
        return " ".join(self.tokens[i] for i in ids if 0 <= i < self.code_offset)

    def image_ids(self, codes: np.ndarray) -> np.ndarray:
        return codes + self.code_offset

    def image_codes(self, ids: np.ndarray) -> np.ndarray:
        """Decoder output ids -> codes; a word where a code belongs becomes code 0."""
        codes = np.asarray(ids) - self.code_offset
        return np.where((codes >= 0) & (codes < self.codes), codes, 0)


def ink(images: np.ndarray, scale: float = 1.0, chunk: int = 4096) -> np.ndarray:
    """Images (N, C, H, W) in [0, scale] (255: uint8 pixels, a memmap read a chunk at a time)
    -> (N,) their mean intensity in [0, 1]."""
    starts = range(0, len(images), chunk)
    parts = (np.asarray(images[i : i + chunk], dtype=np.float32) for i in starts)
    return np.concatenate([p.reshape(len(p), -1).mean(1) / scale for p in parts])


def ink_terciles(images: np.ndarray, labels: np.ndarray, classes: int = 10,
                 scale: float = 1.0) -> np.ndarray:  # fmt: skip
    """(classes, 2): each digit's 1/3 and 2/3 quantiles of ink over the (training) images; a
    digit with no image gets those of all images."""
    amount = ink(images, scale)
    own = [amount[labels == c] if (labels == c).any() else amount for c in range(classes)]
    return np.stack([np.quantile(a, [1 / 3, 2 / 3]) for a in own])


def caption(label: int, amount: float, terciles: np.ndarray) -> str:
    low, high = terciles[label]
    stroke = "thick " if amount > high else "thin " if amount < low else ""
    return f"a {stroke}{DIGITS[label]}"


class CaptionPairs(Dataset):
    """(source ids, target ids) of every image in the direction(s) asked for; with "both",
    each image gives one pair of each direction."""

    def __init__(self, codes: np.ndarray, captions: list[str], vocab: CaptionVocab,
                 direction: str):  # fmt: skip
        self.codes, self.captions, self.vocab = codes, captions, vocab
        self.directions = ("text2image", "image2text") if direction == "both" else (direction,)

    def __len__(self) -> int:
        return len(self.captions) * len(self.directions)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        direction = self.directions[i // len(self.captions)]
        i %= len(self.captions)
        text = np.array(self.vocab.encode_text(self.captions[i]))
        image = self.vocab.image_ids(self.codes[i].astype(np.int64))
        task = np.array([self.vocab.task(direction)])
        if direction == "text2image":
            return np.concatenate([task, text]), image
        return np.concatenate([task, image]), text
