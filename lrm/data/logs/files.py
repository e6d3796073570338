"""A log's input files: each with its place and format, opened (a .gz looked through), and
the one-line errors of what is wrong with a file as a whole, before any row is read: absent
or empty, of another format than its name says (a Parquet file named .csv, a gzip file not
named .gz), a .gz that does not read through, the same content as another input's (a copy,
a compressed copy: its rows would be read twice).
"""

from __future__ import annotations

import gzip
import hashlib
import struct
import zlib
from collections.abc import Collection, Sequence
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
        with open(path, "rb") as fh:
            compressed = compression(fh.read(10))
        if compressed is not None:  # (a log.csv.zst: its compression is what to say)
            raise DataError(path, None, None, compressed)
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
    """The inputs in order, each with its format (checked before any is read: each file's
    first bytes say what it is, and no two files hold the same content)."""
    check_files(files)
    out = [Source(Path(f), i, file_format(Path(f), fmt)) for i, f in enumerate(files)]
    for src in out:
        check_kind(src)
    check_copies([s.path for s in out])
    return out


PARQUET_MAGIC, GZIP_MAGIC = b"PAR1", b"\x1f\x8b"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
# other compressions, told from their first bytes: read as text they were fields of binary
OTHER_COMPRESSION = {b"\x28\xb5\x2f\xfd": ("zstd", "zstd -d"), b"\xfd7zXZ\x00": ("xz", "unxz"),
                     b"PK\x03\x04": ("zip", "unzip"),
                     b"BZh?1AY&SY": ("bzip2", "bunzip2")}  # ?: the level, 1-9


def check_kind(src: Source) -> None:
    """A file whose first bytes say another format than its name (or --format) does: one
    line saying which, where a reader would fail with a message of its own bytes."""
    with open(src.path, "rb") as fh:
        head = fh.read(10)
    compressed = compression(head)
    if compressed is not None:
        raise DataError(src.path, None, None, compressed)
    _check_utf16(src, head)
    head = head[:4]
    gz = src.path.name.endswith(".gz")
    if head[:2] == GZIP_MAGIC and not gz:
        raise DataError(src.path, None, None, "gzip-compressed, but its name does not end "
                                              "with .gz: rename it NAME.gz")
    if gz:
        try:
            with gzip.open(src.path) as fh:
                _check_utf16(src, fh.read(2))
        except GZIP_ERRORS:
            pass
        return  # (what else it holds: its reader says, naming the file)
    if head == PARQUET_MAGIC and src.format != "parquet":
        raise DataError(src.path, None, None, f"a Parquet file, read as {src.format} (its "
                                              f"name or --format says so): rename it "
                                              f"NAME.parquet, or give --format parquet")
    if src.format == "parquet" and head != PARQUET_MAGIC:
        raise DataError(src.path, None, None, "not a Parquet file (it does not start with "
                                              "PAR1): give its --format (csv, tsv, jsonl)")


def _check_utf16(src: Source, head: bytes) -> None:
    """Text that starts with UTF-16's byte order mark (Excel's "Unicode text", PowerShell's
    `>`): read as UTF-8 its header was letters between NUL bytes."""
    if head[:2] in UTF16_BOMS and src.format != "parquet":
        raise DataError(src.path, None, None, "UTF-16 text, and lrm reads UTF-8: convert it "
                                              "(iconv -f UTF-16 -t UTF-8)")


def compression(head: bytes, read: Collection[str] = ()) -> str | None:
    """What to do with a file whose first bytes say a compression other than gzip (the log
    reader's blocks read .gz only) and `read`'s; None: not one of those."""
    for magic, (name, undo) in OTHER_COMPRESSION.items():
        if name in read:
            continue
        if len(head) >= len(magic) and all(m in (h, ord("?")) for m, h in zip(magic, head)):
            return (f"{name}-compressed: lrm reads {' and '.join(['gzip', *read])} only; "
                    f"decompress it ({undo}) or compress it with gzip")
    return None


def content_size(path: Path) -> int:
    """The size of the file's content: its bytes, or a .gz file's uncompressed size as its
    trailer states it (modulo 2**32; the last member's, where there are several)."""
    if not path.name.endswith(".gz"):
        return path.stat().st_size
    try:
        with open(path, "rb") as fh:
            fh.seek(-4, 2)
            return int(struct.unpack("<I", fh.read(4))[0])
    except (OSError, struct.error):  # shorter than a trailer: its reader says so
        return -1


def content_sha256(path: Path) -> str | None:
    """The sha256 of the file's content: a .gz file's uncompressed bytes, another file's
    own (None: a .gz that does not read through; its reader says so, naming it). A
    compressed copy of a file, or the plain copy of a compressed one, has its content."""
    try:
        with open_file(path) as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest()
    except (OSError, *GZIP_ERRORS):
        return None


def check_copies(paths: Sequence[Path]) -> None:
    """No two inputs hold the same content (a copy, a compressed copy): its rows would be
    read twice, and nothing downstream could tell. Only files whose content sizes match
    are hashed (`content_size`), so distinct files cost a stat each."""
    by_size: dict[int, list[Path]] = {}
    for p in paths:
        by_size.setdefault(content_size(p) % 2**32, []).append(p)
    seen: dict[str, Path] = {}
    for group in by_size.values():
        if len(group) < 2:
            continue
        for p in group:
            digest = content_sha256(p)
            if digest is None:
                continue
            if (first := seen.setdefault(digest, p)) is not p:
                raise DataError(p, None, None, f"the same content as {first}: its rows would "
                                               f"be read twice (a copy? give one of them)")


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


def gzip_check(path: Path) -> DataError | None:
    """A .gz input's gzip error, read through to its end (only after a read failed: polars
    says "unexpected end of file" without naming gzip)."""
    try:
        with gzip.open(path, "rb") as fh:
            while fh.read(1 << 24):
                pass
    except GZIP_ERRORS as e:
        return gzip_error(path, e)
    except OSError:
        return None
    return None

