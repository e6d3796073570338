"""The sessions layout, table by table: impression rows -> one row per session (user-side
columns once, the rest as lists), histories shared over runs of a user's sessions, and back.

In the ``impressions`` layout every impression repeats its session's user-side columns
(``day``, ``session_id``, ``schema.user_sparse``, ``schema.user_seq``); in the ``sessions``
layout those columns appear once per session and every other column becomes a list with
one entry per impression. Sessions must be contiguous in the input (the generator and
ingest write them so).

RecD clusters: the sessions are sorted by the schema's user key, then its vertical
(stably, so a user's sessions keep their time order), and a sequence feature is stored
once per run of sessions whose histories slide over one stream (lrm.data.histories): a
user's sessions of a day share one stored history, each with its window (offset, length).
A run never crosses a row group or a vertical. Without a user key (Criteo) the sessions
keep their input order.

Everything is vectorized over Arrow buffers: session boundaries are the run starts of
``session_id``, user-side constancy is checked by comparing each row with its session's
first row, and list columns are built from the run offsets without copying values.
lrm.data.dedup writes whole datasets of it, day by day.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lrm.data import histories, values
from lrm.data.schema import (
    DAY,
    LABEL,
    META_KEY,
    SESSION,
    FeatureSchema,
    sessions_version,
    window_columns,
)
from lrm.errors import DataError


def session_columns(schema: FeatureSchema) -> tuple[str, ...]:
    """Columns stored once per session: day, session_id and the user-side features."""
    return (DAY, SESSION) + schema.user_sparse + schema.user_seq


def _windows(schema: FeatureSchema) -> tuple[str, ...]:
    return tuple(c for f in schema.user_seq for c in window_columns(f))


def _layout_of(table: pa.Table) -> str | None:
    meta = table.schema.metadata or {}
    v = meta.get(b"lrm.layout")
    return v.decode() if v is not None else None


def _to_array(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    return col


def run_starts(values: np.ndarray) -> np.ndarray:
    """Indices where a new run of equal consecutive values begins (first is 0)."""
    if values.size == 0:
        return np.zeros(0, dtype=np.int64)
    change = np.empty(values.size, dtype=bool)
    change[0] = True
    np.not_equal(values[1:], values[:-1], out=change[1:])
    return np.flatnonzero(change)


def _session_ids(table: pa.Table, source: Path | str) -> np.ndarray:
    col = _to_array(table.column(SESSION))
    if col.null_count:
        row = int(np.flatnonzero(~col.is_valid().to_numpy(zero_copy_only=False))[0])
        raise DataError(source, None, SESSION, f"null session_id at row {row}")
    return col.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def _first_duplicate(run_ids: np.ndarray) -> int | None:
    """Index (into run_ids) of the first run whose id already appeared earlier, or None."""
    if run_ids.size < 2:
        return None
    order = np.argsort(run_ids, kind="stable")
    s = run_ids[order]
    dup = np.flatnonzero(s[1:] == s[:-1])
    return None if dup.size == 0 else int(order[dup + 1].min())


def _numpy(arr: pa.Array) -> np.ndarray:
    """Values as numpy; nulls read as 0 (callers compare validity separately)."""
    if arr.null_count:
        arr = pc.fill_null(arr, 0)
    return _to_array(arr).to_numpy(zero_copy_only=False)


def _scalar_mismatch(arr: pa.Array, rep: np.ndarray) -> np.ndarray:
    """Rows whose value differs from row rep[i]'s (null counts as a value)."""
    vals = _numpy(arr)
    bad = vals != vals[rep]
    if arr.null_count:
        valid = arr.is_valid().to_numpy(zero_copy_only=False)
        bad |= valid != valid[rep]
    return bad


