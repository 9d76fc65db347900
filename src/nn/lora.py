"""Low-rank adaptation, LoRA (Bishop, Deep Learning, sec. 12.3; Hu et al., 2021).

Fine-tuning every weight of a large pre-trained model is costly, yet the change a downstream task
needs tends to have low intrinsic rank. LoRA freezes each chosen D x D' weight matrix W_0 and
learns only a rank-R correction, written as the product of two thin matrices:

    W = W_0 + (alpha / R) A B,      A: (D, R),  B: (R, D'),  R << min(D, D')
    Y = X W = X W_0 + (alpha / R) (X A) B

so a layer trains R (D + D') parameters instead of D D'. B starts at zero, hence A B = 0 and the
adapted model equals the base model at initialisation; A starts random so that the gradient with
respect to B, (X A)^T dL/dY, is non-zero from the first step. Fixing alpha while varying R keeps
the size of the update roughly independent of R, so the learning rate need not be retuned. After
training, W_0 + (alpha / R) A B is a single matrix again: merging costs nothing at inference.

nn.Linear stores its weight as (out, in) = (D', D) and computes X W^T + b, i.e. W_0 = weight^T in
the book's row-vector convention. The merged layer's weight is therefore weight + (alpha/R) (A B)^T.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn


class LoRALinear(nn.Module):
    """A frozen nn.Linear plus a trainable low-rank update: y = base(x) + (alpha/R) drop(x) A B."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float = 1.0, dropout: float = 0.0):
        super().__init__()
        if rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {rank}")
        self.base = base
        base.requires_grad_(False)  # W_0 and its bias stay the pre-trained values
        self.rank, self.alpha = rank, alpha
        self.scaling = alpha / rank
        d_in, d_out = base.in_features, base.out_features
        factory = {"device": base.weight.device, "dtype": base.weight.dtype}
        # A ~ U(-1/sqrt(D), 1/sqrt(D)), the scale of nn.Linear's default init, so x A is O(1)
        bound = 1.0 / math.sqrt(d_in)
        self.lora_a = nn.Parameter(torch.empty(d_in, rank, **factory).uniform_(-bound, bound))
        self.lora_b = nn.Parameter(torch.zeros(rank, d_out, **factory))  # A B = 0 at the start
        self.dropout = nn.Dropout(dropout)  # on the LoRA branch only; base(x) sees the clean x

    def forward(self, x: Tensor) -> Tensor:  # (..., D) -> (..., D')
        # (x A) B: two thin products, O(R (D + D')) per token, without forming the D x D' A B
        update = self.dropout(x) @ self.lora_a @ self.lora_b  # (..., R) -> (..., D')
        return self.base(x) + self.scaling * update

    @torch.no_grad()
    def merged(self) -> nn.Linear:
        """A new plain nn.Linear computing the same function: weight W_0^T + (alpha/R) (A B)^T."""
        base = self.base
        linear = nn.Linear(
            base.in_features,
            base.out_features,
            bias=base.bias is not None,
            device=base.weight.device,
            dtype=base.weight.dtype,
        )
        delta = (self.lora_a @ self.lora_b).T  # (D, D') -> nn.Linear's (out, in) = (D', D)
        linear.weight.copy_(base.weight + self.scaling * delta)
        if base.bias is not None:
            linear.bias.copy_(base.bias)
        return linear

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha}, scaling={self.scaling:g}"


def _matches(name: str, target: str) -> bool:
    """'w_q' matches 'layers.0.self_attn.w_q' but not 'layers.0.self_attn.xw_q'."""
    return name == target or name.endswith("." + target)


def _replace(model: nn.Module, name: str, module: nn.Module) -> None:
    # setattr on the parent also works inside nn.Sequential / nn.ModuleList ("mlp.0")
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child, module)


def add_lora(
    model: nn.Module,
    targets: Sequence[str],
    rank: int,
    alpha: float = 1.0,
    dropout: float = 0.0,
) -> list[str]:
    """Wrap, in place, every nn.Linear whose qualified name matches a target in a LoRALinear.

    A target matches a name equal to it or ending in "." + target: "w_q" hits the query projection
    of every layer, "layers.0.mlp.0" one linear only. Returns the sorted names replaced. Only the
    wrapped W_0 and biases are frozen; freezing the rest (or not) is the caller's choice.
    """
    if rank < 1:
        raise ValueError(f"LoRA rank must be >= 1, got {rank}")
    # the W_0 inside an existing LoRALinear is not a candidate: it would be adapted twice
    wrapped = {id(m.base) for m in model.modules() if isinstance(m, LoRALinear)}
    linears = [
        name
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and id(m) not in wrapped
    ]
    missing = [t for t in targets if not any(_matches(n, t) for n in linears)]
    if missing:
        raise ValueError(
            f"LoRA target(s) {missing} match no nn.Linear in {type(model).__name__}; "
            f"its Linear modules include {linears[:8]}"
        )
    names = sorted(n for n in linears if any(_matches(n, t) for t in targets))
    for name in names:
        _replace(model, name, LoRALinear(model.get_submodule(name), rank, alpha, dropout))
    return names


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every LoRALinear into a plain nn.Linear (W_0 + (alpha/R) A B), in place."""
    if isinstance(model, LoRALinear):  # nothing to replace it in
        return model.merged()
    lora = [name for name, m in model.named_modules() if isinstance(m, LoRALinear)]
    for name in lora:
        _replace(model, name, model.get_submodule(name).merged())
    return model


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) numbers of parameters; parameters() yields tied ones once."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)
