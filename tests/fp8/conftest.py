"""Shared by the FP8 tests: the tiny datasets of tests/train and a real batch of them."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from lrm.data.batch import Batch
from lrm.data.loader import BatchLoader
from lrm.train.data import model_hash_sizes


def a_batch(data: Path, model: nn.Module, size: int = 256) -> Batch:
    """The first batch of day 0 of `data`, hashed for `model`'s tables."""
    loader = BatchLoader(data, size, days=[0], hash_sizes=model_hash_sizes(model), prefetch=0)
    return next(iter(loader))
