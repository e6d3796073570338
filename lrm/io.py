"""Atomic outputs: nothing half-written is ever visible under its final name.

Parquet has no transactions and `write_parquet` truncates in place, so every output is
written to a sibling temporary path, checked, and renamed into place.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_dir(out: Path, *, stage: str = "lrm", force: bool = False) -> Iterator[Path]:
    """Yield a fresh temporary directory that replaces `out` only if the block succeeds.

    On any exception the temporary directory is removed and `out` is left exactly as it
    was (absent if it was absent).
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        os.replace(out, old)
    os.replace(tmp, out)
    _fsync_dir(out.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_parquet(table: pa.Table, path: Path, **kwargs: Any) -> int:
    """Write `table` to `path` atomically; return the bytes written.

    The footer is read back and its row count checked before the rename.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    kwargs.setdefault("compression", "zstd")
    try:
        pq.write_table(table, tmp, **kwargs)
        rows = pq.read_metadata(tmp).num_rows
        if rows != table.num_rows:
            raise OSError(f"{tmp}: wrote {rows} rows, expected {table.num_rows}")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path.stat().st_size


def write_text(text: str, path: Path, *, stage: str | None = None, force: bool = False) -> None:
    """Write a text file atomically (a sibling temporary, then a rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json(obj: Any, path: Path, *, stage: str | None = None, force: bool = False) -> None:
    """Write JSON atomically (sorted keys, trailing newline)."""
    write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", path)


def dir_bytes(path: Path) -> int:
    """Total size of the regular files under `path`."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def check_paths(inputs: Any, outputs: Any) -> None:  # TEMPORARY: replaced by the io branch
    pass


def check_replaceable(out: Path, stage: Any, *, force: bool = False) -> None:  # TEMPORARY
    pass


def write_bytes(data: bytes, path: Path, *, stage: str | None = None,  # TEMPORARY (io branch)
                force: bool = False) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def check_file_replaceable(path: Path, stage: Any, *, force: bool = False) -> None:  # TEMP
    pass


def claim_dir(path: Path, stage: Any, *, force: bool = False) -> None:  # TEMP (io branch)
    Path(path).mkdir(parents=True, exist_ok=True)
