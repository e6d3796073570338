"""One cell of a day (the sessions of the users of one bucket) -> impressions-layout rows.

A cell holds every impression of its users on that day (lrm.data.logs.ingest cuts the days
into cells by a hash of the user), so everything here is local to it:

* **sessions**: a session column's value (a page view, a visit), cut by user; or a user's
  impressions, in time order, while the gap between two is at most `session_gap`; or, with
  neither, each page view (``explode``) or each impression is its own session. A session
  never straddles a day: the day is cut first.
* **order**: sessions by user, then start time; a session's impressions by time, then
  their place in the input (a page view keeps its display order). A cell may hold several
  buckets (cells are packed to about a chunk's rows): each comes whole, in bucket order, as
  if it were a cell of its own.
* **positions**: an impression's place in its session (0, 1, ...).
* **session ids**: ``day << 40 | n``, n counting the day's sessions: unique in the dataset.
* **session-level features** (the user, the vertical, sequences, a history column): the
  session's first impression's value, on every impression of it.
* **histories** (``history auto``): the user's clicked items before the session starts
  (click time strictly before the session's first impression), most recent first, at most
  `max_history`; never a click of the session itself or after it (tests/data/
  test_logs_sessions.py plants one). The clicks come from every day of the cell's bucket.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from lrm.config import LogsConfig, duration_seconds
from lrm.data.logs import dense as dense_mod
from lrm.data.logs import order as order_mod
from lrm.data.logs.frame import BUCKET, DAY, FILE, ITEM, LABEL, POS, ROW, SESSION, TIME, USER
from lrm.data.logs.vocab import Lookup
from lrm.data.schema import DAY as DAY_COL
from lrm.data.schema import LABEL as LABEL_COL
from lrm.data.schema import POSITION, SESSION as SESSION_COL
from lrm.data.schema import FeatureSchema

KEY = "_key"
MAX_POSITION = 2**15 - 1  # position is int16
SESSION_BITS = 40  # session_id = day << 40 | n


@dataclass(frozen=True)
class Plan:
    """What every cell of an ingest needs: the mapping and what the whole ingest decided."""

    cfg: LogsConfig
    schema: FeatureSchema
    features: Mapping[str, tuple[str, str]]  # feature -> (typed column, vocabulary)
    lookups: Mapping[str, Lookup]  # vocabulary -> its lookup
    dense: Mapping[str, dict[str, Any]]  # dense column -> how it is scaled
    max_history: int


def session_mode(cfg: LogsConfig) -> str:
    """column | gap | page (each input row is a session: a page view, or an impression)."""
    return "column" if cfg.session else "gap" if cfg.session_gap else "page"


def _run_starts(*keys: np.ndarray) -> np.ndarray:
    n = len(keys[0])
    if n == 0:
        return np.zeros(0, np.int64)
    change = np.zeros(n, bool)
    change[0] = True
    for k in keys:
        change[1:] |= k[1:] != k[:-1]
    return np.flatnonzero(change)


class Repeated(Exception):
    """Two input rows that are one impression read twice: (file index, row) of the first
    and of its repeat (the caller names the files)."""

    def __init__(self, first: tuple[int, int], again: tuple[int, int]) -> None:
        super().__init__(first, again)
        self.first, self.again = first, again


def repeats_told(cfg: LogsConfig) -> bool:
    """Whether two rows equal in every mapped column are surely one impression read twice
    (a copy, an overlapping export, a repeated line): they share a time (an impression's
    own), or a page view's id and their place in it; and they land in one cell (a user's,
    or a session's, rows all do). Without that, equal rows may be two impressions."""
    return bool((cfg.user or cfg.session) and (cfg.time or (cfg.explode and cfg.session)))


_MIX = np.uint64(0x9E3779B97F4A7C15)


