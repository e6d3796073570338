"""A day's held-out last slice is cut where every history run starts (lrm.streaming.days):
both parts decode on their own and hold exactly the rows' own histories."""

from __future__ import annotations

import pyarrow as pa

from lrm.data import histories
from lrm.data.schema import window_columns
from lrm.streaming.days import run_boundary

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
