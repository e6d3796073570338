"""RecD dedup: impression rows -> session rows, with user-side features stored once.

In the ``impressions`` layout every impression repeats its session's user-side columns
(``day``, ``session_id``, ``schema.user_sparse``, ``schema.user_seq``); in the ``sessions``
layout those columns appear once per session and every other column becomes a list with
one entry per impression. Sessions must be contiguous in the input (the generator and
ingest write them so).

RecD clusters: within each output file the sessions are sorted by the schema's user key
(stably, so a user's sessions keep their time order), and a sequence feature is stored
once per run of sessions whose histories slide over one stream (lrm.data.histories): a
user's sessions of a day share one stored history, each with its window (offset, length).
A run never crosses a row group, so every row group reads on its own. Without a user key
(Criteo) the sessions keep their input order.

Everything is vectorized over Arrow buffers: session boundaries are the run starts of
``session_id``, user-side constancy is checked by comparing each row with its session's
first row, and list columns are built from the run offsets without copying values.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lrm import fanout, io
from lrm.config import DedupConfig
from lrm.data import histories, items, parquet, values
from lrm.data.schema import (
    DAY,
    LABEL,
    META_KEY,
    SESSION,
    FeatureSchema,
    day_files,
    part_path,
    read_schema,
    sessions_version,
    window_columns,
)
from lrm.errors import ConfigError, DataError
from lrm.progress import Reporter

READ_CHUNK_ROWS = 64 * 1024  # impressions per streamed input chunk (bounds memory)
FROM = "_from.json"  # in a day's folder: the input files and settings it was made from


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


def cluster(table: pa.Table, schema: FeatureSchema) -> pa.Table:
    """The session rows sorted by the schema's vertical, then its user key, stably (as they
    are without either): a user's sessions on a surface lie together, and so does each
    vertical's (its vertical model reads just those)."""
    keys = [k for k in (schema.vertical, schema.user_key) if k is not None]
    if not keys or table.num_rows < 2:
        return table
    return table.take(pc.sort_indices(table.select(keys),
                                      sort_keys=[(k, "ascending") for k in keys]))


def vertical_breaks(table: pa.Table, schema: FeatureSchema) -> np.ndarray | None:
    """The rows where the sessions' vertical changes (runs of shared histories start there,
    so a reader of one vertical gets whole runs); None without a vertical column."""
    if schema.vertical is None or table.num_rows < 2:
        return None
    v = _numpy(_to_array(table.column(schema.vertical)))
    return np.flatnonzero(v[1:] != v[:-1]) + 1


@dataclass
class _PartWriter:
    """Buffers session rows of one day and writes exactly `rows_per_file` per part file
    into the day's folder, each clustered by user with its histories shared."""

    folder: Path  # the day's folder (day=D)
    day: int
    rows_per_file: int
    schema: FeatureSchema
    parts: int = 0
    bytes_out: int = 0
    history_values: int = 0  # sequence values of all sessions' windows
    history_stored: int = 0  # ... of the runs' items actually stored
    item_table: bool = True  # see lrm.data.items
    item_columns: set[str] = field(default_factory=set)  # stored once per item in a file
    _buf: list[pa.Table] = field(default_factory=list)
    _buffered: int = 0

    def add(self, sessions: pa.Table) -> None:
        if sessions.num_rows == 0:
            return
        self._buf.append(sessions)
        self._buffered += sessions.num_rows
        while self._buffered >= self.rows_per_file:
            self._flush(self.rows_per_file)

    def close(self) -> None:
        if self._buffered:
            self._flush(self._buffered)

    def _flush(self, rows: int) -> None:
        table = pa.concat_tables(self._buf)
        out, rest = table.slice(0, rows), table.slice(rows)
        opts = parquet.write_options(self.schema.arrow("sessions"), "sessions")
        out = share_histories(cluster(out, self.schema), self.schema, opts["row_group_size"])
        for f in self.schema.user_seq:
            self.history_values += int(pc.sum(out.column(window_columns(f)[1])).as_py() or 0)
            self.history_stored += int(pc.sum(pc.list_value_length(out.column(f))).as_py() or 0)
        kv: dict[bytes, bytes] = {}
        if self.item_table:
            before = out.column_names
            out, kv = items.split(out, self.schema.item_key,
                                  self.schema.item_sparse + self.schema.dense,
                                  lambda s: parquet.write_options(s, "sessions"))
            self.item_columns |= set(before) - set(out.column_names)
        name = part_path(Path(), self.day, self.parts).name
        self.bytes_out += io.write_parquet(out, self.folder / name,
                                           file_metadata=kv,
                                           **parquet.write_options(out.schema, "sessions"))
        self.parts += 1
        self._buf = [rest] if rest.num_rows else []
        self._buffered = rest.num_rows


