"""Speech as tokens, for text-to-speech in Vall-E's manner (Bishop, Deep Learning, sec. 12.4.4):
a recording's log-mel frames, `stack` at a time, are vector-quantised into K codes
(src.data.vq, the codebook fitted on the training recordings), and a decoder-only Transformer
learns to continue

    [EOS] [letters of the word] [SEP] [codes of a prompt] [SEP] [codes of the target] [EOS]

where the prompt is another recording by the target's speaker: at sampling time, a few of a
speaker's codes and a word give new codes in that voice, turned back into frames (the codes'
centroids) and audio (src.data.mels.mel_to_audio). Only the target's codes and its EOS are
predicted (the rest is the condition).

Ids: 0..5 the special tokens of src.data.text, 6..31 the letters a-z, 32.. the K codes.
"""

from __future__ import annotations

import string

import numpy as np
import torch
from torch.utils.data import Dataset

from src.data.text import PAD_ID, SEP, SPECIAL_TOKENS
from src.data.translation import EOS_ID, IGNORE, pad

SEP_ID = SPECIAL_TOKENS.index(SEP)
LETTERS = string.ascii_lowercase
CODE_OFFSET = len(SPECIAL_TOKENS) + len(LETTERS)
DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def frame_vectors(features: np.ndarray, stack: int) -> np.ndarray:
    """Log-mels (N, n_mels, T) -> (N, T / stack, n_mels stack): `stack` frames a vector, in time
    order (frames past the last whole stack dropped)."""
    n, m, t = features.shape
    x = np.asarray(features[:, :, : t // stack * stack]).transpose(0, 2, 1)  # (N, T', n_mels)
    return x.reshape(n, t // stack, stack * m)


def vector_frames(vectors: torch.Tensor, n_mels: int) -> torch.Tensor:
    """(N, T / stack, n_mels stack) -> log-mels (N, n_mels, T), the inverse of frame_vectors."""
    n, steps, d = vectors.shape
    return vectors.reshape(n, steps * (d // n_mels), n_mels).transpose(1, 2)


def spoken_word(label: str) -> str:
    """A class label as the word said: a digit's name ("7" -> "seven"), else the label itself
    (Speech Commands' folders are the words)."""
    return DIGIT_WORDS[int(label)] if label.isdigit() and len(label) == 1 else label.lower()


def word_ids(word: str) -> list[int]:
    """A word (letters a-z) -> its letters' ids."""
    if not word or any(c not in LETTERS for c in word):
        raise ValueError(f"{word!r}: words are letters a-z")
    return [len(SPECIAL_TOKENS) + LETTERS.index(c) for c in word]


def sequence(word: str, prompt: np.ndarray, target: np.ndarray | None = None) -> list[int]:
    """The token layout of the module docstring; without `target`, the prefix that sampling
    continues."""
    ids = [EOS_ID, *word_ids(word), SEP_ID, *(prompt + CODE_OFFSET), SEP_ID]
    return ids if target is None else [*ids, *(target + CODE_OFFSET), EOS_ID]


class SpeechPrompts(Dataset):
    """(x, y) next-token pairs of each recording's sequence, y = IGNORE except on the target's
    codes and EOS. The prompt is another recording by the same speaker, drawn afresh each time
    in training (`seed`), fixed per recording otherwise."""

    def __init__(self, codes: np.ndarray, words: list[str], speakers: np.ndarray,
                 train: bool, seed: int = 0):  # fmt: skip
        self.codes, self.words, self.speakers, self.train = codes, words, speakers, train
        self.rng = np.random.default_rng(seed)
        self.same = {s: np.flatnonzero(speakers == s) for s in np.unique(speakers)}
        fixed = np.random.default_rng(seed)
        self.fixed = [self._draw(i, fixed) for i in range(len(words))]

    def _draw(self, i: int, rng: np.random.Generator) -> int:
        others = self.same[self.speakers[i]]
        others = others[others != i] if len(others) > 1 else others
        return int(rng.choice(others))

    def __len__(self) -> int:
        return len(self.words)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        p = self._draw(i, self.rng) if self.train else self.fixed[i]
        seq = torch.tensor(sequence(self.words[i], self.codes[p], self.codes[i]))
        x, y = seq[:-1], seq[1:].clone()
        y[: len(seq) - len(self.codes[i]) - 2] = IGNORE  # the word and the prompt: given
        return x, y


def collate_sequences(items: list) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) pairs of different lengths (words differ) -> (B, T) each, x padded with PAD and y
    with IGNORE."""
    return pad([x for x, _ in items], PAD_ID), pad([y for _, y in items], IGNORE)
