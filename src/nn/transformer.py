"""Transformer layers (Bishop, Deep Learning, sec. 12.1.7).

A layer is multi-head attention and a two-layer MLP, each wrapped in a residual connection and a
LayerNorm. The book's form normalises after the residual sum (post-norm, eq. 12.20-12.22):

    Z = LayerNorm(Y(X) + X),   X~ = LayerNorm(MLP(Z) + Z)

Pre-norm, Z = X + Y(LayerNorm(X)), keeps an identity path from input to output and trains deep
stacks without warm-up tricks; GPT-2 and most later models use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from src.nn.activations import activation_layer
from src.nn.attention import KVCache, MultiHeadAttention
from src.nn.positional import positional_encoding


@dataclass
class TransformerConfig:
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128  # D, the token embedding width
    d_ff: int | None = None  # MLP hidden width; None = 4 D as in the book
    dropout: float = 0.0
    # dropout on the attention weights; None = `dropout`. 0 lets SDPA take its fused kernel:
    # a dropped weight needs the explicit (T_q, T_k) matrix
    attn_dropout: float | None = None
    norm_first: bool = True  # pre-norm; False gives the book's post-norm
    activation: str = "gelu"  # "relu" (the book) or "gelu" (GPT)
    bias: bool = True
    naive_attention: bool = False  # use the reference softmax(QK^T/sqrt(D_k))V path


class MLP(nn.Sequential):
    def __init__(self, d_model: int, d_ff: int, activation: str, dropout: float, bias: bool):
        super().__init__(
            nn.Linear(d_model, d_ff, bias=bias),
            activation_layer(activation),
            nn.Linear(d_ff, d_model, bias=bias),
            nn.Dropout(dropout),
        )


class TransformerLayer(nn.Module):
    """Self-attention (+ optional cross-attention to an encoder's output) + MLP, with residuals."""

    def __init__(self, cfg: TransformerConfig, cross_attention: bool = False):
        super().__init__()
        d = cfg.d_model
        self.norm_first = cfg.norm_first
        attn_dropout = cfg.dropout if cfg.attn_dropout is None else cfg.attn_dropout
        self.self_attn = MultiHeadAttention(d, cfg.n_head, attn_dropout, cfg.bias,
                                            cfg.naive_attention)  # fmt: skip
        self.norm1 = nn.LayerNorm(d, bias=cfg.bias)
        self.cross_attn = self.norm_cross = None
        if cross_attention:
            self.cross_attn = MultiHeadAttention(d, cfg.n_head, attn_dropout, cfg.bias,
                                                 cfg.naive_attention)  # fmt: skip
            self.norm_cross = nn.LayerNorm(d, bias=cfg.bias)
        self.mlp = MLP(d, cfg.d_ff or 4 * d, cfg.activation, cfg.dropout, cfg.bias)
        self.norm2 = nn.LayerNorm(d, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def _residual(self, x: Tensor, norm: nn.LayerNorm, sublayer) -> Tensor:
        if self.norm_first:
            return x + sublayer(norm(x))
        return norm(x + sublayer(x))

    def forward(
        self,
        x: Tensor,
        *,
        causal: bool = False,
        key_padding_mask: Tensor | None = None,
        context: Tensor | None = None,
        context_padding_mask: Tensor | None = None,
        cache: tuple[KVCache, KVCache] | None = None,
        attn_bias: Tensor | None = None,
    ) -> Tensor:
        """x: (B, T, D) -> (B, T, D); context: (B, T_enc, D) for cross-attention; cache: the
        (self, cross) attention caches of incremental decoding; attn_bias: (H, T, T) added to
        the self-attention scores."""
        self_cache, cross_cache = cache or (None, None)
        x = self._residual(
            x,
            self.norm1,
            lambda h: self.dropout(
                self.self_attn(
                    h,
                    causal=causal,
                    key_padding_mask=key_padding_mask,
                    cache=self_cache,
                    attn_bias=attn_bias,
                )[0]
            ),
        )
        if self.cross_attn is not None:
            x = self._residual(
                x,
                self.norm_cross,
                lambda h: self.dropout(
                    self.cross_attn(
                        h, context, key_padding_mask=context_padding_mask, cache=cross_cache
                    )[0]
                ),
            )
        return self._residual(x, self.norm2, self.mlp)


class DecodingCache:
    """The KV caches of every layer of a stack, for incremental decoding: each step feeds only
    the new token, at position `length`."""

    def __init__(self, n_layer: int):
        self.layers = [(KVCache(), KVCache()) for _ in range(n_layer)]  # (self, cross) per layer

    @property
    def length(self) -> int:  # positions cached
        k = self.layers[0][0].k
        return 0 if k is None else k.size(2)

    def reorder(self, index: Tensor) -> None:
        """Keep the rows `index` of every cache (beam search's surviving hypotheses)."""
        for self_cache, cross_cache in self.layers:
            self_cache.reorder(index)
            cross_cache.reorder(index)


class Transformer(nn.Module):
    """A stack of L layers: the encoder (bidirectional) or, with causal=True, the GPT decoder.

    Pre-norm stacks end with a final LayerNorm, since nothing after the last residual sum
    normalises it.
    """

    def __init__(self, cfg: TransformerConfig, cross_attention: bool = False):
        super().__init__()
        self.layers = nn.ModuleList(
            TransformerLayer(cfg, cross_attention) for _ in range(cfg.n_layer)
        )
        self.norm = nn.LayerNorm(cfg.d_model, bias=cfg.bias) if cfg.norm_first else nn.Identity()

    def forward(self, x: Tensor, cache: DecodingCache | None = None, **kwargs) -> Tensor:
        """(B, T, D) -> (B, T, D); with a cache, x is the positions after those cached."""
        for i, layer in enumerate(self.layers):
            x = layer(x, cache=cache.layers[i] if cache is not None else None, **kwargs)
        return self.norm(x)


@dataclass
class TokenTransformerConfig(TransformerConfig):
    vocab_size: int = 256  # K, set from the tokenizer by the data module
    block_size: int = 128  # the context window: the longest sequence the model sees
    pos_encoding: str = "learned"  # "learned", "sinusoidal" or "none"
    pos_base: float = 10000.0  # L in the sinusoidal encoding
    tie_weights: bool = True  # share the token embedding and output matrices


class TokenTransformer(nn.Module):
    """Token ids -> embeddings + positional encodings -> L layers -> a linear head over the K
    tokens of the vocabulary. Causal, it is GPT's decoder (sec. 12.3.2); bidirectional with
    padding masks, BERT's encoder (sec. 12.3.3); causal with cross-attention to an encoder's
    output, the translation decoder (sec. 12.3.5)."""

    def __init__(self, cfg: TokenTransformerConfig, causal: bool, cross_attention: bool = False):
        super().__init__()
        self.cfg, self.causal = cfg, causal
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_enc = positional_encoding(
            cfg.pos_encoding, cfg.d_model, cfg.block_size, cfg.pos_base
        )
        self.drop = nn.Dropout(cfg.dropout)
        self.transformer = Transformer(cfg, cross_attention)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.lm_head.weight = self.tok_emb.weight  # fewer parameters, better perplexity
        self.apply(self._init_weights)
        # GPT-2: scale the projections into the residual stream by 1/sqrt(2L) so that the
        # variance of the residual sum does not grow with depth
        for name, p in self.named_parameters():
            if name.endswith(("w_o.weight", "mlp.2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def hidden(
        self,
        idx: Tensor,
        key_padding_mask: Tensor | None = None,
        cache: DecodingCache | None = None,
        **context: Tensor | None,
    ) -> Tensor:
        """idx: (B, T) token ids; key_padding_mask: (B, T), True at padding; cache: the keys and
        values of the positions before idx; context, context_padding_mask: the encoder output Z
        (B, S, D) that cross-attention reads, and its padding (B, S) -> the last layer's outputs
        (B, T, D)."""
        start = cache.length if cache is not None else 0
        end = start + idx.size(1)
        if end > self.cfg.block_size:
            raise ValueError(f"sequence of {end} tokens exceeds block_size {self.cfg.block_size}")
        x = self.tok_emb(idx)  # (B, T, D)
        if self.cfg.pos_encoding == "sinusoidal":
            # the fixed encoding has unit amplitude while the embeddings start at std 0.02:
            # scaled by sqrt(D) (Vaswani et al.) the tokens are not drowned by their positions
            x = x * math.sqrt(self.cfg.d_model)
        if self.pos_enc is not None:
            x = x + self.pos_enc(torch.arange(start, end, device=idx.device))
        return self.transformer(
            self.drop(x), cache, causal=self.causal, key_padding_mask=key_padding_mask, **context
        )

    def forward(
        self,
        idx: Tensor,
        key_padding_mask: Tensor | None = None,
        last_only: bool = False,
        cache: DecodingCache | None = None,
        **context: Tensor | None,
    ) -> Tensor:
        """(B, T) -> logits (B, T, K), or (B, 1, K) if last_only."""
        x = self.hidden(idx, key_padding_mask, cache, **context)
        if last_only:  # generation needs only the next token: skip T-1 rows of the K-way head
            x = x[:, -1:]
        return self.lm_head(x)
