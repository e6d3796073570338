"""The shuffle between reading a log and writing its days: each chunk, once parsed, is
written to a local Arrow IPC file with one record batch per (day, bucket) cell, and its
clicks (label 1) to a second one with a batch per bucket. A day's writer then reads back
just its cells (memory-mapped, zero-copy), so memory holds a chunk while reading and a cell
while writing, never a file or a day. The files live in a temporary folder removed at the
end; they are never an output.
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


@dataclass(frozen=True)
class Spilled:
    """One chunk on disk: its batches per (day, bucket), and its clicks' per bucket."""

    path: Path
    cells: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    clicks: dict[int, list[int]] = field(default_factory=dict)
    rows: dict[tuple[int, int], int] = field(default_factory=dict)  # per cell

    @property
    def clicks_path(self) -> Path:
        return self.path.with_suffix(".clicks.arrow")


def _write(frame: pl.DataFrame, path: Path, keys: list[str]
           ) -> dict[tuple[int, ...], tuple[int, int]]:
    """`frame` as one batch per value of `keys` (small integers; each batch in input
    order): key -> (batch, rows). One stable sort of one integer per row and zero-copy
    slices (a frame per key costs a copy and a conversion each)."""
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
    table = frame[order].to_arrow().combine_chunks()
    batch = pa.record_batch([c.chunk(0) for c in table.columns], schema=table.schema)
    index: dict[tuple[int, ...], tuple[int, int]] = {}
    with pa.ipc.new_file(path, table.schema) as w:
        for n, (a, b) in enumerate(zip(starts, ends, strict=True)):
            w.write_batch(batch.slice(int(a), int(b - a)))
            index[tuple(int(x) for x in k[order[a]])] = (n, int(b - a))
    return index


def write(frame: pl.DataFrame, path: Path, clicks: bool, cells: bool = True) -> Spilled:
    """Spill a parsed chunk to `path` (and its clicks beside it, when `clicks`; only them
    without `cells`)."""
    by_cell = _write(frame, path, [DAY, BUCKET]) if cells else {}
    s = Spilled(path, {(d, b): [n] for (d, b), (n, _) in by_cell.items()},
                rows={(d, b): r for (d, b), (_, r) in by_cell.items()})
    if clicks:
        c = frame.filter(pl.col(LABEL) == 1).select(*CLICK_COLUMNS, BUCKET)
        by_bucket = _write(c, s.clicks_path, [BUCKET]) if c.height else {}
        s.clicks.update({b: [n] for (b,), (n, _) in by_bucket.items()})
    return s


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
            per_file.append({b: [next(got) for _ in s.cells[(day, b)]] for b in mine})
    batches = [x for b in want for f in per_file for x in f.get(b, [])]  # a bucket's: in
    if not batches:  # input order, file by file
        return None
    # (contiguous: a polars query on a frame of many chunks copies them all each time)
    return pl.from_arrow(pa.Table.from_batches(batches),  # type: ignore[return-value]
                         rechunk=True)


def read_clicks(spilled: Sequence[Spilled], bucket: int | Sequence[int] | None = None,
                through_day: int | None = None) -> pl.DataFrame:
    """Every click of the buckets' users (None: of every bucket), on any day (or on a day up
    to `through_day`)."""
    want = None if bucket is None else {bucket} if isinstance(bucket, int) else set(bucket)
    batches = [x for s in spilled if s.clicks and (want is None or want & s.clicks.keys())
               for x in _read(s.clicks_path, [i for b, ids in s.clicks.items() for i in ids
                                              if want is None or b in want])]
    if not batches:
        return pl.DataFrame(schema={USER: pl.UInt64, TIME: pl.Int64, ITEM: pl.UInt64,
                                    FILE: pl.Int32, ROW: pl.UInt32, POS: pl.Int32,
                                    DAY: pl.Int32})
    c = pl.from_arrow(pa.Table.from_batches(batches),  # type: ignore[union-attr]
                      rechunk=True).drop(BUCKET)
    return c if through_day is None else c.filter(pl.col(DAY) <= through_day)
