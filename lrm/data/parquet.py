"""Reading Parquet files: every reader in lrm opens and streams them through here; the
writer settings of lrm's dataset files (`write_options`). A sessions file's item table
(lrm.data.items) is put back into what every read returns.

pyarrow reports a damaged file as `ArrowInvalid` or `OSError` ("ZSTD decompression failed",
"Parquet magic bytes not found in footer", ...) without naming it, from deep inside a
read, often in a loader thread. Here each such failure becomes a `DataError` that names
the file and, for a failure while decoding data, the row group, in one line. Files are
streamed one row group at a time (so the row group is always known); a batch therefore
never spans two row groups.

Arrow's buffers come from the C library's allocator (the malloc torch and numpy use), not
pyarrow's default mimalloc, unless the user chose a pool (`ARROW_DEFAULT_MEMORY_POOL`):
see ARROW_POOL.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from lrm.data import items
from lrm.errors import DataError

# pyarrow's default pool, mimalloc, kept more memory resident the longer a day streamed
# through the loader's threads (batches are decoded in one thread, normalized in another
# and freed in a third): the loader alone over one day, 2 cores, peak RSS 583 MB at 1M
# impressions and 673 MB at 10M; four passes over a 5M day in one process peaked at 659,
# 688, 681 and 715 MB. With the system pool: 508 and 549 MB; 517, 532, 529, 532 MB.
# Arrow's own reports: apache/arrow#47266, microsoft/mimalloc#1111. The C++ default pool
# (Parquet's decoding buffers) is read from ARROW_POOL when pyarrow is imported, which
# lrm/__init__.py sets first; pyarrow's own calls take this one even where pyarrow was
# imported before lrm.
ARROW_POOL = "ARROW_DEFAULT_MEMORY_POOL"
if os.environ.get(ARROW_POOL) == "system":
    pa.set_memory_pool(pa.system_memory_pool())

REMEDY = "re-create it: rerun the stage that wrote it"
_REASON_CHARS = 200  # a pyarrow message can quote a whole thrift struct


def _reason(err: BaseException) -> str:
    """pyarrow's message, first line only, trimmed."""
    text = str(err).strip()
    if isinstance(err, OSError) and err.errno is not None and err.strerror:  # an OS error
        text = err.strerror
    line = text.splitlines()[0].strip() if text else type(err).__name__
    return line if len(line) <= _REASON_CHARS else line[:_REASON_CHARS - 3] + "..."


def _error(path: Path | str, err: BaseException, row_group: int | None) -> DataError:
    if isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return DataError(path, None, None, f"cannot open: {_reason(err)}")
    if row_group is None:
        return DataError(path, None, None, f"not a readable Parquet file ({_reason(err)}); it "
                         f"is truncated, corrupt or not Parquet at all ({REMEDY})")
    return DataError(path, None, None, f"row group {row_group}: {_reason(err)}; the file is "
                     f"truncated or corrupt ({REMEDY})")


@contextlib.contextmanager
def reading(path: Path | str, row_group: int | None = None) -> Iterator[None]:
    """Turn a pyarrow or OS failure inside the block into a DataError naming `path`.

    row_group: the row group being decoded, when known (named in the message).
    """
    try:
        yield
    except MemoryError:  # ArrowMemoryError too: not the file's fault
        raise
    except (pa.ArrowException, OSError) as e:  # ArrowIOError is OSError
        raise _error(path, e, row_group) from e


def open_file(path: Path | str) -> pq.ParquetFile:
    """The file, its footer read and checked (a DataError when it is not readable Parquet)."""
    with reading(path):
        return pq.ParquetFile(path)


def read_metadata(path: Path | str) -> pq.FileMetaData:
    """The file's footer: row count, row groups, schema."""
    return open_file(path).metadata