def first_repeat(frame: pl.DataFrame, order: pl.Series, run_by: Sequence[str]) -> None:
    """Raise `Repeated` for the first row (by its place in the input) that repeats an
    earlier one in every mapped column. `order` sorts `frame` by `run_by` (the user, the
    time or the session) among other keys, so that repeats lie in one run of equal
    `run_by`: only rows in runs of two or more are hashed (numpy, the scalar columns), and
    rows whose hashes meet are compared whole. (polars' own duplicate search over every row
    cost ~30% of the ingest.)"""
    if frame.height < 2:
        return
    idx = order.to_numpy()
    same = np.ones(frame.height - 1, bool)
    for c in run_by:
        v = frame[c].to_numpy()[idx]
        same &= v[1:] == v[:-1]
    if not same.any():
        return
    in_run = np.zeros(frame.height, bool)
    in_run[1:] |= same
    in_run[:-1] |= same
    at = idx[in_run]  # rows of the runs, in the sort's order
    h = np.cumsum(np.r_[True, ~same])[in_run].astype(np.uint64)  # the run
    skip = {FILE, ROW, BUCKET, DAY, KEY, "_start", *run_by}
    for c, dt in frame.schema.items():
        if c in skip or not dt.is_numeric():
            continue  # (lists are compared whole below)
        v = frame[c].to_numpy()[at]
        v = v.view(np.uint64) if v.dtype.itemsize == 8 else v.astype(np.uint64)
        h = (h * _MIX) ^ v
        h ^= h >> np.uint64(29)
    by = np.argsort(h, kind="stable")
    meet = np.flatnonzero(h[by][1:] == h[by][:-1])
    if len(meet) == 0:
        return
    keep = [c for c in frame.columns if c not in (FILE, ROW, KEY)]
    found: list[tuple[tuple[int, int], tuple[int, int]]] = []
    for k in meet:
        a, b = int(at[by[k]]), int(at[by[k + 1]])
        ra, rb = frame.row(a, named=True), frame.row(b, named=True)
        if all(ra[c] == rb[c] for c in keep):
            pa_, pb = (int(ra[FILE]), int(ra[ROW])), (int(rb[FILE]), int(rb[ROW]))
            found.append((min(pa_, pb), max(pa_, pb)))
    if found:
        first, again = min(found, key=lambda p: (p[1], p[0]))
        raise Repeated(first, again)


def sessions(cell: pl.DataFrame, cfg: LogsConfig) -> pl.DataFrame:
    """The cell sorted into sessions (see the module doc), with `KEY`: the session's number
    in the cell (0, 1, ...; its rows contiguous); without the rows' place in the input
    and their day (a cell's day is one). `Repeated` where one impression was read twice
    (`repeats_told`)."""
    has_time, has_user = TIME in cell.columns, USER in cell.columns
    tie = [FILE, ROW, POS]
    rest = [*tie, *([DAY] if DAY in cell.columns else [])]  # not needed once sorted
    mode = session_mode(cfg)
    repeats = repeats_told(cfg)
    if mode == "gap":  # (a user's rows are all in her bucket)
        order = order_mod.arg_sort(cell, [BUCKET, USER, TIME], tie)
        if repeats:
            first_repeat(cell, order, [USER, TIME])
        df = cell.drop(rest)[order]
        t = df[TIME].to_numpy()
        gap = np.diff(t) >= duration_seconds(cfg.session_gap) * 1_000_000
        new = np.r_[True, gap | (df[USER].to_numpy()[1:] != df[USER].to_numpy()[:-1])]
        return df.with_columns(pl.Series(KEY, np.cumsum(new) - 1))
    raw = pl.col(SESSION) if mode == "column" else (
        pl.col(FILE).cast(pl.UInt64) * (1 << 40) + pl.col(ROW).cast(pl.UInt64))
    df = cell.with_columns(raw.alias(KEY))
    keys = [BUCKET, *([USER] if has_user else [])]
    if has_time:
        group = [USER, KEY] if has_user else [KEY]
        df = df.with_columns(pl.col(TIME).min().over(group).alias("_start"))
        keys += ["_start"]
    order = order_mod.arg_sort(df, [*keys, KEY, *([TIME] if has_time else [])], tie)
    if repeats:
        first_repeat(df, order, [*([USER] if has_user else []), TIME if has_time else KEY])
    df = df.drop(rest)[order]
    starts = _run_starts(df[KEY].to_numpy(), df[BUCKET].to_numpy(),
                         *([df[USER].to_numpy()] if has_user else []))
    sid = np.zeros(df.height, np.int64)
    sid[starts[1:]] = 1
    return df.with_columns(pl.Series(KEY, np.cumsum(sid)))


