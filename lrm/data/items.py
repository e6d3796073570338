"""Item attributes stored once per item in a sessions file: its item table.

An ad's attributes (its advertiser, category and format; its age on the day) repeat on
every impression of the ad. When a sessions file is written (lrm.data.dedup), each
per-impression column of the schema's item side (`item_sparse`, `dense`) whose value is a
function of the item key (`FeatureSchema.item_key`) throughout the file is stored once per
item: a table of the file's items (the key, then those columns; one row per item, sorted
by key) written as Parquet bytes into the file's key-value metadata (the footer's, not the
Arrow schema's: that would store it twice), where that makes the file smaller. The
per-impression lists keep the key. Every read through lrm.data.parquet puts the columns
back as they were, so a reader sees the same table as before; only the bytes change.
Measured on the default synthetic day (max history 128): the sessions file 3.18 -> 2.50 MB.

Why the file's metadata and not a file beside it: a sessions file stays one file that
every copy, move and split (streaming, augment) carries whole. The check is exact (bit
for bit, per file): a column that varies for one item in the file stays per impression.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lrm.errors import DataError

TABLE_KEY = b"lrm.items"  # Parquet bytes: the item key, then the moved columns
COLUMNS_KEY = b"lrm.items.columns"  # JSON: the file's columns in their order before the move

T = TypeVar("T", pa.Table, pa.RecordBatch)
LUT_MIN, LUT_PER_KEY = 1 << 20, 16  # a lookup array when the largest key is below either


def _flat(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return pc.list_flatten(arr)


def split(table: pa.Table, key: str | None, candidates: Sequence[str],
          write_options: Callable[[pa.Schema], dict[str, Any]]
          ) -> tuple[pa.Table, dict[bytes, bytes]]:
    """(`table` (sessions layout) without each of `candidates` (per-impression list
    columns) that is a function of `key` throughout it, the file metadata holding them
    once per item): see the module docstring. `table` and {} when none is (or there is
    no key). `write_options`: the file's writer rules for a schema
    (lrm.data.parquet.write_options), used for the table and to weigh what it saves."""
    if key is None or key not in table.column_names or table.num_rows == 0:
        return table, {}
    keys = _flat(table.column(key))
    if keys.null_count:
        return table, {}
    k = keys.to_numpy(zero_copy_only=False)
    order = np.argsort(k, kind="stable")
    ks = k[order]
    starts = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]])
    counts = np.diff(np.r_[starts, ks.size])
    moved: dict[str, pa.Array] = {}
    for name in candidates:
        if name == key or name not in table.column_names:
            continue
        vals = _flat(table.column(name))
        if vals.null_count or len(vals) != ks.size:
            continue
        v = vals.to_numpy(zero_copy_only=False)[order]
        bits = v.view(f"u{v.dtype.itemsize}")  # exact: NaN and -0.0 too
        if np.array_equal(bits, np.repeat(bits[starts], counts)):
            moved[name] = pa.array(v[starts], type=vals.type)
    if not moved:
        return table, {}
    items = pa.table({key: pa.array(ks[starts], type=keys.type), **moved})
    meta = {TABLE_KEY: _parquet_bytes(items, write_options),
            COLUMNS_KEY: json.dumps(table.column_names).encode()}
    # only where it pays: in a small file the table and its schema can outweigh the
    # columns' own bytes (their pages, dictionaries included), so the file would grow
    md = pq.ParquetFile(pa.BufferReader(
        _parquet_bytes(table.select(list(moved)), write_options))).metadata
    pages = sum(md.row_group(g).column(c).total_compressed_size
                for g in range(md.num_row_groups) for c in range(md.num_columns))
    if sum(map(len, meta.values())) >= pages:
        return table, {}
    return table.drop_columns(list(moved)), meta


def _parquet_bytes(table: pa.Table,
                   write_options: Callable[[pa.Schema], dict[str, Any]]) -> bytes:
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf, **write_options(table.schema))
    return buf.getvalue().to_pybytes()


def file_metadata(pf: pq.ParquetFile) -> dict[bytes, bytes]:
    """The item table's entries of a file's key-value metadata ({} when it has none)."""
    kv = pf.metadata.metadata or {}
    return {k: kv[k] for k in (TABLE_KEY, COLUMNS_KEY) if k in kv}


class ItemTable:
    """A file's item table, decoded: `restore` puts its columns back into what is read."""

    def __init__(self, meta: dict[bytes, bytes], path: Path | str) -> None:
        self.path = path
        try:
            self.table = pq.read_table(pa.BufferReader(meta[TABLE_KEY]))
            self.names: list[str] = json.loads(meta[COLUMNS_KEY])
        except (KeyError, ValueError, pa.ArrowException, OSError) as e:
            raise _unreadable(path, e) from e
        self.key = self.table.column_names[0]
        self.columns = tuple(self.table.column_names[1:])
        self.keys = self.table.column(0).to_numpy()
        if self.keys.size > 1 and not (self.keys[1:] > self.keys[:-1]).all():
            raise DataError(path, None, self.key, "the item table's keys are not sorted "
                            "and unique; re-create it: rerun dedup")
        self._values = {c: self.table.column(c).combine_chunks() for c in self.columns}
        # key -> row as an array where the keys are dense enough (ad ids are): a lookup
        # costs a fraction of a binary search (measured: restoring a file's chunks took
        # 40 ms, 4 ms a chunk of 65k impressions in searchsorted; 18-28 ms with the array)
        self._lut: np.ndarray | None = None
        if self.keys.size and self.keys[0] >= 0 and \
                self.keys[-1] < max(LUT_MIN, LUT_PER_KEY * self.keys.size):
            self._lut = np.full(int(self.keys[-1]) + 1, -1, dtype=np.int32)
            self._lut[self.keys] = np.arange(self.keys.size, dtype=np.int32)
        # a moved column as a read of the file would give it (Parquet names a list's
        # values "element")
        self._fields = {c: pa.field(c, pa.list_(pa.field("element", self._values[c].type)))
                        for c in self.columns}

    def physical(self, columns: Sequence[str] | None) -> list[str] | None:
        """The stored columns to read for `columns` (None: all of them)."""
        if columns is None:
            return None
        cols = [c for c in columns if c not in self.columns]
        if self.key not in cols and any(c in self.columns for c in columns):
            cols.append(self.key)
        return cols

    def restore(self, data: T, columns: Sequence[str] | None) -> T:
        """`data` (read with `physical(columns)`) with the moved columns back: `columns`,
        or every column of the file, in its order."""
        # every column: the file's columns before the move, then any added since (augment)
        names = list(columns) if columns is not None else \
            [*self.names, *(c for c in data.schema.names if c not in self.names)]
        want = [c for c in names if c in self.columns]
        arrays = {c: data.column(c) for c in data.schema.names}
        if want:
            keys = data.column(self.key)
            if isinstance(keys, pa.ChunkedArray):
                keys = keys.combine_chunks()
            flat = pc.list_flatten(keys).to_numpy(zero_copy_only=False)
            if self._lut is not None:
                inside = (flat >= 0) & (flat < self._lut.size)
                idx = np.where(inside, self._lut[np.clip(flat, 0, self._lut.size - 1)], -1)
                bad = idx < 0
            else:
                idx = np.searchsorted(self.keys, flat)
                bad = np.ones(flat.size, dtype=bool) if self.keys.size == 0 else \
                    (idx >= self.keys.size) | \
                    (self.keys[np.minimum(idx, self.keys.size - 1)] != flat)
            if bad.any():
                raise DataError(self.path, None, self.key, f"item {flat[bad][0]} is not in "
                                "the file's item table; re-create it: rerun dedup")
            offsets = pc.subtract(keys.offsets, keys.offsets[0])
            at = pa.array(idx)
            for c in want:
                arrays[c] = pa.ListArray.from_arrays(offsets, self._values[c].take(at),
                                                     type=self._fields[c].type)
        fields = [self._fields[c] if c in self.columns else data.schema.field(c)
                  for c in names]
        # pyarrow hands the footer's key-value pairs to every table it reads: the item
        # table is not the restored data's (written back, it would describe nothing)
        meta = {k: v for k, v in (data.schema.metadata or {}).items()
                if k not in (TABLE_KEY, COLUMNS_KEY)}
        schema = pa.schema(fields, metadata=meta)
        out = [arrays[c] for c in names]
        if isinstance(data, pa.RecordBatch):
            return pa.RecordBatch.from_arrays(out, schema=schema)  # type: ignore[return-value]
        return pa.Table.from_arrays(out, schema=schema)  # type: ignore[return-value]


def of(pf: pq.ParquetFile, path: Path | str) -> ItemTable | None:
    """The file's item table, or None when it has none."""
    meta = file_metadata(pf)
    return ItemTable(meta, path) if meta else None


def moved(pf: pq.ParquetFile, path: Path | str) -> tuple[str, ...]:
    """The columns the file at `path` stores in its item table."""
    meta = file_metadata(pf)
    if not meta:
        return ()
    try:
        return tuple(pq.read_schema(pa.BufferReader(meta[TABLE_KEY])).names[1:])
    except (KeyError, ValueError, pa.ArrowException, OSError) as e:
        raise _unreadable(path, e) from e


def _unreadable(path: Path | str, err: BaseException) -> DataError:
    return DataError(path, None, None, f"the item table in the file's metadata is "
                     f"unreadable ({err}); re-create it: rerun dedup")
