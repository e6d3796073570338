"""The training data: which days train and which is held out, and how each rank reads them.

Rank r of W reads global batches r, r + W, ... of batch_size / W impressions (the loader's
split), so a step consumes the same impressions whatever W is; every rank gets the same
number of batches. The data position of a run is its step (see lrm.train.state).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from torch import nn
from torchrec import EmbeddingBagCollection

from lrm.config import LoaderConfig, TrainConfig
from lrm.data.batch import Batch
from lrm.data.loader import BatchLoader
from lrm.data.schema import day_files
from lrm.errors import ConfigError, DataError
from lrm.models import hash_sizes
from lrm.dist import Dist
from lrm.train.evaluate import pick_day


def split_days(data: Path, cfg: TrainConfig) -> tuple[list[int], int]:
    """(train days, eval day): `cfg.days` or every day before the eval day."""
    available = list(day_files(data))
    eval_day = pick_day(available, cfg.eval_day, "train.eval_day")
    days = list(cfg.days) or [d for d in available if d < eval_day]
    missing = sorted(set(days) - set(available))
    if missing:
        raise ConfigError(f"train.days: no data for days {missing} in {data} "
                          f"(days: {available})")
    if eval_day in days:
        raise ConfigError(f"train.days: {days} include the held-out eval_day {eval_day}")
    if not days:
        raise ConfigError(f"train: no train days before eval_day {eval_day} in {data} "
                          f"(days: {available}); set train.days")
    return sorted(days), eval_day


def per_rank_batch(batch_size: int, world_size: int) -> int:
    if batch_size % world_size:
        raise ConfigError(f"train.batch_size: {batch_size} is not divisible by the "
                          f"{world_size} processes")
    return batch_size // world_size


def eval_batch(rows: int, world_size: int, batch: int) -> int:
    """A per-rank batch near `batch` that cuts `rows` into a multiple of `world_size` batches.

    The loader gives every rank the same number of batches and drops the tail that not
    every rank can have; this size leaves no such tail (when it exceeds W x steps).
    """
    steps = max(1, -(-rows // (world_size * batch)))
    return max(1, -(-rows // (world_size * steps)))


def model_hash_sizes(model: nn.Module) -> dict[str, int]:
    """feature -> table rows, for the loader (ids are mapped into [0, rows))."""
    return hash_sizes([t for m in model.modules() if isinstance(m, EmbeddingBagCollection)
                       for t in m.embedding_bag_configs()])


def loaders(data: Path, cfg: TrainConfig, loader_cfg: LoaderConfig, env: Dist,
            sizes: dict[str, int], teacher_column: str | None = None
            ) -> tuple[BatchLoader, BatchLoader, list[int], int]:
    """(train loader, eval loader, train days, eval day) for this rank; `teacher_column`
    is read for training only (the held-out eval scores the serving head alone)."""
    train_days, eval_day = split_days(data, cfg)
    batch = per_rank_batch(cfg.batch_size, env.world_size)
    common: dict[str, Any] = dict(
        dedup=loader_cfg.dedup, hash_sizes=sizes, rank=env.rank, world_size=env.world_size,
        prefetch=loader_cfg.prefetch, num_workers=loader_cfg.num_workers)
    train = BatchLoader(data, batch, days=train_days, drop_last=True,
                        teacher_column=teacher_column, **common)
    if len(train) == 0:
        raise DataError(data, None, None, f"days {train_days} hold fewer than one batch of "
                                          f"{cfg.batch_size} impressions")
    rows = BatchLoader(data, batch, days=[eval_day]).num_rows()
    held_out = BatchLoader(data, eval_batch(rows, env.world_size, batch), days=[eval_day],
                           **common)
    return train, held_out, train_days, eval_day


def epochs_from(loader: BatchLoader, step: int) -> Iterator[Batch]:
    """Endless batches from global position `step` on (epoch after epoch)."""
    skip = step % len(loader)
    while True:
        it = iter(loader)
        try:
            if skip:  # a resume: consume (and drop) what the checkpointed run already saw
                next(islice(it, skip, skip), None)
                skip = 0
            yield from it
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()