def _file_chunks(path: Path, schema: FeatureSchema, day: int,
                 rows: int) -> Iterator[tuple[pa.Table, Path, int]]:
    """(chunk, path, its first row in the file) in chunks of `rows`, checked: layout,
    schema, columns, day."""
    target = schema.arrow("impressions")
    pf = parquet.open_file(path)
    file_meta = pf.schema_arrow.metadata or {}
    layout = file_meta.get(b"lrm.layout", b"").decode()
    if layout != "impressions":
        raise DataError(path, None, None,
                        f"expected the impressions layout, found {layout or 'no lrm.layout'}")
    if META_KEY in file_meta and FeatureSchema.from_json(file_meta[META_KEY].decode()) != schema:
        raise DataError(path, None, None, "schema differs from the dataset's first file")
    first = 0
    for rb in parquet.iter_batches(path, rows, file=pf, check=values.checker(schema, path)):
        t = pa.Table.from_batches([rb])
        _check_layout(t, schema, "impressions", path)
        _check_day(t, day, path)
        yield _cast(t, target, path), path, first
        first += t.num_rows


def check_source(src: Path) -> tuple[FeatureSchema, dict[int, list[Path]]]:
    """The schema and day files of an impressions-layout dataset, or a DataError."""
    files = day_files(src)
    schema, layout = read_schema(next(iter(files.values()))[0])
    if layout != "impressions":
        raise DataError(src, None, None,
                        f"expected the impressions layout (raw data), found {layout}")
    return schema, files


Located = tuple[pa.Table, Path, int]  # a table, its file, its first row in the file


def _whole_sessions(chunks: Iterator[Located]) -> Iterator[Located]:
    """Re-cut a stream of impression chunks at session boundaries.

    Yields tables of whole sessions, located in the file they (start to) come from. A
    session that straddles chunks (or files) is carried and yielded alone once it ends, so
    every other table is a zero-copy slice of its chunk.
    """
    carry: list[pa.Table] = []  # pieces of one unfinished session
    carry_sid, carry_at = 0, (Path(), 0)
    for chunk, src, row0 in chunks:
        n = chunk.num_rows
        if n == 0:
            continue
        sid = _session_ids(chunk, src)
        starts = run_starts(sid)
        if carry:
            if sid[0] == carry_sid:  # the carried session goes on
                head = int(starts[1]) if len(starts) > 1 else n
                carry.append(chunk.slice(0, head))
                if head == n:
                    continue
                chunk, sid, starts = chunk.slice(head), sid[head:], starts[1:] - head
                row0 += head
            yield pa.concat_tables(carry), *carry_at
            carry = []
        last = int(starts[-1])
        if last:
            yield chunk.slice(0, last), src, row0
        carry, carry_sid, carry_at = [chunk.slice(last)], sid[last], (src, row0 + last)
    if carry:
        yield pa.concat_tables(carry), *carry_at


@dataclass
class _Totals:
    """What dedup wrote, summed over days (the stage's metrics)."""

    rows: int = 0
    sessions: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    parts: int = 0
    hist_values: int = 0
    hist_stored: int = 0
    days: int = 0
    item_columns: set[str] = field(default_factory=set)

    def add(self, counts: dict[str, Any]) -> None:
        """A day's counts (`dedup_day`'s)."""
        self.rows += counts["rows"]
        self.sessions += counts["sessions"]
        self.bytes_in += counts["bytes_in"]
        self.bytes_out += counts["bytes_out"]
        self.parts += counts["parts"]
        self.hist_values += counts["history_values"]
        self.hist_stored += counts["history_stored"]
        self.item_columns |= set(counts["item_columns"])
        self.days += 1

    def metrics(self, schema: FeatureSchema) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "sessions": self.sessions,
            "dedup_ratio": self.rows / self.sessions if self.sessions else 0.0,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "storage_ratio": self.bytes_in / self.bytes_out if self.bytes_out else 0.0,
            "days": self.days,
            "files": self.parts,
            "history_values": self.hist_values,  # sequence values the sessions' windows hold
            "history_values_stored": self.hist_stored,  # ... stored once per run
            "history_ratio": self.hist_values / self.hist_stored if self.hist_stored else 0.0,
            # stored once per item in some file (lrm.data.items), in the schema's order
            "item_columns": [c for c in schema.item_sparse + schema.dense
                             if c in self.item_columns],
        }


