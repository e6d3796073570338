"""The training data: which days train and which is held out, what the train days look like,
and how each rank reads them.

Rank r of W reads global batches r, r + W, ... of batch_size / W impressions (the loader's
split), so a step consumes the same impressions whatever W is; every rank gets the same
number of batches. The train days' stream is cut in two: the first batches train, the last
ones (the freshest impressions) are the validation slice (lrm.train.schedule says how many).
The data position of a run is the number of batches its steps consumed (`EpochStream`).
"""

from __future__ import annotations

import dataclasses

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch import nn
from torchrec import EmbeddingBagCollection

from lrm import io
from lrm.config import LoaderConfig, SplitConfig, TrainConfig
from lrm.data import parquet, values
from lrm.data.batch import Batch
from lrm.data.loader import BatchLoader, keep_verticals
from lrm.data.dataset import Dataset
from lrm.data.schema import LABEL, FeatureSchema, pick_day
from lrm.errors import ConfigError, DataError
from lrm.models import hash_sizes
from lrm.dist import Dist, loader_workers


# the distinct ids of hashed features are counted over at most this many rows (a pass over
# a few million rows takes seconds); a larger dataset keeps model.tables.hash_size
SCAN_ROWS = 4_000_000


def split_days(data: Dataset, cfg: SplitConfig, held: Dataset | None = None
               ) -> tuple[list[int], int]:
    """(train days, eval day): `cfg.days` or every day before the eval day.

    held: the held-out day is read from this dataset instead (e.g. the held-out last
    sessions of the train day itself, when the next day is not there yet, or a test file
    ingested on its own); then every day of `data` trains unless `cfg.days` says otherwise.
    """
    if held is not None and held.root.resolve() == data.root.resolve():
        raise ConfigError(f"train: the held-out dataset is the train data ({data.root}): every "
                          f"day of it would train, the held-out one too; leave it out to hold "
                          f"out the data's own split.eval_day")
    available = data.days
    eval_day = pick_day((held or data).days, cfg.eval_day, "split.eval_day")
    days = list(cfg.days) or [d for d in available if held is not None or d < eval_day]
    missing = sorted(set(days) - set(available))
    if missing:
        raise ConfigError(f"split.days: no data for days {missing} in {data.root} "
                          f"(days: {available})")
    if held is None and eval_day in days:
        raise ConfigError(f"split.days: {days} include the held-out eval_day {eval_day}")
    if not days:
        raise ConfigError(
            f"train: no train days before the held-out eval_day {eval_day} in {data.root} "
            f"(days: {available}); hold out another dataset instead (lrm train --eval-data "
            f"DIR, e.g. a test file ingested on its own), or give the data a later day to "
            f"hold out (lrm ingest criteo TRAIN.tsv TEST.tsv: a day per file)")
    return sorted(days), eval_day


@dataclass(frozen=True)
class DataStats:
    """What the train days hold: rows, clicks, and distinct ids of the hashed features."""

    rows: int
    positives: int
    # hashed feature -> distinct non-null ids seen, for those with at most `cap` of them
    # (a feature with more, or a scan cut short by SCAN_ROWS, is absent)
    distinct: dict[str, int] = field(default_factory=dict)

    @property
    def ctr(self) -> float:
        return self.positives / self.rows if self.rows else math.nan


def _flat(col: pa.ChunkedArray) -> pa.Array:
    arr = col.combine_chunks()
    return pc.list_flatten(arr) if pa.types.is_list(arr.type) else arr


def scan_days(data: Path | Dataset, days: Sequence[int], hashed: Sequence[str] = (),
              cap: int = 0, verticals: Sequence[int] | None = None) -> DataStats:
    """Rows and clicks of `days` (the label column only; the sessions of `verticals` only,
    when given), and the distinct ids of each `hashed` feature while it has at most `cap`
    (each stops being counted past that)."""
    ds = Dataset.open(data)
    keep = keep_verticals(ds.schema, verticals, ds.root)
    rows = positives = 0
    seen: dict[str, np.ndarray] = {f: np.empty(0, np.int64) for f in hashed}
    for d in days:
        for f in ds.files[d]:
            counting = [k for k in seen if len(seen[k]) <= cap] if rows < SCAN_ROWS else []
            vertical = [ds.schema.vertical] if keep is not None else []
            t = parquet.read_table(f, columns=list(dict.fromkeys([LABEL, *counting, *vertical])),
                                   check=values.checker(ds.schema, f))  # labels checked
            if keep is not None:  # before a step runs
                t = t.filter(pc.fill_null(pc.is_in(t.column(vertical[0]), value_set=keep),
                                          False))
            labels = _flat(t.column(LABEL))
            rows += len(labels)
            positives += int(pc.sum(labels).as_py() or 0)
            for k in counting:
                ids = _flat(t.column(k)).drop_null().to_numpy(zero_copy_only=False)
                seen[k] = np.union1d(seen[k], ids)
    scanned_all = rows <= SCAN_ROWS
    return DataStats(rows, positives, {k: len(v) for k, v in seen.items()
                                       if len(v) <= cap and scanned_all})


