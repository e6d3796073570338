"""The shuffle between reading a log and writing its days: each chunk, once parsed, is
written to a local Arrow IPC file with one record batch per (day, bucket) cell, and its
clicks (label 1) to a second one, a batch per (day, bucket) too. A day's writer then reads
back just its cells and the clicks of its buckets up to its day (memory-mapped, zero-copy),
so memory holds a chunk while reading and a cell while writing, never a file or a day. The
files live in a temporary folder removed at the end; they are never an output.

A column that holds one value in a batch is not written: a cell's day and bucket (its key),
a chunk's file index, and the place in a page view where there is none (`CONSTANT`); the
reader puts them back (`_whole`). A fifth fewer bytes to write and read back, and to
gather when a chunk is cut into its cells.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from lrm.data.logs.frame import BUCKET, DAY, FILE, ITEM, LABEL, POS, ROW, TIME, USER

# a click's day too: with days from files (or a prior ingest's), a later day may hold an
# earlier time, and a day's histories must not depend on later days
CLICK_COLUMNS = (USER, TIME, ITEM, FILE, ROW, POS, DAY)
# columns left out of a chunk's batches where they hold one value in it (its file; the place
# in a page view, where there is none); a batch also leaves out its keys
CONSTANT = (FILE, POS)


@dataclass(frozen=True)
class Spilled:
    """One chunk on disk: its batches per (day, bucket), and its clicks' too."""

    path: Path
    cells: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    clicks: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    rows: dict[tuple[int, int], int] = field(default_factory=dict)  # per cell
    # the columns a batch leaves out, by file (cells, clicks): their values in every batch
    # of the file, and the names and types of all the columns, in their order
    fixed: dict[str, dict[str, int]] = field(default_factory=dict)
    schema: dict[str, pl.Schema] = field(default_factory=dict)

    @property
    def clicks_path(self) -> Path:
        return self.path.with_suffix(".clicks.arrow")


def _write(frame: pl.DataFrame, path: Path, keys: list[str]
           ) -> tuple[dict[tuple[int, ...], tuple[int, int]], dict[str, int]]:
    """`frame` as one batch per value of `keys` (small integers; each batch in input
    order, without the columns of `keys`): key -> (batch, rows); and the columns of
    `CONSTANT` that hold one value in `frame`, left out too, with that value. One stable
    sort of one integer per row and zero-copy slices (a frame per key costs a copy and a
    conversion each)."""
    k = frame.select(keys).to_numpy().astype(np.int64)
    lo = k.min(axis=0)
    span = k.max(axis=0) - lo + 1
    code = np.zeros(len(k), np.int64)
    for j in range(len(keys)):
        code = code * span[j] + (k[:, j] - lo[j])
    # (a radix sort where the codes fit 16 bits: a chunk's days x buckets mostly do)
    order = np.argsort(code.astype(np.int16) if code.max() < 2**15 else code, kind="stable")
    code = code[order]
    starts = np.flatnonzero(np.r_[True, code[1:] != code[:-1]])
    ends = np.r_[starts[1:], len(code)]
    fixed = {c: v for c in CONSTANT if c in frame.columns and c not in keys
             and frame[c].null_count() == 0 and (v := frame[c].min()) == frame[c].max()}
    table = frame.drop([*keys, *fixed])[order].to_arrow().combine_chunks()
    batch = pa.record_batch([c.chunk(0) for c in table.columns], schema=table.schema)
    index: dict[tuple[int, ...], tuple[int, int]] = {}
    with pa.ipc.new_file(path, table.schema) as w:
        for n, (a, b) in enumerate(zip(starts, ends, strict=True)):
            w.write_batch(batch.slice(int(a), int(b - a)))
            index[tuple(int(x) for x in k[order[a]])] = (n, int(b - a))
    return index, {c: int(v) for c, v in fixed.items()}  # type: ignore[arg-type]


def write(frame: pl.DataFrame, path: Path, clicks: bool, cells: bool = True) -> Spilled:
    """Spill a parsed chunk to `path` (and its clicks beside it, when `clicks`; only them
    without `cells`)."""
    by_cell, fixed = _write(frame, path, [DAY, BUCKET]) if cells else ({}, {})
    s = Spilled(path, {(d, b): [n] for (d, b), (n, _) in by_cell.items()},
                rows={(d, b): r for (d, b), (_, r) in by_cell.items()},
                fixed={"cells": fixed}, schema={"cells": frame.schema})
    if clicks:
        c = frame.filter(pl.col(LABEL) == 1).select(*CLICK_COLUMNS, BUCKET)
        # (by day too: a day's histories read the clicks of the days up to it, not all)
        by_cell, s.fixed["clicks"] = _write(c, s.clicks_path, [DAY, BUCKET]) if c.height \
            else ({}, {})
        s.schema["clicks"] = c.schema
        s.clicks.update({(d, b): [n] for (d, b), (n, _) in by_cell.items()})
    return s


