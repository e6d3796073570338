"""RecD dedup of a dataset: impression files -> the sessions layout (lrm.data.sessions), day
by day (each day a unit of lrm.fanout) into part files of whole sessions, clustered by
user and vertical with their histories shared; a day's folder is replaced only once every
day asked for is written (`update`).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lrm import fanout, io
from lrm.config import DedupConfig
from lrm.data import items, parquet, values
from lrm.data.schema import (
    DAY,
    META_KEY,
    SESSION,
    FeatureSchema,
    day_files,
    part_path,
    read_schema,
    window_columns,
)
from lrm.data.sessions import (  # noqa: F401  (the layout's API, as lrm.data.dedup offered it)
    session_columns,
    run_starts,
    _session_ids,
    _check_layout,
    _cast,
    dedup_table,
    _session_rows,
    share_histories,
    expand_histories,
    flatten_sessions,
    session_lengths,
    cluster,
    CLUSTER_ORDER,
    vertical_breaks,
)
from lrm.errors import ConfigError, DataError
from lrm.progress import Reporter

READ_CHUNK_ROWS = 64 * 1024  # impressions per streamed input chunk (bounds memory)
FROM = "_from.json"  # in a day's folder: the input files and settings it was made from


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
class DedupCounts:
    """What dedup wrote: a day's (`dedup_day`), or summed over days (the stage's metrics)."""

    rows: int = 0
    sessions: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    parts: int = 0
    hist_values: int = 0
    hist_stored: int = 0
    days: int = 0
    item_columns: set[str] = field(default_factory=set)

    def add(self, other: DedupCounts) -> None:
        """Another day's counts (`dedup_day`'s) into these."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            setattr(self, f.name, mine | theirs if f.name == "item_columns" else mine + theirs)

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
              chunk_rows: int = READ_CHUNK_ROWS, rep: Reporter | None = None) -> DedupCounts:
    """Dedup day `day` of `src` into `folder/part-NNNNN.parquet` (sessions layout; a unit of
    lrm.fanout: days are independent); what it wrote."""
    schema, files = check_source(src)
    paths = files[day]
    writer = _PartWriter(io.unit_folder(folder), day, cfg.rows_per_file, schema,
                         item_table=cfg.item_table)  # a rerun unit starts afresh
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
    return DedupCounts(rows=rows, sessions=sessions,
                       bytes_in=sum(p.stat().st_size for p in paths), bytes_out=writer.bytes_out,
                       parts=writer.parts, hist_values=writer.history_values,
                       hist_stored=writer.history_stored, days=1,
                       item_columns=set(writer.item_columns))


def _dedup_days(src: Path, folders: dict[int, Path], cfg: DedupConfig, chunk_rows: int,
                rep: Reporter) -> DedupCounts:
    """Every day of `folders` (day -> the folder it is written to), each a unit of
    lrm.fanout (a task of its own in the Prefect flows), summed."""
    days = list(folders)
    per_day = fanout.map_units(
        "dedup day", partial(_dedup_unit, src=src, folders=folders, cfg=cfg,
                             chunk_rows=chunk_rows, rep=rep if fanout.in_process() else None),
        days, [str(d) for d in days])
    totals = DedupCounts()
    for counts in per_day:
        totals.add(counts)
    return totals


def _dedup_unit(day: int, *, src: Path, folders: dict[int, Path], cfg: DedupConfig,
                chunk_rows: int, rep: Reporter | None) -> DedupCounts:
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
    day's `_from.json`) with the same settings and session order is kept; every other is
    deduplicated again, each into a temporary folder of its own, and they replace their
    days only once every one is written (a failure, bad input included, leaves `out` as it
    was). With every day asked for, the day folders of days `src` no longer has are
    removed, so `out` is what dedup of `src` is. A day folder holding a file lrm did not
    write, or one changed since it did, is not up to date: its rewrite is refused
    (OutputError) unless `force`.
    Returns the metrics of the days written, and which were skipped.
    """
    schema, files = check_source(src)
    wanted = sorted(files) if days is None else sorted(set(days))
    missing = [d for d in wanted if d not in files]
    if missing:
        raise ConfigError(f"dedup: no raw data for days {missing} in {src} "
                          f"(days: {sorted(files)})")
    stamps = {d: {"source": io.source_fingerprint(files[d]), "settings": asdict(cfg),
                  "order": CLUSTER_ORDER} for d in wanted}
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
