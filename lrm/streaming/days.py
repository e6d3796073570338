"""A day's data: dedup, what the day is evaluated on, and its collision report.

Evaluation data: students train on day D and are scored on day D + 1 when its raw data is
already there (a folder source given several days at once). Otherwise (the usual case of a
stream: D is the newest day) D itself is cut by session into a fit part (the first
1 - holdout of its sessions, what the students train on) and a held-out last slice (what
the challengers and champions are scored on); the report says which. The days have no
time within a day, so "last" is storage order: RecD sorts a file's sessions by user, and
the cut falls where every history run starts (`run_boundary`), so the held-out slice is
whole users' sessions of the day.
"""

from __future__ import annotations

import json
from collections.abc import Callable
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from lrm import io
from lrm.config import DedupConfig, ParamsConfig, TableConfig, TrainConfig
from lrm.data import collisions, parquet
from lrm.data.schema import META_KEY, FeatureSchema, day_files, part_path, read_schema
from lrm.errors import ConfigError, DataError
from lrm.exfm.augment import read_manifest
from lrm.exfm.students import vertical_models
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
    with io.scratch_dir("lrm-dedup-") as tmp:
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
                    f"day {day}'s last {holdout:.0%} of sessions in storage order (held out: "
                    f"day {day + 1} is not there yet)", False)


def judged_on(paths: StreamPaths) -> EvalPlan:
    """The rows the stream judged its newest recorded day's models on (day D + 1, or D's
    held-out slice: `plan` as that day ran it), for a promotion by hand to judge on the same
    rows. A ConfigError where the stream has recorded no day (or pruned those rows)."""
    from lrm.streaming import ledger

    done = ledger.recorded_days(paths)
    if not done:
        raise ConfigError(f"no stream day recorded under {paths.root}: pass --data and --day "
                          f"(a day neither model trained on)")
    day = done[-1]
    rec = ledger.read(paths, day) or {}
    if rec.get("next_day"):
        return EvalPlan(paths.augmented, paths.augmented, day + 1,
                        f"day {day + 1} (the next day)", True)
    fit, held = paths.split(day)
    if not held.is_dir():
        raise ConfigError(f"{held}: the held-out rows day {day} was judged on are gone: pass "
                          f"--data and --day (a day neither model trained on)")
    return EvalPlan(fit, held, day, f"day {day}'s held-out last slice (as the stream judged "
                                    f"it)", False)


def fit_rows(n: int, holdout: float) -> int:
    """Of a day's `n` rows, how many its fit part aims at (the cut then moves to where the
    histories' runs start, `run_boundary`): all but the last `holdout`, at least one held."""
    return n - max(1, math.ceil(holdout * n)) if n > 1 else n


def unfit(table: pa.Table, cfg: ParamsConfig,
          can_step: Callable[[TrainConfig, int], bool]) -> str | None:
    """Why a new day's impressions (`table`, lrm schema) cannot be a stream day, in words;
    None when they can. The teacher must take a step on the whole day, and on data of one
    surface its student on the day's fit part (the first 1 - `streaming.holdout`, as
    `split_day` cuts it, while the next day is not there), each at the smallest batch its
    schedule takes (`can_step(train, rows)`: the training stage's rule, stages.train.can_step;
    the stream trains only through the stages). A surface's day too small for its own vertical models is no reason:
    they skip the day and say so (a small surface of an export has such days every day).
    Checked when the day is made, where its file can still be named and left out; found by
    training, the day would fail every run."""
    schema = FeatureSchema.from_json(table.schema.metadata[META_KEY].decode())
    n = table.num_rows
    if not can_step(cfg.train_for("teacher"), n):
        return (f"its {n} impressions are too few for one teacher step at the smallest "
                f"batch (train.min_batch_size)")
    student = cfg.train_for("students")
    for vm in vertical_models(schema, list(cfg.students.models)):
        if vm.vertical is not None:
            continue  # a surface's own day: its VMs skip it (stages/student.py)
        fit = fit_rows(n, cfg.streaming.holdout)
        if not can_step(student, fit):
            return (f"student {vm.name} would train on {fit} of its {n} "
                    f"impressions (the first {1 - cfg.streaming.holdout:.0%}; the rest is "
                    f"held out), too few for one step of the smallest batch "
                    f"(train.min_batch_size)")
    return None


