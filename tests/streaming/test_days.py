"""A day's held-out last slice is cut where every history run starts (lrm.streaming.days):
both parts decode on their own and hold exactly the rows' own histories (and their ads'
attributes, when the day's files keep them in item tables)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute  # noqa: F401 (pa.compute)
import pyarrow.parquet as pq

from lrm.config import DedupConfig, GenerateConfig
from lrm.data import dedup, histories, items, parquet, synthetic
from lrm.data.loader import BatchLoader
from lrm.data.schema import day_files, window_columns
from lrm.exfm.augment import MANIFEST
from lrm.streaming.days import run_boundary, split_day
from lrm.streaming.layout import StreamPaths

# two users' sliding histories (one run each, rows 0-2 and 3-5), a null one (row 6: a run
# of its own), then a third user's run (rows 7-8)
LISTS = [[3, 2, 1], [4, 3, 2], [5, 4, 3], [9, 8], [10, 9], [11, 10], None, [7], [6, 7]]


def _table() -> pa.Table:
    enc = histories.encode(pa.array(LISTS, pa.list_(pa.int64())))
    off, length = window_columns("h")
    return pa.table({"h": enc.items, off: pa.array(enc.offset), length: pa.array(enc.length)})


def _decoded(t: pa.Table) -> list:
    off, length = window_columns("h")
    return histories.decode(t.column("h"), t.column(off), t.column(length)).expand().to_pylist()


def test_the_cut_moves_to_the_next_run_start():
    t = _table()
    assert [run_boundary(t, ["h"], w) for w in (0, 1, 2, 3, 4, 6, 7, 8)] == \
        [0, 3, 3, 3, 6, 6, 7, 7]  # 8: no start after it, the last one before
    for want in range(1, len(LISTS)):
        cut = run_boundary(t, ["h"], want)
        assert _decoded(t.slice(0, cut)) + _decoded(t.slice(cut)) == LISTS


def test_a_table_without_window_columns_cuts_anywhere():
    t = pa.table({"h": pa.array(LISTS, pa.list_(pa.int64()))})  # sessions layout 1
    assert run_boundary(t, ["h"], 4) == 4
    assert run_boundary(_table(), [], 4) == 4  # no sequence features


def test_a_day_of_files_with_item_tables_splits_into_the_same_rows(tmp_path):
    """Each file of a day has its own item table (lrm.data.items): the fit and held-out
    parts read back as the day's rows, every ad's attributes its own."""
    paths = StreamPaths(tmp_path / "stream")
    world = GenerateConfig(users=500, ads=100, advertisers=20, categories=8, days=1,
                           sessions_per_day=600, mean_session_length=6.0, max_history=20,
                           seed=5)
    synthetic.generate(world, tmp_path / "raw")
    dedup.dedup_dataset(tmp_path / "raw", paths.augmented, DedupConfig(rows_per_file=300))
    files = day_files(paths.augmented)[0]
    assert len(files) == 2 and all(items.moved(pq.ParquetFile(f), f) for f in files)
    (paths.augmented / "day=0" / MANIFEST).write_text(json.dumps({"teacher": {"hash": "t"}}))
    m = split_day(paths, 0, holdout=0.3)
    assert 0 < m["held_out_sessions"] < m["sessions"]
    whole = pa.concat_tables(parquet.read_table(f) for f in files)
    parts = [parquet.read_table(f) for p in paths.split(0) for f in day_files(p)[0]]
    assert pa.concat_tables(parts).equals(whole)
    for p in paths.split(0):  # and the loader takes each part
        assert sum(b.size for b in BatchLoader(p, 64)) > 0


def test_a_day_too_small_for_a_step_of_every_model_is_said_unfit():
    """`unfit` is the schedule's own answer (lrm.train.schedule.can_step), on the fit part a
    day without its next day trains on. Red with the holdout ignored (a day of 150 rows)
    and with the first-run schedule alone (min_steps 0: a carried day takes the full
    batch). A small surface's rows are no reason (issue 44: a tab of a few impressions a
    day would block the stream for good): red with the surfaces checked one by one."""
    import dataclasses

    from lrm.config import ParamsConfig, VerticalConfig, from_dict
    from functools import partial

    from lrm.streaming import days
    from stages.train import can_step

    unfit = partial(days.unfit, can_step=can_step)  # as the stream flow asks it

    cfg = ParamsConfig()
    world = GenerateConfig(users=500, ads=100, advertisers=10, categories=4,
                           sessions_per_day=400, max_history=5,
                           verticals=[VerticalConfig(name="all")])
    day = synthetic.generate_day(world, 0)
    assert day.num_rows > 400
    assert unfit(day, cfg) is None
    assert unfit(day.slice(0, 160), cfg) is None  # 128 of 160 train: one step of 128
    why = unfit(day.slice(0, 150), cfg)  # 150 - 30 held out = 120 < 128
    assert why is not None and "student small would train on 120 of its 150" in why
    assert "teacher" in unfit(day.slice(0, 100), dataclasses.replace(
        cfg, teacher=from_dict(type(cfg.teacher), {"train": {"min_batch_size": 101}},
                               "teacher")))
    carried = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, min_steps=0))
    assert unfit(day.slice(0, 1000), carried) is not None  # at fit_steps 0: batch 2048
    three = dataclasses.replace(world, verticals=[
        VerticalConfig(name="feed", share=10), VerticalConfig(name="video", share=0.1)])
    both = synthetic.generate_day(three, 0)
    video = both.filter(pa.compute.equal(both.column("vertical"), 1)).num_rows
    assert 0 < video < 100 and unfit(both, cfg) is None


def test_the_work_parts_of_done_days_but_the_newest_are_removed_and_only_lrm_s(tmp_path):
    """Red with the ownership check dropped (a user's file in work/day=1 went too), or with
    every done day's parts removed (the newest's are what a user inspects)."""
    from lrm import io
    from lrm.streaming.days import prune_work
    from lrm.streaming.layout import STAGE

    paths = StreamPaths(tmp_path / "s")
    for d in (1, 2, 3, 4):
        for part in paths.split(d):
            with io.atomic_dir(part, stage=STAGE) as tmp:
                (tmp / "part-00000.parquet").write_bytes(b"x")
    (paths.work / "day=1" / "mine.txt").write_text("a user's")
    assert prune_work(paths, [1, 2, 3]) == [2]  # 3: the newest done; 4: not done
    assert sorted(p.name for p in paths.work.iterdir()) == ["day=1", "day=3", "day=4"]
    assert (paths.work / "day=1" / "mine.txt").read_text() == "a user's"
