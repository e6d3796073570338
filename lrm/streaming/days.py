"""A day's data: dedup, what the day is evaluated on, and its collision report.

Evaluation data: students train on day D and are scored on day D + 1 when its raw data is
already there (a folder source given several days at once). Otherwise (the usual case of a
stream: D is the newest day) D itself is cut by session into a fit part (the first
1 - holdout of its sessions, what the students train on) and a held-out last slice (what
the challengers and champions are scored on); the report says which.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from lrm import io
from lrm.config import DedupConfig, TableConfig
from lrm.data import collisions
from lrm.data.schema import day_files, part_path, read_schema
from lrm.exfm.augment import MANIFEST
from lrm.streaming import sources
from lrm.streaming.layout import STAGE, StreamPaths

FROM = "_from.json"  # what a derived folder was made from: redone when that changes


def dedup_day(paths: StreamPaths, day: int, cfg: DedupConfig) -> dict[str, Any]:
    """raw/day=D -> sessions/day=D (RecD), once; the dedup metrics (or {"skipped": True})."""
    from lrm.data import dedup

    out = paths.sessions / f"day={day}"
    src = sources.read_source(paths.raw, day)
    if out.is_dir() and (out / FROM).is_file() and src is not None and \
            json.loads((out / FROM).read_text()) == src["files"]:
        return {"skipped": True}
    with tempfile.TemporaryDirectory(prefix="lrm-dedup-") as tmp:
        view = Path(tmp) / "raw"  # a dataset of day D alone: the day's own folder, linked
        view.mkdir()
        os.symlink((paths.raw / f"day={day}").resolve(), view / f"day={day}")
        with io.atomic_dir(out, stage=STAGE) as dst:
            metrics = dedup.dedup_dataset(view, Path(tmp) / "sessions", cfg)
            for f in day_files(Path(tmp) / "sessions")[day]:
                os.replace(f, dst / f.name)
            io.write_json(src["files"] if src else [], dst / FROM)
    return metrics


@dataclass(frozen=True)
class EvalPlan:
    """What day D's students train on and what every model of the day is scored on."""

    train_data: Path  # dataset holding day D (all of it, or its fit part)
    eval_data: Path  # dataset holding the evaluation day
    eval_day: int
    label: str  # for the report and the version tags
    next_day: bool  # True: day D + 1; False: D's held-out last slice

    @property
    def separate_eval(self) -> Path | None:
        """`eval_data` when it is not `train_data` (lrm.train.train's eval_from=)."""
        return None if self.eval_data == self.train_data else self.eval_data


def has_next_day(paths: StreamPaths, day: int) -> bool:
    return sources.read_source(paths.raw, day + 1) is not None


def plan(paths: StreamPaths, day: int, holdout: float) -> EvalPlan:
    """Day D + 1 when it is there, else D's last `holdout` of sessions (see `split_day`)."""
    if has_next_day(paths, day):
        return EvalPlan(paths.augmented, paths.augmented, day + 1,
                        f"day {day + 1} (the next day)", True)
    fit, held = paths.split(day)
    return EvalPlan(fit, held, day,
                    f"day {day}'s last {holdout:.0%} of sessions (held out: day {day + 1} is "
                    f"not there yet)", False)


def split_day(paths: StreamPaths, day: int, holdout: float) -> dict[str, Any]:
    """Cut augmented day D by session into fit (first) and held-out (last) datasets.

    Redone only when the augmented day changed (another teacher) or `holdout` did.
    """
    src = paths.augmented / f"day={day}"
    stamp = {"manifest": json.loads((src / MANIFEST).read_text())["teacher"],
             "holdout": holdout}
    fit, held = paths.split(day)
    done = [(p / FROM) for p in (fit, held)]
    if all(f.is_file() and json.loads(f.read_text()) == stamp for f in done):
        return {"skipped": True}
    files = day_files(paths.augmented)[day]
    table = pa.concat_tables([pq.read_table(f) for f in files])
    n = table.num_rows
    cut = n - max(1, math.ceil(holdout * n)) if n > 1 else n
    schema = pq.read_schema(files[0])  # keeps the lrm schema and teacher metadata
    for out, part in ((fit, table.slice(0, cut)), (held, table.slice(cut))):
        with io.atomic_dir(out, stage=STAGE) as tmp:
            io.write_parquet(part.cast(schema), part_path(tmp, day))
            io.write_json(stamp, tmp / FROM)
    return {"sessions": n, "fit_sessions": cut, "held_out_sessions": n - cut}


def collision_report(paths: StreamPaths, day: int, tables: TableConfig) -> dict[str, Any]:
    """The day's collision table (lrm.data.collisions) for the models' tables."""
    from lrm.models.tables import embedding_tables, hash_sizes

    schema, _ = read_schema(paths.raw)
    sizes = hash_sizes(embedding_tables(schema, tables, 1))  # rows do not depend on the dim
    files = day_files(paths.raw)
    prev = files.get(day - 1)
    return collisions.day_collisions(files[day], sizes, prev,
                                     collisions.watched(schema.vocab, sizes))