def split_day(paths: StreamPaths, day: int, holdout: float) -> dict[str, Any]:
    """Cut augmented day D by session into fit (first) and held-out (last) datasets.

    Redone only when the augmented day changed (another teacher) or `holdout` did.
    """
    src = paths.augmented / f"day={day}"
    manifest = read_manifest(src)
    if manifest is None:
        raise DataError(src, None, None, "no readable augment manifest (run the day again)")
    stamp = {"manifest": manifest["teacher"], "holdout": holdout}
    fit, held = paths.split(day)
    done = [(p / FROM) for p in (fit, held)]
    if all(f.is_file() and json.loads(f.read_text()) == stamp for f in done):
        return {"skipped": True}
    files = day_files(paths.augmented)[day]
    # read as the impressions' columns (item tables put back: each file has its own)
    tables = [parquet.read_table(f) for f in files]
    table = pa.concat_tables(tables)
    n = table.num_rows
    want = fit_rows(n, holdout)
    cut = run_boundary(table, read_schema(files[0])[0].user_seq, want)
    schema = tables[0].schema  # keeps the lrm schema and teacher metadata
    for out, part in ((fit, table.slice(0, cut)), (held, table.slice(cut))):
        with io.atomic_dir(out, stage=STAGE) as tmp:
            io.write_parquet(part.cast(schema), part_path(tmp, day))
            io.write_json(stamp, tmp / FROM)
    return {"sessions": n, "fit_sessions": cut, "held_out_sessions": n - cut}


def prune_work(paths: StreamPaths, done: list[int]) -> list[int]:
    """Remove the fit and held-out parts (`work/day=d/`, copies of augmented day d) of the
    done days but the newest: a done day is never trained or scored again (its record makes
    a run of it a no-op), so they only fill the disk, a day's size each day. Only folders
    holding nothing but the stream's own parts go; the removed days."""
    gone = []
    for d in sorted(done)[:-1]:
        folder = paths.work / f"day={d}"
        parts = set(paths.split(d))
        if not folder.is_dir() or any(p not in parts or io.owned_by_lrm(p) != STAGE
                                      for p in folder.iterdir()):
            continue
        shutil.rmtree(folder)
        gone.append(d)
    return gone


def run_boundary(table: pa.Table, sequences: list[str], want: int) -> int:
    """The first row at or after `want` where every sequence feature starts a history run
    (lrm.data.histories: a run's items live on its first row, so a cut inside a run would
    leave the held-out rows windows into items the fit part holds); the last such row
    before `want` when there is none after it, and `want` when no row starts every run."""
    import numpy as np

    from lrm.data.schema import window_columns

    starts = np.ones(table.num_rows, dtype=bool)
    for f in sequences:
        offset_col = window_columns(f)[0]
        if offset_col not in table.column_names:  # sessions layout 1: every row holds its list
            continue
        stored = table.column(f).is_valid().to_numpy(zero_copy_only=False)
        offset = table.column(offset_col).to_numpy(zero_copy_only=False)
        starts &= stored | (offset == -1)
    starts[0] = True  # row 0 always starts a run (the fit part then is empty: see below)
    after = np.flatnonzero(starts[want:])
    if len(after):
        return want + int(after[0])
    before = np.flatnonzero(starts[1:want])
    return 1 + int(before[-1]) if len(before) else want


def collision_report(paths: StreamPaths, day: int, tables: TableConfig) -> dict[str, Any]:
    """The day's collision table (lrm.data.collisions) for the models' tables."""
    from lrm.models.tables import embedding_tables, hash_sizes

    schema, _ = read_schema(paths.raw)
    sizes = hash_sizes(embedding_tables(schema, tables, 1))  # rows do not depend on the dim
    files = day_files(paths.raw)
    prev = files.get(day - 1)
    return collisions.day_collisions(files[day], sizes, prev,
                                     collisions.watched(schema.vocab, sizes))
