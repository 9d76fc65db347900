"""Positional encodings (Bishop, Deep Learning, sec. 12.1.9).

Attention is equivariant to permutations of its inputs, so word order must be injected. The
absolute encodings map positions (T,) to vectors (T, D) that are added to the token embeddings;
the relative one adds to the attention scores a bias that depends on the offset between two
positions only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class SinusoidalPositionalEncoding(nn.Module):
    """Fixed encoding of eq. (12.25): r_ni = sin(n / L^(i/D)) for even i and
    r_ni = cos(n / L^((i-1)/D)) for odd i.

    The wavelengths form a geometric progression from 2π to L·2π; the book (and Vaswani et al.) use
    L = 10000. Not learned, so it is a buffer: it moves with the module but gets no gradient.
    """

    def __init__(self, d_model: int, max_len: int, base: float = 10000.0):
        super().__init__()
        n = torch.arange(max_len, dtype=torch.float32)[:, None]  # (T, 1)
        i = torch.arange(0, d_model, 2, dtype=torch.float32)  # even dimensions
        angle = n / base ** (i / d_model)  # (T, ceil(D/2))
        r = torch.zeros(max_len, d_model)
        r[:, 0::2] = torch.sin(angle)
        r[:, 1::2] = torch.cos(angle[:, : d_model // 2])
        self.register_buffer("r", r, persistent=False)

    def forward(self, positions: Tensor) -> Tensor:  # (T,) -> (T, D)
        return self.r[positions]


class SinusoidalPositionalEncoding2D(nn.Module):
    """Fixed encoding of a grid's cells in raster order (image patches): the first D/2 values are
    eq. (12.25)'s encoding of the row, the last D/2 that of the column."""

    def __init__(self, d_model: int, grid: tuple[int, int], base: float = 10000.0):
        super().__init__()
        rows, cols = grid
        half = SinusoidalPositionalEncoding(d_model // 2, max(rows, cols), base).r  # (R, D/2)
        r = torch.cat(
            [half[:rows, None].expand(rows, cols, -1), half[None, :cols].expand(rows, cols, -1)],
            dim=-1,
        )  # (rows, cols, D)
        self.register_buffer("r", r.reshape(rows * cols, -1), persistent=False)

    def forward(self, positions: Tensor) -> Tensor:  # (N,) -> (N, D)
        return self.r[positions]


class RelativePositionBias2D(nn.Module):
    """A learned bias b_h(dr, dc) of head h's attention score from one grid cell (an image patch) to
    another that depends only on their offset in rows and columns (Swin's, Liu et al. 2021; T5's
    relative positions in two dimensions). Attention then treats every place of the image alike,
    as a convolution does, where absolute positions let it learn each place's own pattern. The
    class token, first in the sequence, gets no bias to or from any cell."""

    def __init__(self, n_heads: int, grid: tuple[int, int]):
        super().__init__()
        self.grid = grid  # (R, C)
        self.table = nn.Parameter(torch.zeros(n_heads, 2 * grid[0] - 1, 2 * grid[1] - 1))

    def forward(self, cols: int | None = None) -> Tensor:
        """-> the biases (H, 1 + N, 1 + N) of the class token and the grid's cells in raster
        order, of its first `cols` columns (all by default): N = R x cols."""
        rows, cols = self.grid[0], cols or self.grid[1]
        cell = torch.arange(rows * cols, device=self.table.device)
        r, c = cell // cols, cell % cols  # (N,) each cell's row and column
        dr = r[:, None] - r[None] + rows - 1  # (N, N) offsets, shifted to index the table
        dc = c[:, None] - c[None] + self.grid[1] - 1
        return F.pad(self.table[:, dr, dc], (1, 0, 1, 0))  # (H, 1 + N, 1 + N)


class ConvPositionGenerator(nn.Module):
    """Positions made from the tokens' neighbourhood (CPVT's generator, Chu et al. 2023): a 3 x 3
    depthwise convolution of the patch tokens laid out on their grid, added to them. A token then
    learns where it is from its neighbours, and every layer it precedes mixes each patch with the
    eight around it, the locality a convolution has built in; the class token is left as it is.
    Tokens in the padding (True in `pad`) are zeros to their neighbours."""

    def __init__(self, d_model: int):
        super().__init__()
        self.conv = nn.Conv2d(d_model, d_model, 3, padding=1, groups=d_model)

    def forward(self, x: Tensor, grid: tuple[int, int], pad: Tensor | None = None) -> Tensor:
        """x (B, 1 + N, D), the class token first, then the R x C grid's tokens in raster order
        (N = R C); pad (B, 1 + N) or None -> (B, 1 + N, D)."""
        cells = x[:, 1:]  # (B, N, D)
        if pad is not None:
            cells = cells.masked_fill(pad[:, 1:, None], 0.0)
        local = self.conv(cells.transpose(1, 2).unflatten(2, grid))  # (B, D, R, C)
        return torch.cat([x[:, :1], x[:, 1:] + local.flatten(2).transpose(1, 2)], dim=1)


class LearnedPositionalEncoding(nn.Module):
    """One trainable vector per position (as in GPT and BERT); cannot extrapolate past max_len."""

    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        self.embedding = nn.Embedding(max_len, d_model)

    def forward(self, positions: Tensor) -> Tensor:  # (T,) -> (T, D)
        return self.embedding(positions)


def positional_encoding(
    kind: str, d_model: int, max_len: int, base: float = 10000.0
) -> nn.Module | None:
    """Factory for config files: kind is "sinusoidal", "learned" or "none"."""
    if kind == "sinusoidal":
        return SinusoidalPositionalEncoding(d_model, max_len, base)
    if kind == "learned":
        return LearnedPositionalEncoding(d_model, max_len)
    if kind == "none":
        return None
    raise ValueError(f"unknown positional encoding {kind!r}; choose sinusoidal, learned or none")
