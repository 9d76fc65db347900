"""Multi-head scaled dot-product attention (Bishop, Deep Learning, sec. 12.1).

One attention core serves every Transformer in the project: GPT (causal self-attention), BERT
(bidirectional, with padding masks), the translation decoder (cross-attention), ViT and audio.

    Q = X W_q,  K = X' W_k,  V = X' W_v                     (X' = X for self-attention)
    head_h = softmax(Q_h K_h^T / sqrt(D_k)) V_h             (12.14)
    Y = Concat(head_1, ..., head_H) W_o                     (12.19)
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def build_attention_mask(
    t_q: int,
    t_k: int,
    *,
    causal: bool = False,
    key_padding_mask: Tensor | None = None,
    device: torch.device | None = None,
) -> Tensor | None:
    """Boolean mask, True where a query may attend to a key, broadcastable to (B, H, T_q, T_k).

    key_padding_mask: (B, T_k), True at padding positions (the convention of nn.MultiheadAttention).
    """
    mask = None
    if causal:
        # query n sees keys m <= n (offset so that the last query sees the last key)
        mask = torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(diagonal=t_k - t_q)
    if key_padding_mask is not None:
        keep = ~key_padding_mask[:, None, None, :]  # (B, 1, 1, T_k)
        mask = keep if mask is None else keep & mask
    return mask


def naive_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout_p: float = 0.0
) -> tuple[Tensor, Tensor]:
    """The reference path: softmax(Q K^T / sqrt(D_k) + M) V, written out as in eq. (12.14).

    q: (B, H, T_q, D_k), k: (B, H, T_k, D_k), v: (B, H, T_k, D_v) -> ((B, H, T_q, D_v), A)
    where A: (B, H, T_q, T_k) are the attention weights; each row sums to 1. The mask M, as
    F.scaled_dot_product_attention's attn_mask, is boolean (False: -inf) or added to the scores.
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T_q, T_k)
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    elif mask is not None:
        scores = scores + mask
    weights = scores.softmax(dim=-1)
    if dropout_p > 0.0:
        weights = F.dropout(weights, dropout_p)
    return weights @ v, weights


@dataclass
class KVCache:
    """The keys and values one attention layer has computed so far, for incremental decoding.

    Self-attention appends the new positions' K, V at each step, so a step attends over the
    cache instead of re-running the whole prefix; cross-attention computes K, V of the encoder
    output Z on its first step and reuses them for every later token.
    """

    k: Tensor | None = None  # (B, H, T_k, D_k)
    v: Tensor | None = None  # (B, H, T_k, D_k)

    def reorder(self, index: Tensor) -> None:
        """Keep the rows `index` (B',): beam search continues from these hypotheses."""
        if self.k is not None:
            self.k, self.v = self.k[index], self.v[index]


class MultiHeadAttention(nn.Module):
    """H heads of scaled dot-product attention with learnable W_q, W_k, W_v and output W_o.

    Self-attention when `context` is None; cross-attention (keys and values from the encoder,
    sec. 12.3.5) otherwise. `F.scaled_dot_product_attention` is the fast path (it dispatches to
    flash / memory-efficient kernels); `naive=True` or `need_weights=True` takes the reference path.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        naive: bool = False,
    ):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        self.n_heads, self.d_k = n_heads, d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)
        self.dropout = dropout
        self.naive = naive
        self.record = False  # set by record_attention(): also return the weights

    def _split_heads(self, x: Tensor) -> Tensor:  # (B, T, D) -> (B, H, T, D_k)
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.d_k).transpose(1, 2)

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        causal: bool = False,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = False,
        cache: KVCache | None = None,
        attn_bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """x: (B, T_q, D); context: (B, T_k, D) or None -> (B, T_q, D), weights (B, H, T_q, T_k).

        With a cache, x holds only the positions after those cached (causal self-attention),
        and the context's K, V are computed once (cross-attention). attn_bias (H, T_q, T_k) is
        added to the scores Q K^T / sqrt(D_k) before the softmax: relative positions' biases."""
        q = self._split_heads(self.w_q(x))
        if cache is not None and context is not None and cache.k is not None:
            k, v = cache.k, cache.v  # the encoder output does not change while decoding
        else:
            kv = x if context is None else context
            k, v = self._split_heads(self.w_k(kv)), self._split_heads(self.w_v(kv))
            if cache is not None:
                if context is None and cache.k is not None:
                    k, v = torch.cat([cache.k, k], dim=2), torch.cat([cache.v, v], dim=2)
                cache.k, cache.v = k, v
        causal = causal and q.size(2) > 1  # one query, the last position, sees every key
        dropout_p = self.dropout if self.training else 0.0
        weights = None
        naive = self.naive or need_weights or self.record  # the reference path returns weights
        masked = key_padding_mask is not None or attn_bias is not None
        if naive or masked or (causal and q.size(2) != k.size(2)):
            mask = build_attention_mask(
                q.size(2), k.size(2), causal=causal, key_padding_mask=key_padding_mask,
                device=x.device,
            )  # fmt: skip
            if attn_bias is not None:  # a float mask: the bias, -inf where mask is False
                bias = attn_bias.to(q.dtype)
                mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
            if naive:
                y, weights = naive_attention(q, k, v, mask, dropout_p)
            else:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        else:
            # is_causal lets SDPA pick a kernel that skips the masked half instead of reading a mask
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal)
        y = y.transpose(1, 2).reshape(x.size(0), x.size(1), -1)  # concatenate heads: (B, T_q, D)
        return self.w_o(y), weights


@contextlib.contextmanager
def record_attention(model: nn.Module):
    """Collect the attention weights (B, H, T_q, T_k) of every MultiHeadAttention in `model`,
    in call order, for the forward passes run inside the block (for attention-map plots)."""
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    maps: list[Tensor] = []
    handles = [m.register_forward_hook(lambda mod, args, out: maps.append(out[1])) for m in layers]
    for m in layers:
        m.record = True
    try:
        yield maps
    finally:
        for m, h in zip(layers, handles, strict=True):
            m.record = False
            h.remove()


def attention_rollout(maps: list[Tensor]) -> Tensor:
    """Attention rollout (Abnar & Zuidema, 2020): how much each output position draws on each
    input position through all the layers. maps: per layer (B, H, T, T) -> (B, T, T), the product
    over layers, last to first, of the head-averaged weights mixed half and half with the
    identity (the residual path), rows renormalised."""
    rollout = None
    for a in maps:
        a = a.mean(1)  # (B, T, T)
        a = 0.5 * a + 0.5 * torch.eye(a.size(-1), device=a.device)
        a = a / a.sum(-1, keepdim=True)
        rollout = a if rollout is None else a @ rollout
    return rollout