def fit_tables(schema: FeatureSchema, stats: DataStats) -> FeatureSchema:
    """`schema` with the id space of each hashed feature whose distinct ids were counted set
    to that count: its table gets no more rows than the train days have ids for (the loader
    hashes ids into those rows). Features with a known vocab keep it."""
    fitted = {k: max(1, n) for k, n in stats.distinct.items() if k not in schema.vocab}
    if not fitted:
        return schema
    return dataclasses.replace(schema, vocab={**schema.vocab, **fitted})


def hashed_features(schema: FeatureSchema) -> list[str]:
    """Sparse features without a known vocab (their ids are hashed into a table)."""
    return [f for f in schema.sparse_features if f not in schema.vocab]


@dataclass(frozen=True)
class TrainData:
    """A run's data, looked at once: the dataset, where the held-out day is read, the
    split, and what the train days hold (rows, clicks, distinct hashed ids)."""

    data: Dataset  # the train days' dataset
    held: Dataset  # the held-out day's (`data` itself unless another one is held out)
    train_days: list[int]
    eval_day: int
    stats: DataStats
    verticals: list[int] | None = None  # only these verticals' sessions (None: every row)

    @classmethod
    def open(cls, data: Path, split: SplitConfig, eval_from: Path | None = None, *,
             fit: bool = False, cap: int = 0) -> TrainData:
        """fit: count the distinct ids of the hashed features (up to `cap` each), for
        `fit_tables`. Every file of the run lrm did not write as it is now is checked
        value by value first (`Dataset.check_foreign`)."""
        ds = Dataset.open(data)
        held = Dataset.open(eval_from) if eval_from is not None else None
        train_days, eval_day = split_days(ds, split, held)
        ds.check_foreign(train_days)
        (held or ds).check_foreign([eval_day])
        stats = scan_days(ds, train_days, hashed_features(ds.schema) if fit else (), cap,
                          split.verticals or None)
        return cls(ds, held or ds, train_days, eval_day, stats, split.verticals or None)

    @property
    def schema(self) -> FeatureSchema:
        return self.data.schema


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


@dataclass
class Loaders:
    """This rank's loaders: the train stream, its validation slice, the held-out day."""

    train: BatchLoader  # the train days; an epoch is its first `train_batches` batches
    train_batches: int  # per rank
    validation: BatchLoader | None  # the train days again, read from `train_batches` on
    held_out: BatchLoader
    # the validation slice's batches once read whole: a run validates ten times an epoch,
    # and each pass read the slice again, seeking past the train batches (scoring it was a
    # quarter of a small VM's run in a stream worker's profile, docs/performance.md). At
    # most train.val_max_rows impressions are kept.
    _validation: list[Batch] | None = field(default=None, repr=False)

    def validation_batches(self) -> Iterator[Batch]:
        """The validation slice: the train stream's batches after the training ones (read
        once; the passes after the first one give the same batches from memory)."""
        assert self.validation is not None
        if self._validation is not None:
            return iter(self._validation)
        return self._read_validation()

    def _read_validation(self) -> Iterator[Batch]:
        assert self.validation is not None
        seek(self.validation, self.train_batches)
        kept = []
        for b in self.validation:
            kept.append(b)
            yield b
        self._validation = kept  # only a whole pass is kept


def seek(loader: BatchLoader, batch: int) -> None:
    """The loader's next iteration starts after this rank's first `batch` batches."""
    loader.load_state_dict({"batch": batch, "batch_size": loader.batch_size,
                            "world_size": loader.world_size})


