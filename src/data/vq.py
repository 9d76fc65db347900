"""Vector quantisation (Bishop, Deep Learning, sec. 12.4.2 and 15.1): a codebook of K centroids
c_k learnt by k-means, and every vector x_n replaced by the index of its nearest centroid,
argmin_k ||x_n - c_k||^2. It turns anything continuous into tokens a Transformer can predict:
pixel colours (ImageGPT), P x P image patches (Parti), log-mel frames (Vall-E's speech tokens).

    codebook = fit_codebook(vectors, k, seed)   # (K, d), fitted on training vectors only
    codes = encode(vectors, codebook)           # (M,) indices
    decode(codes, codebook)                     # (M, d): each code's centroid

Images become patch vectors through src.nn.patch's patchify, as the vision Transformer's do.
"""

from __future__ import annotations

import numpy as np
import torch


def fit_codebook(vectors: np.ndarray, k: int, seed: int, sample: int = 200_000) -> np.ndarray:
    """k-means (scikit-learn) over vectors (M, d), `sample` of them at most -> the K centroids
    (K, d), ordered by their sum (for pixels: darkest first)."""
    from sklearn.cluster import KMeans

    if len(vectors) > sample:
        vectors = vectors[np.random.default_rng(seed).choice(len(vectors), sample, replace=False)]
    vectors = np.asarray(vectors, dtype=np.float64)
    centroids = KMeans(n_clusters=k, n_init=4, random_state=seed).fit(vectors).cluster_centers_
    return centroids[np.argsort(centroids.sum(1), kind="stable")].astype(np.float32)


def encode(vectors: np.ndarray, codebook: np.ndarray, chunk: int = 65_536) -> np.ndarray:
    """vectors (..., d) -> codes (...): the index of each vector's nearest centroid."""
    shape, d = vectors.shape[:-1], vectors.shape[-1]
    flat = np.asarray(vectors, dtype=np.float32).reshape(-1, d)
    c = codebook.astype(np.float32)
    codes = np.empty(len(flat), dtype=np.int64)
    for i in range(
        0, len(flat), chunk
    ):  # ||x - c||^2 = ||x||^2 - 2 x.c + ||c||^2, x's term dropped
        codes[i : i + chunk] = (-2 * flat[i : i + chunk] @ c.T + (c**2).sum(1)).argmin(1)
    return codes.reshape(shape)


def decode(codes: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """codes (...) -> centroids (..., d)."""
    return codebook[codes]