def _list_mismatch(arr: pa.Array, rep: np.ndarray) -> np.ndarray:
    """Rows whose list differs from row rep[i]'s (null lists, lengths, elements).

    Rows of a session are contiguous, and so are their lists in the flattened values:
    once the lengths agree, element j of a non-first row must equal element j - length,
    the same element of the row before. One shift, one gather, one comparison.
    """
    n = len(arr)
    lens = _numpy(pc.list_value_length(arr)).astype(np.int64)
    bad = lens != lens[rep]
    if arr.null_count:
        valid = arr.is_valid().to_numpy(zero_copy_only=False)
        bad |= valid != valid[rep]
    flat = _to_array(pc.list_flatten(arr))  # values of valid lists, in row order
    if len(flat) == 0 or bad.any():
        return bad
    idx = np.int32 if len(flat) < 2**31 else np.int64
    first = rep == np.arange(n)
    shift = np.repeat(np.where(first, 0, lens).astype(idx), lens)
    ref = np.arange(len(flat), dtype=idx)
    ref -= shift
    vals = _numpy(flat)
    elem_bad = vals[ref] != vals
    if flat.null_count:
        fvalid = flat.is_valid().to_numpy(zero_copy_only=False)
        elem_bad |= fvalid[ref] != fvalid
    if elem_bad.any():
        offs = np.concatenate([[0], np.cumsum(lens)])
        bad[np.searchsorted(offs, np.flatnonzero(elem_bad), side="right") - 1] = True
    return bad


def _check_layout(table: pa.Table, schema: FeatureSchema, layout: str,
                  source: Path | str) -> None:
    found = _layout_of(table)
    if found is not None and found != layout:
        raise DataError(source, None, None, f"expected the {layout} layout, found {found}")
    expected = schema.arrow(layout)
    legacy = layout == "sessions" and sessions_version(table.schema.metadata) < 2
    optional = set(_windows(schema)) if legacy else set()
    missing = [f.name for f in expected
               if f.name not in table.column_names and f.name not in optional]
    if missing:
        raise DataError(source, None, missing[0],
                        f"column missing for the {layout} layout (missing: {missing})")
    for f in expected:
        if f.name not in table.column_names:
            continue
        t = table.schema.field(f.name).type
        if pa.types.is_list(t) != pa.types.is_list(f.type) or \
                _leaf(f.type) != _leaf(t) and not _numeric(_leaf(t)):  # numbers as text: no
            raise DataError(source, None, f.name,
                            f"type {t} does not fit the {layout} layout (expected {f.type})")


