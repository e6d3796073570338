"""Compute per example: the forward FLOPs of a built model for one impression.

The count is torch's own (`torch.utils.flop_counter.FlopCounterMode`): 2 FLOPs per
multiply-add of every matrix product the forward runs (the MLPs, DLRM's dot interaction,
Wukong's FM and linear-compress blocks, the heads). Embedding lookups and pooling (memory
reads, not arithmetic), normalization and activations are not counted, as in the scaling
papers' model FLOPs (Wukong, Zhang et al. 2024). The example batch is in the plain form,
one session per impression, so a model's user-side work counts once per impression
whatever the session length (RecD lowers the real cost of both models alike). A training
step costs about 3x this (forward and backward); training compute is this times the
examples trained on (a constant factor apart).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode
from torchrec import KeyedJaggedTensor

from lrm.data.batch import Batch
from lrm.data.schema import FeatureSchema


def example_batch(schema: FeatureSchema, size: int = 8) -> Batch:
    """`size` impressions in the plain form, each of its own session, one id (0: a row of
    every table) per sparse feature and per sequence, zero dense features."""

    def kjt(keys: tuple[str, ...]) -> KeyedJaggedTensor:
        return KeyedJaggedTensor(keys=list(keys), values=torch.zeros(len(keys) * size,
                                                                     dtype=torch.long),
                                 lengths=torch.ones(len(keys) * size, dtype=torch.long),
                                 stride=size)

    return Batch(dense=torch.zeros(size, len(schema.dense)), item=kjt(schema.item_sparse),
                 user=kjt(schema.user_features), labels=torch.zeros(size))


def flops_per_example(model: nn.Module, schema: FeatureSchema, *, size: int = 8) -> float:
    """Forward FLOPs of `model` (built for `schema`, unsharded) per impression."""
    batch = example_batch(schema, size)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(batch)
    return counter.get_total_flops() / size