def _whole(parts: list[tuple[Spilled, str, dict[str, int], list[pa.RecordBatch]]]
           ) -> pl.DataFrame:
    """Batches of spilled files (`what`: cells or clicks), each with the values of its keys,
    as one contiguous frame with every column of the files, in their order (the columns a
    batch left out put back: `_write`)."""
    schema = parts[0][0].schema[parts[0][1]]
    batches = [b for *_, bs in parts for b in bs]
    names = [b.schema.names for b in batches]
    kept = set(names[0]).intersection(*names[1:])
    same = [b.select([c for c in n if c in kept]) if len(n) > len(kept) else b
            for b, n in zip(batches, names, strict=True)]  # (a column some left out)
    # (contiguous: a polars query on a frame of many chunks copies them all each time)
    df: pl.DataFrame = pl.from_arrow(pa.Table.from_batches(same),  # type: ignore[assignment]
                                     rechunk=True)
    if len(kept) == len(schema):
        return df
    rows = [b.num_rows for b in batches]
    known = [{**s.fixed[w], **keys} for s, w, keys, bs in parts for _ in bs]
    some = set().union(*names) - kept  # in some batches only
    cols = []
    for c in schema:
        if c in kept:
            continue
        dtype = pl.Series(dtype=schema[c]).to_numpy().dtype  # (built as it is: no cast)
        if c in some:
            cols.append(pl.Series(c, np.concatenate([
                b.column(c).to_numpy() if c in n else np.full(b.num_rows, v[c], dtype)
                for b, n, v in zip(batches, names, known, strict=True)]).astype(dtype)))
            continue
        values = np.asarray([v[c] for v in known], dtype)
        cols.append(pl.Series(c, np.repeat(values, rows)))
    return df.with_columns(cols).select(list(schema))


def _read(path: Path, batches: Sequence[int]) -> list[pa.RecordBatch]:
    with pa.memory_map(str(path)) as src:
        r = pa.ipc.open_file(src)
        return [r.get_batch(i) for i in batches]


def cell_rows(spilled: Sequence[Spilled], day: int) -> dict[int, int]:
    """bucket -> the rows of its cell on `day` (buckets without any left out)."""
    out: dict[int, int] = {}
    for s in spilled:
        for (d, b), n in s.rows.items():
            if d == day:
                out[b] = out.get(b, 0) + n
    return out


def read_cell(spilled: Sequence[Spilled], day: int, buckets: int | Sequence[int]
              ) -> pl.DataFrame | None:
    """Every row of the cells (day, bucket) of `buckets` (each bucket's in input order, the
    buckets in their order); None when they have none."""
    want = [buckets] if isinstance(buckets, int) else list(buckets)
    per_file = []  # each file opened once: its batches of the buckets, by bucket
    for s in spilled:
        mine = [b for b in want if (day, b) in s.cells]
        if mine:
            got = iter(_read(s.path, [i for b in mine for i in s.cells[(day, b)]]))
            per_file.append((s, {b: [next(got) for _ in s.cells[(day, b)]] for b in mine}))
    # a bucket's batches: in input order, file by file
    parts = [(s, "cells", {DAY: day, BUCKET: b}, f[b]) for b in want for s, f in per_file
             if b in f]
    if not parts:
        return None
    return _whole(parts)


def read_clicks(spilled: Sequence[Spilled], bucket: int | Sequence[int] | None = None,
                through_day: int | None = None) -> pl.DataFrame:
    """Every click of the buckets' users (None: of every bucket), on any day (or on a day up
    to `through_day`)."""
    want = None if bucket is None else {bucket} if isinstance(bucket, int) else set(bucket)
    parts = []
    for s in spilled:
        mine = [(d, b, i) for (d, b), ids in s.clicks.items() for i in ids
                if (want is None or b in want) and (through_day is None or d <= through_day)]
        if mine:
            got = _read(s.clicks_path, [i for *_, i in mine])
            parts += [(s, "clicks", {DAY: d, BUCKET: b}, [x])
                      for (d, b, _), x in zip(mine, got, strict=True)]
    if not parts:
        return pl.DataFrame(schema={USER: pl.UInt64, TIME: pl.Int64, ITEM: pl.UInt64,
                                    FILE: pl.Int32, ROW: pl.UInt32, POS: pl.Int32,
                                    DAY: pl.Int32})
    return _whole(parts).drop(BUCKET)