def _before(cu: np.ndarray, ct: np.ndarray, su: np.ndarray, st: np.ndarray) -> np.ndarray:
    """For each (user, time) of `su`, `st`: how many of the clicks (`cu`, `ct`: sorted by
    user, then time) come before it, by user, then time (a binary search over both at once:
    each packed into one integer of the same order)."""
    users = cu[_run_starts(cu)]  # the clicks' users, sorted
    cu_code = np.searchsorted(users, cu).astype(np.uint64)
    su_code = np.searchsorted(users, su).astype(np.uint64)  # (a user without clicks: the
    lo = min(int(ct.min()), int(st.min()))  # next one's code, and no click of hers found)
    span = max(int(ct.max()), int(st.max())) - lo
    if len(users).bit_length() + span.bit_length() <= 64:
        ct_code, st_code = (ct - lo).astype(np.uint64), (st - lo).astype(np.uint64)
        bits = span.bit_length()
    else:  # times too far apart to pack as they are: their ranks
        times = np.unique(np.r_[ct, st])
        ct_code = np.searchsorted(times, ct).astype(np.uint64)
        st_code = np.searchsorted(times, st).astype(np.uint64)
        bits = len(times).bit_length()
    shift = np.uint64(bits)
    return np.searchsorted((cu_code << shift) | ct_code, (su_code << shift) | st_code)


