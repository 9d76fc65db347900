"""Activation functions by name, for config files."""

from __future__ import annotations

from torch import nn

ACTIVATIONS = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "elu": nn.ELU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "none": nn.Identity,
}


def activation_layer(name: str) -> nn.Module:
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; choose one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]()
