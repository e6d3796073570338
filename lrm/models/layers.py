"""Small building blocks shared by the models."""

from __future__ import annotations

import math

import torch
from torch import nn

from lrm.data.batch import Batch


def mlp(in_dim: int, widths: list[int], *, last_activation: bool = True) -> nn.Sequential:
    """Linear layers of `widths` with ReLU between them (and after the last one if asked)."""
    layers: list[nn.Module] = []
    for i, w in enumerate(widths):
        layers.append(nn.Linear(in_dim, w))
        if last_activation or i < len(widths) - 1:
            layers.append(nn.ReLU())
        in_dim = w
    return nn.Sequential(*layers)


def base_rate_logit(ctr: float) -> float:
    """logit(ctr), ctr clamped to [1e-6, 1 - 1e-6]: the bias of a head that starts at the
    base rate."""
    c = min(max(ctr, 1e-6), 1 - 1e-6)
    return math.log(c / (1 - c))


class ScoredModel(nn.Module):
    """A model whose `head` scores `forward_features(batch)`: forward(batch) -> logits [B].

    Subclasses build their dense layers, then call `_add_head` (which registers `head`
    after them, so the init order and state-dict keys stay those of the subclass), then
    build their tables.
    """

    feature_dim: int
    head: nn.Linear

    def _add_head(self, feature_dim: int, dense: list[nn.Module | None],
                  dense_device: torch.device | str | None) -> None:
        """Add `head` on `feature_dim` features; move `dense` and it to `dense_device`."""
        self.feature_dim = feature_dim
        self.head = nn.Linear(feature_dim, 1)
        if dense_device is not None:
            for m in (*dense, self.head):
                if m is not None:
                    m.to(dense_device)

    @torch.no_grad()
    def init_output_bias(self, ctr: float) -> None:
        """Start the serving head at the base rate: its bias = logit(ctr), the training
        CTR (clamped to [1e-6, 1 - 1e-6]), so the first predictions are calibrated on
        average instead of centred on 0.5 (a CTR model starting at p = 0.5 spends its
        first steps only learning the base rate, and a short run may not get there)."""
        self.head.bias.fill_(base_rate_logit(ctr))

    def forward_features(self, batch: Batch) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.head(self.forward_features(batch)).squeeze(-1)
