"""The training data: which days train and which is held out, and how each rank reads them.

Rank r of W reads global batches r, r + W, ... of batch_size / W impressions (the loader's
split), so a step consumes the same impressions whatever W is; every rank gets the same
number of batches. The data position of a run is its step (see lrm.train.state).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torchrec import EmbeddingBagCollection

from lrm.config import LoaderConfig, SplitConfig, TrainConfig
from lrm.data.batch import Batch
from lrm.data.loader import BatchLoader
from lrm.data.schema import day_files
from lrm.errors import ConfigError, DataError
from lrm.models import hash_sizes
from lrm.dist import Dist
from lrm.train.evaluate import pick_day


def split_days(data: Path, cfg: SplitConfig, eval_from: Path | None = None
               ) -> tuple[list[int], int]:
    """(train days, eval day): `cfg.days` or every day before the eval day.

    eval_from: the held-out day is read from this dataset instead (e.g. the held-out last
    sessions of the train day itself, when the next day is not there yet).
    """
    available = list(day_files(data))
    held = available if eval_from is None else list(day_files(eval_from))
    eval_day = pick_day(held, cfg.eval_day, "split.eval_day")
    days = list(cfg.days) or [d for d in available if d < eval_day]
    missing = sorted(set(days) - set(available))
    if missing:
        raise ConfigError(f"split.days: no data for days {missing} in {data} "
                          f"(days: {available})")
    if eval_from is None and eval_day in days:
        raise ConfigError(f"split.days: {days} include the held-out eval_day {eval_day}")
    if not days:
        raise ConfigError(f"train: no train days before eval_day {eval_day} in {data} "
                          f"(days: {available}); set split.days")
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


def loaders(data: Path, cfg: TrainConfig, split: SplitConfig, loader_cfg: LoaderConfig,
            env: Dist, sizes: dict[str, int], teacher_column: str | None = None,
            eval_from: Path | None = None) -> tuple[BatchLoader, BatchLoader, list[int], int]:
    """(train loader, eval loader, train days, eval day) for this rank; `teacher_column`
    is read for training only (the held-out eval scores the serving head alone); the
    held-out day comes from `eval_from` when given (see `split_days`)."""
    train_days, eval_day = split_days(data, split, eval_from)
    held = data if eval_from is None else eval_from
    batch = per_rank_batch(cfg.batch_size, env.world_size)
    common: dict[str, Any] = dict(
        dedup=loader_cfg.recd, hash_sizes=sizes, rank=env.rank, world_size=env.world_size,
        prefetch=loader_cfg.prefetch, num_workers=loader_cfg.num_workers)
    train = BatchLoader(data, batch, days=train_days, drop_last=True,
                        teacher_column=teacher_column, **common)
    if len(train) == 0:
        raise DataError(data, None, None, f"days {train_days} hold fewer than one batch of "
                                          f"{cfg.batch_size} impressions")
    rows = BatchLoader(held, batch, days=[eval_day]).num_rows()
    held_out = BatchLoader(held, eval_batch(rows, env.world_size, batch), days=[eval_day],
                           **common)
    return train, held_out, train_days, eval_day


class EpochStream:
    """Endless batches of a loader, epoch after epoch, with its position as state.

    The position (epoch, batch within it) is part of every checkpoint; a resume seeks the
    loader there (`BatchLoader.load_state_dict`: the batches before it are never assembled).
    """

    def __init__(self, loader: BatchLoader) -> None:
        self.loader = loader
        self.epoch = 0
        self.batch = 0  # batches of this epoch handed out

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"epoch": torch.tensor(self.epoch), "batch": torch.tensor(self.batch)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])

    def __iter__(self) -> Iterator[Batch]:
        while True:
            if self.batch:
                self.loader.load_state_dict({"batch": self.batch,
                                             "batch_size": self.loader.batch_size,
                                             "world_size": self.loader.world_size})
            it = iter(self.loader)
            try:
                for b in it:
                    self.batch += 1
                    yield b
            finally:
                it.close()
            self.epoch, self.batch = self.epoch + 1, 0


def run_identity(kind: str, model_cfg: Any, sizes: dict[str, int], cfg: TrainConfig,
                 env: Dist, data: Path, train_days: list[int], loader_cfg: LoaderConfig
                 ) -> dict[str, Any]:
    """What a checkpoint must share with the run resuming it: the model, its tables, the
    batch cut and the data's shape (rows of every file of the train days: the same rows
    cut the same batches; values may differ, e.g. after fixing a NaN), as JSON-able values."""
    import dataclasses

    import pyarrow.parquet as pq

    files = day_files(data)
    return {
        "kind": kind, "model": dataclasses.asdict(getattr(model_cfg, kind)),
        "tables": dataclasses.asdict(model_cfg.tables), "table_rows": sizes,
        "batch_size": cfg.batch_size, "world_size": env.world_size, "seed": cfg.seed,
        "recd": loader_cfg.recd, "train_days": train_days,
        "data": {str(d): [[f.name, pq.read_metadata(f).num_rows] for f in files[d]]
                 for d in train_days},
    }
