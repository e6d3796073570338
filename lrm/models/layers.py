"""Small building blocks shared by the models."""

from __future__ import annotations

from torch import nn


def mlp(in_dim: int, widths: list[int], *, last_activation: bool = True) -> nn.Sequential:
    """Linear layers of `widths` with ReLU between them (and after the last one if asked)."""
    layers: list[nn.Module] = []
    for i, w in enumerate(widths):
        layers.append(nn.Linear(in_dim, w))
        if last_activation or i < len(widths) - 1:
            layers.append(nn.ReLU())
        in_dim = w
    return nn.Sequential(*layers)
