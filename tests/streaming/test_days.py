"""A day's held-out last slice is cut where every history run starts (lrm.streaming.days):
both parts decode on their own and hold exactly the rows' own histories (and their ads'
attributes, when the day's files keep them in item tables)."""

from __future__ import annotations

import json

import pyarrow as pa
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