def histories(first_rows: pl.DataFrame, clicks: pl.DataFrame, k: int
              ) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, item hashes) of each session's history: the user's clicks strictly before
    the session's start, most recent first, at most `k`; `first_rows` holds each session's
    `USER` and `_start`, in session order."""
    n = first_rows.height
    if n:  # a click at or after the last start is in no history (nor are its user's first)
        clicks = clicks.filter(pl.col(TIME) < first_rows["_start"].max())
    if clicks.height == 0 or k == 0 or n == 0:
        return np.zeros(n + 1, np.int64), np.zeros(0, np.uint64)
    c = clicks.sort([USER, TIME, FILE, ROW, POS])
    cu, ct = c[USER].to_numpy(), c[TIME].to_numpy()
    su, st = first_rows[USER].to_numpy(), first_rows["_start"].to_numpy()
    hi = _before(cu, ct, su, st) - 1  # the user's last click before the start, if hers
    has = hi >= 0
    has[has] = cu[hi[has]] == su[has]
    starts = _run_starts(cu)
    first = np.repeat(starts, np.diff(np.r_[starts, len(cu)]))  # each click's user's first
    lo = np.where(has, np.maximum(first[hi.clip(0)], hi - k + 1), 0)
    lens = np.where(has, hi - lo + 1, 0)
    offsets = np.r_[0, np.cumsum(lens)]
    back = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lens)
    idx = np.repeat(hi, lens) - back
    return offsets, c[ITEM].to_numpy()[idx]


def _arrow(values: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """A numpy array as Arrow (through polars: pyarrow's own conversion imports pandas,
    seconds at the first call); `valid`: False where null."""
    s = pl.Series(values)
    if valid is not None and not valid.all():
        s = pl.select(pl.when(pl.Series(valid)).then(s)).to_series()
    return s.to_arrow()


def _list_array(offsets: np.ndarray, values: np.ndarray) -> pa.Array:
    return pa.ListArray.from_arrays(_arrow(offsets.astype(np.int32)),
                                    _arrow(values.astype(np.int64)))


def _per_row(offsets: np.ndarray, values: np.ndarray, session_of_row: np.ndarray
             ) -> pa.Array:
    """Session lists (offsets, values) repeated on every row of their session."""
    lens = np.diff(offsets)[session_of_row]
    row_off = np.r_[0, np.cumsum(lens)]
    take = np.repeat(offsets[:-1][session_of_row], lens) + (
        np.arange(row_off[-1]) - np.repeat(row_off[:-1], lens))
    return _list_array(row_off, values[take])


def _lists(series: pl.Series, lookup: Lookup, newest_first: bool, k: int
           ) -> tuple[np.ndarray, np.ndarray]:
    """A list column of hashes -> (offsets, ids), reversed when oldest first, at most k."""
    s = series if newest_first else series.list.reverse()
    if k:
        s = s.list.head(k)
    lens = s.list.len().fill_null(0).to_numpy().astype(np.int64)
    flat = s.explode().drop_nulls().to_numpy()
    return np.r_[0, np.cumsum(lens)], lookup(flat)


class Unscalable(Exception):
    """A dense value that its column's scaling takes past float32 (file index, row, column,
    the value as read): the caller names the file."""

    def __init__(self, file: int, row: int, column: str, value: float) -> None:
        super().__init__(file, row, column, value)
        self.file, self.row, self.column, self.value = file, row, column, value


class NotFinite(Exception):
    """A dense column's scaling takes a value of the cell past float32; the cell, read again
    (`first_unscalable`), says which (`build` lets it go before it knows)."""

    def __init__(self, column: str) -> None:
        super().__init__(column)
        self.column = column


def first_unscalable(cell: pl.DataFrame, plan: Plan, column: str) -> Unscalable:
    """The first row of `cell` (file, row) whose `column` its scaling takes past float32."""
    x = pl.col(f"d:{column}")
    bad = cell.filter(~dense_mod.scaled(x, plan.dense[column]).is_finite()).sort(FILE, ROW)
    return Unscalable(int(bad[FILE][0]), int(bad[ROW][0]), column, float(bad[f"d:{column}"][0]))


def build(cell: pl.DataFrame, clicks: pl.DataFrame | None, plan: Plan, day: int,
          first_session: int) -> tuple[pa.Table, dict[str, int]]:
    """The cell's impressions table (`plan.schema`, impressions layout) and its counts.
    `NotFinite` where a dense value cannot be scaled. The cell is let go once sorted (the
    caller holds no other reference: memory holds one copy of it, not two)."""
    cfg, schema = plan.cfg, plan.schema
    df = sessions(cell, cfg)
    del cell
    key = df[KEY].to_numpy()
    starts = _run_starts(key)
    lens = np.diff(np.r_[starts, df.height])
    n_sessions = len(starts)
    session_of_row = np.repeat(np.arange(n_sessions), lens)
    position = np.minimum(np.arange(df.height) - np.repeat(starts, lens), MAX_POSITION)
    cols: dict[str, pa.Array] = {
        DAY_COL: _arrow(np.full(df.height, day, np.int32)),
        SESSION_COL: _arrow((np.int64(day) << SESSION_BITS) + first_session
                            + session_of_row),
        POSITION: _arrow(position.astype(np.int16)),
        LABEL_COL: df[LABEL].cast(pl.Int8).to_arrow(),
    }
    first = df[starts] if n_sessions else df.clear()
    stats = {"rows": df.height, "sessions": n_sessions, "clicks": int(df[LABEL].sum()),
             "history_values": 0}
    # per-row lookups and the dense scalings: one query (its columns run side by side)
    query: dict[str, pl.Expr] = {n: dense_mod.scaled(pl.col(f"d:{n}"), plan.dense[n])
                                 for n in schema.dense}
    for feat, (col, vocab) in plan.features.items():
        lookup = plan.lookups[vocab]
        if col == "auto":  # the history: the user's earlier clicks
            assert clicks is not None
            first_start = first.select(USER, pl.col(TIME).alias("_start")) if "_start" not in \
                first.columns else first.select(USER, "_start")
            offsets, hashes = histories(first_start, clicks, plan.max_history)
            cols[feat] = _per_row(offsets, lookup(hashes), session_of_row)
            stats["history_values"] += int(offsets[-1])
        elif col.startswith("q:"):  # a sequence: the session's first row's
            newest = not (col[2:] == cfg.history and cfg.history_order == "oldest_first")
            k = plan.max_history if col[2:] == cfg.history else 0
            offsets, ids = _lists(first[col], lookup, newest, k)
            cols[feat] = _per_row(offsets, ids, session_of_row)
            if col[2:] == cfg.history:
                stats["history_values"] += int(offsets[-1])
        elif feat not in schema.user_sparse and (e := lookup.expr(col, df.height)) is not None:
            query[feat] = e  # (a missing id stays missing)
        else:
            session_level = feat in schema.user_sparse
            src = first[col] if session_level else df[col]
            if src.null_count():
                h = src.fill_null(0).to_numpy()  # (with nulls, to_numpy would give floats)
                valid = ~src.is_null().to_numpy()
                ids = np.zeros(len(h), np.int64)
                ids[valid] = lookup(h[valid])
            else:  # (no masks to apply: the common case)
                ids, valid = lookup(src.to_numpy()), None
            if session_level:
                ids = ids[session_of_row]
                valid = valid[session_of_row] if valid is not None else None
            cols[feat] = _arrow(ids, valid)
    try:
        done = df.select(**query)
    except pl.exceptions.InvalidOperationError:  # (replace_strict: a value it cannot map)
        raise KeyError("a value is missing from its vocabulary") from None
    for n in schema.dense:  # a continued ingest's scaling may not reach a new value
        if not done[n].is_finite().all():
            raise NotFinite(n)
    cols.update({n: done[n].to_arrow() for n in query})
    target = schema.arrow("impressions")
    return pa.table([cols[f.name] for f in target], schema=target), stats
