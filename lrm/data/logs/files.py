"""A log's input files: each with its place and format, opened (a .gz looked through), and
the one-line error of a .gz that does not read through."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lrm.data.logs import FORMAT_OF
from lrm.errors import DataError

JSON_INFER_ROWS = 10_000  # JSON lines: the rows whose values give the columns' types


@dataclass(frozen=True)
class Source:
    """One input file: where it is, its place in the input, its format."""

    path: Path
    index: int
    format: str  # parquet | csv | tsv | jsonl


def file_format(path: Path, fmt: str) -> str:
    """The file's format: `fmt`, or from its suffix (a .gz suffix is looked through)."""
    if fmt != "auto":
        return fmt
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    found = FORMAT_OF.get(Path(name).suffix.lower())
    if found is None:
        raise DataError(path, None, None, "cannot tell the format from the name; give "
                                          "--format parquet|csv|tsv|jsonl")
    return found


def check_files(files: Sequence[Path]) -> None:
    """Fail before reading anything if an input is absent, not a file, or empty."""
    if not files:
        raise DataError("<no files>", None, None, "no input files given")
    for f in map(Path, files):
        if not f.exists():
            raise DataError(f, None, None, "file not found")
        if not f.is_file():
            raise DataError(f, None, None, "not a regular file")
        if f.stat().st_size == 0:
            raise DataError(f, None, None, "file is empty (no rows)")


def sources(files: Sequence[Path], fmt: str) -> list[Source]:
    """The inputs in order, each with its format (checked before any is read)."""
    check_files(files)
    return [Source(Path(f), i, file_format(Path(f), fmt)) for i, f in enumerate(files)]


# what Python's gzip raises on a .gz that is not one (BadGzipFile) or is cut short (EOFError,
# which click would turn into a bare "Aborted.")
GZIP_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)


def gzip_error(path: Path, e: BaseException) -> DataError:
    """The DataError of a .gz input that does not read through (`GZIP_ERRORS`)."""
    if isinstance(e, EOFError):
        return DataError(path, None, None, "truncated gzip (the file ends inside its "
                                           "compressed data)")
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return DataError(path, None, None, f"not a valid gzip file ({first})")



def open_file(path: Path) -> Any:
    return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")