def iter_batches(path: Path | str, batch_size: int, columns: Sequence[str] | None = None, *,
                 file: pq.ParquetFile | None = None,
                 check: Callable[[pa.RecordBatch, int, int], None] | None = None
                 ) -> Iterator[pa.RecordBatch]:
    """The file's rows as record batches of at most `batch_size`, one row group at a time.

    file: `open_file(path)`, when the caller already opened it (its footer is not re-read).
    check(batch, row group, its first row there): called on each batch before it is yielded
    (lrm.data.values: a bad value is an error naming the row group).
    A batch never spans row groups: a row group's last batch may be short.
    """
    pf = open_file(path) if file is None else file
    it = items.of(pf, path)
    cols = None if columns is None else list(columns)
    read = it.physical(cols) if it is not None else cols
    for k in range(pf.num_row_groups):
        with reading(path, k):
            batches = pf.iter_batches(batch_size=batch_size, row_groups=[k], columns=read)
        row = 0
        while True:
            with reading(path, k):  # decoding happens on next(): errors surface here
                rb = next(batches, None)
            if rb is None:
                break
            rb = rb if it is None else it.restore(rb, cols)
            if check is not None:
                check(rb, k, row)
            row += rb.num_rows
            yield rb


def read_table(path: Path | str, columns: Sequence[str] | None = None, *,
               check: Callable[[pa.RecordBatch, int, int], None] | None = None) -> pa.Table:
    """The whole file (or `columns` of it) as one table, read row group by row group;
    `check` as in iter_batches (on each row group, after its item table is put back)."""
    pf = open_file(path)
    it = items.of(pf, path)
    cols = None if columns is None else list(columns)
    read = it.physical(cols) if it is not None else cols
    parts = []
    for k in range(pf.num_row_groups):
        with reading(path, k):
            part = pf.read_row_group(k, columns=read)
        if check is not None:
            for rb, row in _located(part if it is None else it.restore(part, cols)):
                check(rb, k, row)
        parts.append(part)
    if parts:
        table = pa.concat_tables(parts)
    else:
        empty = pf.schema_arrow.empty_table()
        table = empty if read is None else empty.select(read)
    return table if it is None else it.restore(table, cols)


def _located(table: pa.Table) -> Iterator[tuple[pa.RecordBatch, int]]:
    row = 0
    for rb in table.to_batches():
        yield rb, row
        row += rb.num_rows


def column_names(pf: pq.ParquetFile, path: Path | str) -> list[str]:
    """The columns a read of the file at `path` gives: those stored, and those its item
    table holds (lrm.data.items)."""
    return [*pf.schema_arrow.names, *items.moved(pf, path)]


# Parquet writer settings (see write_options). Measured on the synthetic log (mean session
# 8, history ~80): zstd 9 saves ~2% over 3 at twice the write time; dictionaries roughly
# halve the integer id columns but inflate noisy floats (d_bid +50%); row-group size
# changes the bytes by <0.1% and only bounds the memory of a streaming reader.
ZSTD_LEVEL = 3
ROW_GROUP_IMPRESSIONS = 128 * 1024  # impressions per row group (sessions: / 8)


def leaf(f: pa.Field) -> tuple[str, pa.DataType]:
    """A column's path in the Parquet file (the name writer options take) and its values'
    type (a list's elements)."""
    if pa.types.is_list(f.type) or pa.types.is_large_list(f.type):
        return f"{f.name}.list.element", f.type.value_type
    return f.name, f.type


def write_options(schema: pa.Schema, layout: str) -> dict[str, Any]:
    """Writer settings for a dataset file; the same rules for both layouts.

    zstd; dictionary encoding for integer columns (and integer lists), none for floats;
    row groups of about ROW_GROUP_IMPRESSIONS impressions. The storage benchmark writes
    the plain impression layout with exactly these rules, so its comparison is fair.
    """
    dict_cols = [name for name, t in map(leaf, schema) if pa.types.is_integer(t)]
    rows = ROW_GROUP_IMPRESSIONS // (8 if layout == "sessions" else 1)
    return {"compression": "zstd", "compression_level": ZSTD_LEVEL,
            "use_dictionary": dict_cols, "row_group_size": rows, "write_statistics": True}