def dedup_day(src: Path, folder: Path, cfg: DedupConfig, day: int, *,
              chunk_rows: int = READ_CHUNK_ROWS, rep: Reporter | None = None) -> dict[str, Any]:
    """Dedup day `day` of `src` into `folder/part-NNNNN.parquet` (sessions layout; a unit of
    lrm.fanout: days are independent); its counts (rows, sessions, bytes, parts, histories,
    item columns)."""
    schema, files = check_source(src)
    paths = files[day]
    writer = _PartWriter(folder, day, cfg.rows_per_file, schema, item_table=cfg.item_table)
    seen = _SessionIds()  # the day's sessions so far
    rows = sessions = 0
    chunks = (c for p in paths for c in _file_chunks(p, schema, day, chunk_rows))
    for table, source, row0 in _whole_sessions(chunks):
        s = _session_rows(table, schema, source, row0)
        seen.add(s.column(SESSION).to_numpy(), source)
        writer.add(s)
        rows += table.num_rows
        sessions += s.num_rows
        if rep is not None:
            rep.update(table.num_rows)
    writer.close()
    return {"rows": rows, "sessions": sessions,
            "bytes_in": sum(p.stat().st_size for p in paths), "bytes_out": writer.bytes_out,
            "parts": writer.parts, "history_values": writer.history_values,
            "history_stored": writer.history_stored, "item_columns": sorted(writer.item_columns)}


def _dedup_days(src: Path, folders: dict[int, Path], cfg: DedupConfig, chunk_rows: int,
                rep: Reporter) -> _Totals:
    """Every day of `folders` (day -> the folder it is written to), each a unit of
    lrm.fanout (a task of its own in the Prefect flows), summed."""
    days = list(folders)
    per_day = fanout.map_units(
        "dedup day", partial(_dedup_unit, src=src, folders=folders, cfg=cfg,
                             chunk_rows=chunk_rows, rep=rep if fanout.in_process() else None),
        days, [str(d) for d in days])
    totals = _Totals()
    for counts in per_day:
        totals.add(counts)
    return totals


def _dedup_unit(day: int, *, src: Path, folders: dict[int, Path], cfg: DedupConfig,
                chunk_rows: int, rep: Reporter | None) -> dict[str, Any]:
    return dedup_day(src, folders[day], cfg, day, chunk_rows=chunk_rows, rep=rep)


def dedup_dataset(src: Path, dst: Path, cfg: DedupConfig, *,
                  chunk_rows: int = READ_CHUNK_ROWS) -> dict[str, Any]:
    """Dedup every day of `src` into `dst/day=D/part-NNNNN.parquet` (sessions layout).

    Streams day by day and chunk by chunk (memory: a chunk plus one output file's
    sessions); sessions may straddle input chunks and files, and a session is never split
    across output files. Each day is a unit of lrm.fanout (a task of the Prefect flows).
    Returns the metrics (rows, sessions, ratios, bytes).
    """
    schema, files = check_source(src)
    total = sum(parquet.read_metadata(f).num_rows for fs in files.values() for f in fs)
    with Reporter("dedup", total=total, unit="rows") as rep:
        totals = _dedup_days(src, {d: Path(dst) / f"day={d}" for d in files}, cfg, chunk_rows,
                             rep)
    return totals.metrics(schema)


