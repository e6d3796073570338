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

import polars as pl
import pyarrow as pa

from lrm.data.logs.read import BUCKET, DAY, FILE, ITEM, LABEL, POS, ROW, TIME, USER

CLICK_COLUMNS = (USER, TIME, ITEM, FILE, ROW, POS)


@dataclass(frozen=True)
class Spilled:
    """One chunk on disk: its batches per (day, bucket), and its clicks' per bucket."""

    path: Path
    cells: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    clicks: dict[int, list[int]] = field(default_factory=dict)

    @property
    def clicks_path(self) -> Path:
        return self.path.with_suffix(".clicks.arrow")


def _write(frame: pl.DataFrame, path: Path, keys: list[str]) -> dict[tuple[int, ...], list[int]]:
    index: dict[tuple[int, ...], list[int]] = {}
    table = frame.to_arrow()
    with pa.ipc.new_file(path, table.schema) as w:
        n = 0
        for key, part in frame.partition_by(keys, as_dict=True, maintain_order=True).items():
            for batch in part.to_arrow().to_batches():
                w.write_batch(batch)
                index.setdefault(tuple(int(k) for k in key), []).append(n)
                n += 1
    return index


def write(frame: pl.DataFrame, path: Path, clicks: bool, cells: bool = True) -> Spilled:
    """Spill a parsed chunk to `path` (and its clicks beside it, when `clicks`; only them
    without `cells`)."""
    by_cell = _write(frame, path, [DAY, BUCKET]) if cells else {}
    s = Spilled(path, {(d, b): v for (d, b), v in by_cell.items()})
    if clicks:
        c = frame.filter(pl.col(LABEL) == 1).select(*CLICK_COLUMNS, BUCKET)
        by_bucket = _write(c, s.clicks_path, [BUCKET]) if c.height else {}
        s.clicks.update({b: v for (b,), v in by_bucket.items()})
    return s


def _read(path: Path, batches: list[int]) -> pa.Table:
    with pa.memory_map(str(path)) as src:
        r = pa.ipc.open_file(src)
        return pa.Table.from_batches([r.get_batch(i) for i in batches], schema=r.schema)


def read_cell(spilled: Sequence[Spilled], day: int, bucket: int) -> pl.DataFrame | None:
    """Every row of the cell (day, bucket), in input order; None when it has none."""
    parts = [_read(s.path, s.cells[(day, bucket)]) for s in spilled
             if (day, bucket) in s.cells]
    return pl.from_arrow(pa.concat_tables(parts)) if parts else None  # type: ignore[return-value]


def read_clicks(spilled: Sequence[Spilled], bucket: int | None = None) -> pl.DataFrame:
    """Every click of the bucket's users (None: of every bucket), on any day."""
    parts = [_read(s.clicks_path, [i for b, ids in s.clicks.items() for i in ids
                                   if bucket is None or b == bucket])
             for s in spilled if s.clicks and (bucket is None or bucket in s.clicks)]
    if not parts:
        return pl.DataFrame(schema={USER: pl.UInt64, TIME: pl.Int64, ITEM: pl.UInt64,
                                    FILE: pl.Int32, ROW: pl.UInt32, POS: pl.Int32})
    return pl.from_arrow(pa.concat_tables(parts)).drop(BUCKET)  # type: ignore[union-attr]
