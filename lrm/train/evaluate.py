"""Scoring a model on a held-out day: NE, AUC, calibration over every impression.

`evaluate` loads a saved model folder and scores it in this process (the unsharded model);
the training loop scores its sharded model with `predict` on every rank and gathers the
predictions to rank 0.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lrm import metrics
from lrm.data.batch import Batch
from lrm.data.loader import BatchLoader
from lrm.data.schema import day_files
from lrm.errors import ConfigError
from lrm.progress import Reporter
from lrm.dist import quiet_libraries
from lrm.train.export import load_model


def pick_day(available: Sequence[int], day: int, key: str = "day") -> int:
    """`day` itself, or counted from the end when negative (-1: the last day)."""
    days = sorted(available)
    if day < 0:
        if -day > len(days):
            raise ConfigError(f"{key}: {day} counts back past the first of {len(days)} days")
        return days[day]
    if day not in days:
        raise ConfigError(f"{key}: no day {day} in the data (days: {days})")
    return day


def autocast(device: torch.device, amp: bool) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast on GPU when asked; CPU runs float32."""
    if amp and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def predict(model: nn.Module, batches: Iterable[Batch], device: torch.device, *,
            amp: bool = False, max_batches: int | None = None,
            reporter: Reporter | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, labels) of every impression in `batches`, float32 on the CPU."""
    was_training = model.training
    model.eval()
    logits, labels = [], []
    try:
        for batch in islice(batches, max_batches):
            batch = batch.to(device, non_blocking=True)
            with autocast(device, amp):
                out = model(batch)
            logits.append(out.float().cpu())
            labels.append(batch.labels.float().cpu())
            if reporter is not None:
                reporter.update(batch.size)
    finally:
        model.train(was_training)
    if not logits:
        return torch.zeros(0), torch.zeros(0)
    return torch.cat(logits), torch.cat(labels)


def score(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """{ne, auc, calibration, rows, log_loss, ctr} of logits against 0/1 labels."""
    n = int(labels.numel())
    if n == 0:
        nan = math.nan
        return {"ne": nan, "auc": nan, "calibration": nan, "rows": 0, "log_loss": nan,
                "ctr": nan}
    return {
        "ne": metrics.normalized_entropy(logits, labels),
        "auc": metrics.auc(logits, labels),
        "calibration": metrics.calibration(logits, labels),
        "rows": n,
        "log_loss": float(metrics.log_losses(logits, labels).mean()),
        "ctr": float(labels.double().mean()),
    }


def evaluate(model_dir: Path, data: Path, *, day: int = -1, batch_size: int = 8192,
             device: str = "cpu") -> dict[str, Any]:
    """Score the saved model in `model_dir` on one day of `data` (either layout)."""
    quiet_libraries()
    dev = torch.device(device)
    model, card = load_model(model_dir, dev)
    chosen = pick_day(list(day_files(data)), day, "evaluate.day")
    loader = BatchLoader(data, batch_size, days=[chosen], dedup=True,
                         hash_sizes=card.hash_sizes)
    if loader.schema.sparse_features != card.schema.sparse_features or \
            loader.schema.dense != card.schema.dense:
        raise ConfigError(f"evaluate: {data} has schema {loader.schema.name!r} with other "
                          f"features than the model's ({card.schema.name!r})")
    with Reporter(f"evaluate {card.kind}", total=loader.num_rows(), unit="rows") as rep:
        logits, labels = predict(model, loader, dev, reporter=rep)
    return {**score(logits, labels), "day": chosen, "kind": card.kind}