def update(src: Path, out: Path, cfg: DedupConfig, days: Sequence[int] | None = None, *,
           chunk_rows: int = READ_CHUNK_ROWS, force: bool = False) -> dict[str, Any]:
    """Bring `out` up to date with `src`, day by day: `days` (default: every day of `src`).

    A day whose output was made from the same input files (their hashes, recorded in the
    day's `_from.json`) with the same settings is kept; every other is deduplicated again,
    each into a temporary folder of its own, and they replace their days only once every
    one is written (a failure, bad input included, leaves `out` as it was). With every day
    asked for, the day folders of days `src` no longer has are removed, so `out` is what
    dedup of `src` is. A day folder holding a file lrm did not write, or one changed since
    it did, is not up to date: its rewrite is refused (OutputError) unless `force`.
    Returns the metrics of the days written, and which were skipped.
    """
    schema, files = check_source(src)
    wanted = sorted(files) if days is None else sorted(set(days))
    missing = [d for d in wanted if d not in files]
    if missing:
        raise ConfigError(f"dedup: no raw data for days {missing} in {src} "
                          f"(days: {sorted(files)})")
    stamps = {d: {"source": io.source_fingerprint(files[d]), "settings": asdict(cfg)}
              for d in wanted}
    todo = [d for d in wanted if _stamp(out / f"day={d}") != stamps[d]
            or not io.replaceable(out / f"day={d}")]  # a user's file in it: never skipped
    total = sum(parquet.read_metadata(f).num_rows for d in todo for f in files[d])
    with Reporter("dedup", total=total, unit="rows") as rep, \
            contextlib.ExitStack() as commit:  # every day's rename, once all are written
        tmps = {d: commit.enter_context(io.atomic_dir(out / f"day={d}", force=force))
                for d in todo}
        totals = _dedup_days(src, tmps, cfg, chunk_rows, rep)
        for d, tmp in tmps.items():
            io.write_json(stamps[d], tmp / FROM)
    if days is None:  # out holds exactly src's days
        for p in out.glob("day=*"):
            if p.is_dir() and p.name[4:].isdigit() and int(p.name[4:]) not in files \
                    and io.owned_by_lrm(p):
                shutil.rmtree(p)
    return {**totals.metrics(schema), "written": todo,
            "skipped": [d for d in wanted if d not in todo]}


def _stamp(day_dir: Path) -> Any:
    try:
        return json.loads((day_dir / FROM).read_text())
    except (OSError, ValueError):
        return None


def _check_day(chunk: pa.Table, day: int, path: Path) -> None:
    lo, hi = pc.min_max(chunk.column(DAY)).values()
    if chunk.num_rows and (lo.as_py() != day or hi.as_py() != day):
        raise DataError(path, None, DAY,
                        f"rows of day {lo.as_py()}..{hi.as_py()} in the day={day} partition")


class _SessionIds:
    """The session ids of a day seen so far, as disjoint runs of consecutive ids: a few for
    a day whose ids count up (the generator's, ingest's), however many sessions it has."""

    def __init__(self) -> None:
        self.lo = self.hi = np.zeros(0, np.int64)  # runs [lo, hi], ascending

    def add(self, ids: np.ndarray, source: Path) -> None:
        """Add a table's session ids (distinct); a DataError naming `source` when one of
        them came earlier in the day (a session must be contiguous within a day)."""
        if not len(ids):
            return
        ids = np.sort(ids.astype(np.int64, copy=False))
        cut = np.flatnonzero(np.diff(ids) != 1) + 1
        lo, hi = ids[np.r_[0, cut]], ids[np.r_[cut - 1, len(ids) - 1]]
        at = np.searchsorted(self.hi, lo)  # the first known run that ends at or after lo
        hit = at < len(self.lo)
        hit[hit] = self.lo[at[hit]] <= hi[hit]
        if hit.any():
            k = int(np.flatnonzero(hit)[0])
            dup = max(int(lo[k]), int(self.lo[at[k]]))
            raise DataError(source, None, SESSION,
                            f"session {dup} is not contiguous: it reappears after other "
                            "sessions (sessions must be contiguous within a day)")
        lo, hi = np.r_[self.lo, lo], np.r_[self.hi, hi]
        order = np.argsort(lo, kind="stable")
        lo, hi = lo[order], hi[order]
        new = np.r_[True, lo[1:] != hi[:-1] + 1]  # a run that does not go on from the last
        self.lo, self.hi = lo[new], hi[np.r_[new[1:], True]]
