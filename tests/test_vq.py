"""Vector quantisation (src/data/vq.py): the codebook serves ImageGPT's colours, Parti's image
patches and the speech tokens of log-mel frames."""

import numpy as np
import torch

from src.data import vq
from src.data.image_files import read_digits
from src.data.images import dequantize, fit_codebook, quantize


def test_encoding_picks_the_nearest_centroid_and_decoding_returns_it():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(500, 6)).astype(np.float32)
    codebook = vq.fit_codebook(vectors, 8, seed=0)
    codes = vq.encode(vectors, codebook)
    brute = ((vectors[:, None] - codebook[None]) ** 2).sum(-1).argmin(1)
    assert codebook.shape == (8, 6) and np.array_equal(codes, brute)
    back = vq.decode(torch.from_numpy(codes), torch.from_numpy(codebook))
    assert torch.equal(back, torch.from_numpy(codebook)[torch.from_numpy(brute)])
    assert vq.encode(vectors.reshape(50, 10, 6), codebook).shape == (50, 10)  # any leading shape


def test_k_means_finds_well_separated_clusters():
    centres = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    points = np.concatenate([c + np.random.default_rng(i).normal(0, 0.1, (100, 2))
                             for i, c in enumerate(centres)])  # fmt: skip
    codebook = vq.fit_codebook(points, 3, seed=0)
    assert np.abs(np.sort(codebook, axis=0) - np.sort(centres, axis=0)).max() < 0.1


def test_image_patch_codes_rebuild_digits_better_with_more_codes():
    x = read_digits().images[:400]  # (N, 1, 8, 8) uint8
    errors = []
    for k in (4, 32):
        codebook = fit_codebook(x, k, seed=0, patch=2)
        codes = quantize(x, codebook, patch=2)
        assert codebook.shape == (k, 4) and codes.shape == (400, 16) and codes.max() < k
        back = dequantize(torch.from_numpy(codes), torch.from_numpy(codebook), (8, 8), patch=2)
        assert back.shape == (400, 1, 8, 8)
        errors.append(float(((back.numpy() - x / 255.0) ** 2).mean()))
    assert errors[1] < errors[0] / 2