def _leaf(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_list(t) or pa.types.is_large_list(t) else t


def _numeric(t: pa.DataType) -> bool:
    """Types a column of numbers may be stored as and cast from (an int32 day, int64 labels)."""
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_null(t)


def _cast(table: pa.Table, target: pa.Schema, source: Path | str) -> pa.Table:
    """`table` with the known columns cast to `target` (extras kept, appended, as they are;
    target columns the table lacks are left out)."""
    known = [f.name for f in target]
    extra = [c for c in table.column_names if c not in known]
    cols, fields = [], []
    for f in target:
        if f.name not in table.column_names:
            continue
        col = table.column(f.name)
        if not col.type.equals(f.type):
            try:
                col = col.cast(f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise DataError(source, None, f.name, f"cannot read as {f.type}: {e}") from None
        cols.append(col)
        fields.append(f)
    for c in extra:
        cols.append(table.column(c))
        fields.append(table.schema.field(c))
    return pa.Table.from_arrays(cols, schema=pa.schema(fields, metadata=target.metadata))


def dedup_table(table: pa.Table, schema: FeatureSchema, *, source: Path | str = "<table>",
                first_row: int = 0) -> pa.Table:
    """Impressions layout -> sessions layout (one row per contiguous session, in order).

    Columns not in the schema are treated as per-impression and become lists; consecutive
    sessions share their stored history where it slides (see `share_histories`). Raises
    DataError (naming `source`, the session and the field) when a session's rows are not
    contiguous or a user-side column is not constant within a session; rows in messages
    are 0-based and counted from `first_row` (the table's first row in `source`).
    """
    return share_histories(_session_rows(table, schema, source, first_row), schema)


def _session_rows(table: pa.Table, schema: FeatureSchema, source: Path | str,
                  first_row: int) -> pa.Table:
    """dedup_table before the histories are shared: every row holds its own lists."""
    _check_layout(table, schema, "impressions", source)
    table = _cast(table, schema.arrow("impressions"), source)
    n = table.num_rows
    sid = _session_ids(table, source)
    starts = run_starts(sid)
    dup = _first_duplicate(sid[starts])
    if dup is not None:
        s = int(sid[starts[dup]])
        raise DataError(source, None, SESSION,
                        f"session {s} is not contiguous: its rows resume at row "
                        f"{first_row + int(starts[dup])}"
                        " after another session's (sessions must be contiguous)")
    lengths = np.diff(np.append(starts, n))
    rep = np.repeat(starts, lengths)
    sess_cols = session_columns(schema)
    for c in sess_cols[2:] + (DAY,):
        arr = _to_array(table.column(c))
        bad = (_list_mismatch if pa.types.is_list(arr.type) else _scalar_mismatch)(arr, rep)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise DataError(source, None, c,
                            f"session {int(sid[row])} is not constant in this user-side field "
                            f"(row {first_row + row} differs from the session's first row "
                            f"{first_row + int(rep[row])})")

    target = schema.arrow("sessions")
    offsets = pa.array(np.append(starts, n).astype(np.int32))
    head = table.select(list(sess_cols)).take(pa.array(starts))
    cols: list[pa.Array | pa.ChunkedArray] = [head.column(c) for c in sess_cols]
    fields = [target.field(c) for c in sess_cols]
    for c in table.column_names:
        if c in sess_cols:
            continue
        lst = pa.ListArray.from_arrays(offsets, _to_array(table.column(c)))
        cols.append(lst)
        fields.append(target.field(c) if c in target.names else pa.field(c, lst.type))
    return pa.Table.from_arrays(cols, schema=pa.schema(fields, metadata=_meta(target, 1)))


def _meta(target: pa.Schema, version: int) -> dict[bytes, bytes]:
    meta = dict(target.metadata or {})
    if version < 2:
        meta.pop(b"lrm.layout_version", None)
    return meta


def share_histories(table: pa.Table, schema: FeatureSchema, group: int | None = None
                    ) -> pa.Table:
    """Sessions whose every row holds its own lists -> the stored form: each sequence
    feature once per run (lrm.data.histories) plus its window columns. A run starts at
    every multiple of `group` rows (the row groups the table will be written in)."""
    if sessions_version(table.schema.metadata) >= 2:
        raise ValueError("share_histories: the histories are already shared")
    target = schema.arrow("sessions")
    cols = {c: table.column(c) for c in table.column_names}
    breaks = vertical_breaks(table, schema)
    for f in schema.user_seq:
        enc = histories.encode(cols[f], group, breaks)
        off, ln = window_columns(f)
        cols[f] = enc.items
        cols[off], cols[ln] = pa.array(enc.offset), pa.array(enc.length)
    names = [f.name for f in target if f.name in cols]
    names += [c for c in table.column_names if c not in names]
    fields = [target.field(c) if c in target.names else table.schema.field(c) for c in names]
    return pa.Table.from_arrays([cols[c] for c in names],
                                schema=pa.schema(fields, metadata=target.metadata))


def expand_histories(table: pa.Table, schema: FeatureSchema, *,
                     source: Path | str = "<table>", first_row: int = 0) -> pa.Table:
    """The stored sessions form -> every row holding its own lists (no window columns).

    A table of the first sessions layout (no window columns) comes back as it is. The
    table must start at a run's first row (a whole file or row group does).
    """
    if sessions_version(table.schema.metadata) < 2:
        return table
    drop = set(_windows(schema))
    cols, fields = [], []
    for name in table.column_names:
        if name in drop:
            continue
        col = table.column(name)
        if name in schema.user_seq:
            off, ln = window_columns(name)
            col = histories.decode(col, table.column(off), table.column(ln), source=source,
                                   field=name, first_row=first_row).expand()
        cols.append(col)
        fields.append(table.schema.field(name))
    return pa.Table.from_arrays(cols, schema=pa.schema(
        fields, metadata=_meta(table.schema, 1)))


def flatten_sessions(table: pa.Table, schema: FeatureSchema | None = None, *,
                     source: Path | str = "<table>") -> pa.Table:
    """Sessions layout -> impressions layout: exactly the rows `dedup_table` started from."""
    if schema is None:
        meta = table.schema.metadata or {}
        if META_KEY not in meta:
            raise DataError(source, None, None, "table carries no lrm.schema metadata")
        schema = FeatureSchema.from_json(meta[META_KEY].decode())
    _check_layout(table, schema, "sessions", source)
    table = expand_histories(table, schema, source=source)
    sess_cols = session_columns(schema)
    per_imp = [c for c in table.column_names if c not in sess_cols]
    lengths = session_lengths(table, per_imp, source)
    rep = np.repeat(np.arange(table.num_rows), lengths)
    head = table.select(list(sess_cols)).take(pa.array(rep))
    cols = [head.column(c) for c in sess_cols]
    cols += [pc.list_flatten(table.column(c)) for c in per_imp]
    out = pa.Table.from_arrays(cols, names=list(sess_cols) + per_imp)
    return _cast(out, schema.arrow("impressions"), source)


def session_lengths(table: pa.Table, per_imp: list[str] | None = None,
                    source: Path | str = "<table>") -> np.ndarray:
    """Impressions per session row of a sessions-layout table (checked across list columns)."""
    per_imp = per_imp or [LABEL]
    ref: np.ndarray | None = None
    for c in per_imp:
        arr = _to_array(table.column(c))
        if arr.null_count:
            row = int(np.flatnonzero(~arr.is_valid().to_numpy(zero_copy_only=False))[0])
            raise DataError(source, None, c, f"null list at session row {row}")
        lens = _to_array(pc.list_value_length(arr)).to_numpy().astype(np.int64)
        if ref is None:
            ref = lens
        elif not np.array_equal(lens, ref):
            row = int(np.flatnonzero(lens != ref)[0])
            raise DataError(source, None, c, f"session row {row} has {lens[row]} entries "
                            f"but {ref[row]} in {per_imp[0]}")
    assert ref is not None
    return ref


# ---------------------------------------------------------------------------------------
# Whole datasets, streamed day by day and chunk by chunk.


# The order `cluster` writes, in every day's stamp (lrm.data.dedup): a day written in another
# order (before 2026-11: vertical, then user) is deduplicated again.
CLUSTER_ORDER = "user,vertical"


def cluster(table: pa.Table, schema: FeatureSchema) -> pa.Table:
    """The session rows sorted by the schema's user key, then its vertical, stably (as they
    are without a user key): a user's sessions on a surface lie together (one run of shared
    histories), in time order.

    The verticals interleave as the traffic does. Not vertical first: a training pass reads
    a day in file order, and a model on every vertical (the FM, the baselines) that saw
    feed, then search, then video ended each day fitted to the last (the default world's
    FM predicted 0.57 of the clicks on the next day, 0.44 on search; interleaved: 1.08,
    and NE 0.962 -> 0.914). A vertical model reads its own rows by the vertical column."""
    if schema.user_key is None or table.num_rows < 2:
        return table
    keys = [k for k in (schema.user_key, schema.vertical) if k is not None]
    return table.take(pc.sort_indices(table.select(keys),
                                      sort_keys=[(k, "ascending") for k in keys]))


def vertical_breaks(table: pa.Table, schema: FeatureSchema) -> np.ndarray | None:
    """The rows where the sessions' vertical changes (runs of shared histories start there,
    so a reader of one vertical gets whole runs); None without a vertical column."""
    if schema.vertical is None or table.num_rows < 2:
        return None
    v = _numpy(_to_array(table.column(schema.vertical)))
    return np.flatnonzero(v[1:] != v[:-1]) + 1