def loaders(data: TrainData, batch_size: int, val_batches: int, loader_cfg: LoaderConfig,
            env: Dist, sizes: dict[str, int], teacher_column: str | None = None) -> Loaders:
    """This rank's loaders, at a global `batch_size`, the last `val_batches` (per rank) of
    the train days held out for validation; `teacher_column` is read for training only
    (the held-out eval and validation score the serving head alone)."""
    batch = per_rank_batch(batch_size, env.world_size)
    common: dict[str, Any] = dict(
        dedup=loader_cfg.recd, hash_sizes=sizes, rank=env.rank, world_size=env.world_size,
        prefetch=loader_cfg.prefetch, verticals=data.verticals,
        num_workers=loader_workers(loader_cfg.num_workers, env.device))
    train = BatchLoader(data.data, batch, days=data.train_days, drop_last=True,
                        teacher_column=teacher_column, pin_memory=env.device.type == "cuda",
                        **common)
    if len(train) - val_batches < 1:
        raise DataError(data.data.root, None, None, f"days {data.train_days} hold fewer than "
                        f"one batch of {batch_size} impressions to train on")
    validation = (BatchLoader(data.data, batch, days=data.train_days, drop_last=True, **common)
                  if val_batches else None)
    rows = BatchLoader(data.held, batch, days=[data.eval_day],
                       verticals=data.verticals).num_rows()
    held = BatchLoader(data.held, eval_batch(rows, env.world_size, batch), days=[data.eval_day],
                       **common)
    return Loaders(train, len(train) - val_batches, validation, held)


class EpochStream:
    """Endless batches of a loader's first `batches` batches, epoch after epoch, with the
    position of the steps that consumed them as state.

    The loop calls `advance()` once per optimizer step: the position counts the batches
    steps used, not those read ahead (the train pipeline holds two more). It is part of
    every checkpoint as (epoch, batch within it); a resume seeks the loader there
    (`BatchLoader.load_state_dict`: the batches before it are never assembled).
    """

    def __init__(self, loader: BatchLoader, batches: int) -> None:
        if batches < 1:
            raise ValueError(f"an epoch needs at least one batch, got {batches}")
        self.loader, self.batches = loader, batches
        self.used = 0  # batches consumed by steps, over every epoch

    def advance(self) -> None:
        self.used += 1

    def state_dict(self) -> dict[str, torch.Tensor]:
        epoch, batch = divmod(self.used, self.batches)
        return {"epoch": torch.tensor(epoch), "batch": torch.tensor(batch)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.used = int(state["epoch"]) * self.batches + int(state["batch"])

    def __iter__(self) -> Iterator[Batch]:
        """Batches from the current position on (a new iterator starts there again)."""
        epoch_start = self.used % self.batches
        while True:
            seek(self.loader, epoch_start)
            it = iter(self.loader)
            try:
                for _ in range(self.batches - epoch_start):
                    b = next(it, None)
                    if b is None:
                        raise DataError(self.loader.root, None, None, "the train days "
                                        "changed while training (fewer batches than counted)")
                    yield b
            finally:
                it.close()
            epoch_start = 0


def run_identity(kind: str, model_cfg: Any, sizes: dict[str, int], cfg: TrainConfig,
                 batch_size: int, epoch_batches: int, env: Dist, data: TrainData,
                 loader_cfg: LoaderConfig) -> dict[str, Any]:
    """What a checkpoint must share with the run resuming it: the model, its tables, the
    batch cut (the batch size the schedule chose, the batches an epoch trains on) and the
    data by content (every file of the train days: its name, rows and sha256, the hash lrm
    recorded when it wrote the file while the file is unchanged: lrm.io.recorded_sha256), as
    JSON-able values. Data changed since the checkpoint (even with the same files and rows,
    e.g. labels rewritten) is another run: going on from it would mix two datasets."""
    files = data.data.files
    return {
        "kind": kind, "model": dataclasses.asdict(getattr(model_cfg, kind)),
        "tables": dataclasses.asdict(model_cfg.tables), "table_rows": sizes,
        "batch_size": batch_size, "epoch_batches": epoch_batches,
        "world_size": env.world_size, "seed": cfg.seed,
        "recd": loader_cfg.recd, "train_days": data.train_days, "verticals": data.verticals,
        # a checkpoint with no average cannot go on averaging (absent when off: checkpoints
        # from before the key existed resume as they did)
        **({"ema_decay": cfg.ema_decay} if cfg.ema_decay else {}),
        "data": {str(d): [[f.name, parquet.read_metadata(f).num_rows, io.recorded_sha256(f)]
                          for f in files[d]] for d in data.train_days},
    }
