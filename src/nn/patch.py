"""Images as token sequences (Bishop, Deep Learning, sec. 12.4.1): an image is cut into P x P
patches, each flattened into a vector of C P^2 values and mapped linearly to a D-dimensional
token, x_n = W_e vec(patch_n) + b_e. The tokens follow the patches in raster order (row by
row). With a stride S < P the patches overlap, as the audio spectrogram Transformer's do
(sec. 12.4.3); the spectrograms of the audio models use the same module, a (mel x time) image of
one channel.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from src.utils.errors import PipelineError


def grid_size(image_size: tuple[int, int], patch: int, stride: int) -> tuple[int, int]:
    """(H, W) -> the patch grid (rows, columns): ((H - P) / S + 1, (W - P) / S + 1). The patches
    must tile the image exactly: no pixel row or column is silently left out."""
    grid = []
    for side, name in zip(image_size, ("height", "width"), strict=True):
        if side < patch or (side - patch) % stride:
            raise PipelineError(
                f"patches of {patch} pixels with stride {stride} do not tile the image's {name} "
                f"of {side}: choose model.net.patch_size and patch_stride so that (side - patch) "
                "is a multiple of the stride"
            )
        grid.append((side - patch) // stride + 1)
    return grid[0], grid[1]


def patchify(x: Tensor, patch: int, stride: int | None = None) -> Tensor:
    """x: (B, C, H, W) -> patches (B, N, C P^2), N = rows x columns of the grid in raster order;
    a patch's vector is its C channels one after the other, each P x P in raster order."""
    stride = stride or patch
    grid_size(tuple(x.shape[-2:]), patch, stride)
    return F.unfold(x, patch, stride=stride).transpose(1, 2)


def unpatchify(patches: Tensor, image_size: tuple[int, int], patch: int) -> Tensor:
    """The inverse of patchify for non-overlapping patches: (B, N, C P^2) -> (B, C, H, W)."""
    return F.fold(patches.transpose(1, 2), image_size, patch, stride=patch)


class PatchEmbedding(nn.Module):
    """(B, C, H, W) images -> (B, N, D) patch tokens, x_n = W_e vec(patch_n) + b_e."""

    def __init__(
        self,
        image_size: tuple[int, int],
        channels: int,
        patch: int,
        d_model: int,
        stride: int | None = None,
    ):
        super().__init__()
        self.patch, self.stride = patch, stride or patch
        self.grid = grid_size(tuple(image_size), patch, self.stride)  # (rows, columns)
        self.num_patches = self.grid[0] * self.grid[1]  # N
        self.proj = nn.Linear(channels * patch * patch, d_model)  # W_e: C P^2 -> D

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(patchify(x, self.patch, self.stride))
