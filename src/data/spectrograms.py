"""A split's log-mel spectrograms as training examples (src.data.audio's batches): read from
disk a recording at a time, normalised per mel band (per speaker with speaker_norm, from one
bounded pass of statistics), augmented in training (noise floor, warps, SpecAugment's masks),
and padded per batch when recordings keep their own lengths."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from src.data.arrays import Rows, Spans


def rescale(x: torch.Tensor, axis: int, factor: float) -> torch.Tensor:
    """x (n_mels, frames) stretched by `factor` along `axis` from index 0, linearly interpolated
    and cut to its size (positions past the end repeat the last row): along the mel axis, a
    voice's formants moved up or down; along time, a word said faster or slower."""
    n = x.shape[axis]
    pos = (torch.arange(n, dtype=x.dtype) / factor).clamp(max=n - 1)
    lo = pos.floor().long()
    w = (pos - lo).view([-1, 1] if axis == 0 else [1, -1])
    return x.index_select(axis, lo) * (1 - w) + x.index_select(axis, (lo + 1).clamp(max=n - 1)) * w


def band_statistics(mels: Rows | Spans, voice: np.ndarray, train: np.ndarray, voices: int,
                    speaker_norm: str) -> tuple[np.ndarray, np.ndarray, float, float]:  # fmt: skip
    """One pass over the log-mels, a recording at a time (memory set by the longest recording,
    not by their number) -> (shift, scale), (voices, n_mels) each, that normalise a recording of
    voice v as (x - shift[v]) / scale[v], and the train split's mean and std they include.

    With speaker_norm, each voice's mean per mel band over all of its recordings is subtracted
    first (meanvar: and its std divided): per-speaker CMVN, as in speaker-adapted recognisers. A
    voice's long-term spectrum (its formants, its microphone) goes, the words stay; no labels are
    used, so an unheard speaker's statistics come from their own unlabelled recordings. Then the
    train split's mean and std, over every value, bring the inputs to mean 0 and std 1."""
    n_mels = mels.shape[0]  # a row's (n_mels, frames), or a frame's (n_mels,)
    sums = np.zeros((2, voices, 3, n_mels))  # [all | train][voice][frames, sum, sum of squares]
    for i in range(len(mels)) if speaker_norm != "none" else np.flatnonzero(train):
        x = as_bands(mels, i).astype(np.float64)  # (n_mels, L)
        acc = np.stack([np.full(n_mels, x.shape[1]), x.sum(1), np.square(x).sum(1)])
        sums[0, voice[i]] += acc
        if train[i]:
            sums[1, voice[i]] += acc
    centre, spread = np.zeros((voices, n_mels)), np.ones((voices, n_mels))
    if speaker_norm != "none":
        n, s1, s2 = sums[0].transpose(1, 0, 2)  # (voices, n_mels) each
        centre = s1 / n
        if speaker_norm == "meanvar":
            spread = np.sqrt(np.maximum(s2 / n - centre**2, 0)) + 1e-6
    # the train split's z = (x - centre) / spread, its sums from those of x
    n, s1, s2 = sums[1].transpose(1, 0, 2)
    z1 = (s1 - n * centre) / spread
    z2 = (s2 - 2 * centre * s1 + n * centre**2) / spread**2
    mean = z1.sum() / n.sum()
    std = float(np.sqrt(max(z2.sum() / n.sum() - mean**2, 0))) + 1e-6
    return centre + mean * spread, spread * std, float(mean), std


def as_bands(mels: Rows | Spans, i: int) -> np.ndarray:
    """Recording i's log-mels as (n_mels, L): a row (n_mels, frames), or a span of frames."""
    x = mels[i]
    return x.T if isinstance(mels, Spans) else x


class Spectrograms(Dataset):
    """One split's log-mels, read from disk a recording at a time, as (1, n_mels, L) tensors
    normalised per mel band, (x - shift) / scale, with the row of its voice (band_statistics).
    Augmented in training: first a noise floor at a random level within `noise` dB below the
    peak added to the power of every bin (another room, another microphone's hiss), then each
    axis stretched by a random factor within 1 +- warp (mel axis: another voice, time axis:
    another pace), then SpecAugment's masks, a random band of up to freq_mask mel bands and one
    of up to time_mask frames set to 0 (the mean)."""

    def __init__(self, mels: Rows | Spans, y: np.ndarray, voice: np.ndarray, shift: np.ndarray,
                 scale: np.ndarray, masks: tuple[int, int] = (0, 0),
                 warps: tuple[float, float] = (0.0, 0.0), noise: tuple[float, float] | None = None,
                 seed: int = 0):  # fmt: skip
        self.mels, self.y, self.voice = mels, y, voice
        self.shift = torch.from_numpy(shift).float()[..., None]  # (voices, n_mels, 1)
        self.scale = torch.from_numpy(scale).float()[..., None]
        self.masks, self.warps, self.noise = masks, warps, noise
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return len(self.y)

    @property
    def lengths(self) -> np.ndarray:
        """(N,) frames of each recording."""
        if isinstance(self.mels, Spans):
            return self.mels.lengths
        return np.full(len(self), self.mels.shape[-1])

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        v = self.voice[i]
        db = np.array(as_bands(self.mels, i))  # (n_mels, L) dB below the peak
        if self.noise:
            floor = -self.rng.uniform(*self.noise)
            db = (10 * np.log10(10 ** (db / 10) + 10 ** (floor / 10))).astype(np.float32)
        x = (torch.from_numpy(db) - self.shift[v]) / self.scale[v]
        for axis, warp in enumerate(self.warps):
            if warp:
                x = rescale(x, axis, float(self.rng.uniform(1 - warp, 1 + warp)))
        for axis, width in enumerate(self.masks):
            if width:
                w = min(int(self.rng.integers(0, width + 1)), x.shape[axis])
                start = int(self.rng.integers(0, x.shape[axis] - w + 1))
                x.narrow(axis, start, w).zero_()
        return x[None], int(self.y[i])


def collate_lengths(items: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, ...]:
    """Spectrograms (1, n_mels, L_i) of any lengths and their labels -> x (B, 1, n_mels, max L)
    padded with 0 (the mean) after each recording's end, y (B,) and the lengths L_i (B,), from
    which the models mask the padding."""
    lengths = torch.tensor([x.shape[-1] for x, _ in items])
    x = torch.zeros(len(items), *items[0][0].shape[:2], int(lengths.max()))
    for b, (xb, _) in enumerate(items):
        x[b, ..., : xb.shape[-1]] = xb
    return x, torch.tensor([y for _, y in items]), lengths
