"""Transformer layers (Bishop, Deep Learning, sec. 12.1.7).

A layer is multi-head attention and a two-layer MLP, each wrapped in a residual connection and a
LayerNorm. The book's form normalises after the residual sum (post-norm, eq. 12.20-12.22):

    Z = LayerNorm(Y(X) + X),   X~ = LayerNorm(MLP(Z) + Z)

Pre-norm, Z = X + Y(LayerNorm(X)), keeps an identity path from input to output and trains deep
stacks without warm-up tricks; GPT-2 and most later models use it.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from src.nn.activations import activation_layer
from src.nn.attention import MultiHeadAttention


@dataclass
class TransformerConfig:
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128  # D, the token embedding width
    d_ff: int | None = None  # MLP hidden width; None = 4 D as in the book
    dropout: float = 0.0
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
        self.self_attn = MultiHeadAttention(
            d, cfg.n_head, cfg.dropout, cfg.bias, cfg.naive_attention
        )
        self.norm1 = nn.LayerNorm(d, bias=cfg.bias)
        self.cross_attn = self.norm_cross = None
        if cross_attention:
            self.cross_attn = MultiHeadAttention(
                d, cfg.n_head, cfg.dropout, cfg.bias, cfg.naive_attention
            )
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
    ) -> Tensor:
        """x: (B, T, D) -> (B, T, D); context: (B, T_enc, D) for cross-attention."""
        x = self._residual(
            x,
            self.norm1,
            lambda h: self.dropout(
                self.self_attn(h, causal=causal, key_padding_mask=key_padding_mask)[0]
            ),
        )
        if self.cross_attn is not None:
            x = self._residual(
                x,
                self.norm_cross,
                lambda h: self.dropout(
                    self.cross_attn(h, context, key_padding_mask=context_padding_mask)[0]
                ),
            )
        return self._residual(x, self.norm2, self.mlp)


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

    def forward(self, x: Tensor, **kwargs) -> Tensor:  # (B, T, D) -> (B, T, D)
        for layer in self.layers:
            x = layer(x, **kwargs)
        return self.norm(x)
