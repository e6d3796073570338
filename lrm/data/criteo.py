"""Criteo display-ads TSV -> the impressions dataset (`criteo_schema().arrow("impressions")`).

Input: one example per line, no header, 40 tab-separated fields: ``label`` (0/1),
``I1..I13`` integers (empty = missing; negatives occur) and ``C1..C26`` 8-hex-digit hashed
categoricals (empty = missing).

Output, per good row:

* ``session_id``: the row's line in the files, counted from 0 across all files in order
  (line k of the second file is lines(first file) + k - 1; a skipped bad line leaves its
  number unused), so each file's ids are known before the files before it are parsed (a
  file is a unit of lrm.fanout); every row is its own session, so ``position`` is always 0.
* ``day``: the data's own time. Criteo TSV has no time column; its public releases are
  one file per day, so ``cfg.days == "file"`` makes file k of `files` day k, and
  ``cfg.days == "one"`` makes every row day 0 (the files are parts of one day). Rows are
  never cut into days by count: a held-out day is all of its file.
* ``label``: int8.
* ``C1..C26``: the hash parsed from hex to int64 (in [0, 2**32)); null when empty.
* ``I1..I13``: float32, the standard DLRM transform ``log(1 + max(x, 0))``; a missing value
  becomes 0 (the same value as x <= 0).

Files are read lazily, ``cfg.chunk_rows`` lines at a time (polars' streaming engine), and each
chunk is written as soon as it is parsed (one part per chunk and day), so memory is bounded by
the chunk, not the file: measured on a 2-core box, peak RSS was ~0.5 GB at 20k rows a chunk
and ~1 GB at 200k, the same for 2M- and 4M-row files. Each line is scanned as one string
column (NUL separator, no quoting) and split on tabs in one vectorized pass: the split's
length is the field count, and the scanner's row index gives the 1-based line number for
errors. CRLF line ends are accepted; bytes that are not UTF-8 are replaced (and then fail a
field's check); a NUL byte in a file is a file-level error.

Criteo is also one mapping of `lrm ingest logs` (lrm.data.logs: ``--format tsv --columns
label,I1,..,C26 --label label --dense I1,..,I13 --categorical C1,..,C26 --days file``; the same
rows, labels and days, each hash a dense vocabulary id). This reader stays beside it as the
`criteo` shortcut for what the mapping cannot say: its output is a contract (the hashes as
they are, for hashed tables and `fit_tables`; the DLRM transform log(1 + max(x, 0)) of the
counts, not a scaling fitted to the data), `skip_bad` skips and counts bad rows by reason,
and one 40-field split per line checks the field count a CSV reader pads or refuses.

Bad rows (wrong field count, a label other than 0/1, a non-integer ``I`` field, a ``C`` field
that is not 8 hex digits) raise a `DataError` naming the file, line and field of the first
one; with ``cfg.skip_bad`` they are skipped and counted per reason instead. A missing or
empty file is always an error. `ingest` writes into `out` as it goes: callers wrap `out` in
`lrm.io.atomic_dir` so that a failure leaves nothing half-written.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from lrm import fanout, io
from lrm.config import IngestConfig
from lrm.data.logs.files import check_files, compression, gzip_check
from lrm.data.schema import (
    CRITEO_CAT,
    CRITEO_INT,
    DAY,
    LABEL,
    POSITION,
    SESSION,
    criteo_schema,
    part_path,
)
from lrm.errors import DataError
from lrm.progress import Reporter

log = logging.getLogger("lrm")

FIELDS = (LABEL, *CRITEO_INT, *CRITEO_CAT)
N_FIELDS = len(FIELDS)  # 40
LINE, LINENO = "_line", "_lineno"

# Why a row is bad, in the order the checks apply (a row counts under its first failure).
REASONS = ("field_count", "label", "not_integer", "not_hex_hash")


def _reason(field: str) -> str:
    if field == "fields":
        return "field_count"
    if field == LABEL:
        return "label"
    return "not_integer" if field in CRITEO_INT else "not_hex_hash"


def _values() -> dict[str, pl.Expr]:
    """field -> its parsed value (null where empty or unparsable), from the raw strings."""
    values = {LABEL: pl.col(LABEL).cast(pl.Int8, strict=False)}
    values.update({c: pl.col(c).cast(pl.Int64, strict=False) for c in CRITEO_INT})
    values.update({c: pl.col(c).str.to_integer(base=16, strict=False) for c in CRITEO_CAT})
    return values


def _checks(values: dict[str, pl.Expr]) -> dict[str, pl.Expr]:
    """field -> expression that is True where that field of the row is bad, in check order.

    A hash must be exactly 8 bytes that parse as base 16. The parser also takes a leading
    sign, so a '+' or a negative value is refused; that is what ^[0-9a-fA-F]{8}$ means, at a
    fraction of a regex's cost, and it shares the parse with the value itself.
    """
    checks = {"fields": pl.col("_nfields") != N_FIELDS,
              LABEL: ~pl.col(LABEL).is_in(["0", "1"])}
    for c in CRITEO_INT:
        checks[c] = (pl.col(c) != "") & values[c].is_null()
    for c in CRITEO_CAT:
        raw = pl.col(c)
        hex8 = (raw.str.len_bytes() == 8) & (values[c] >= 0) & ~raw.str.starts_with("+")
        checks[c] = (raw != "") & ~hex8.fill_null(False)
    return checks


def _message(field: str, nfields: int, raw: str | None) -> str:
    shown = repr(raw if raw is None or len(raw) <= 40 else raw[:40] + "...")
    if field == "fields":
        return f"expected {N_FIELDS} tab-separated fields, got {nfields}"
    if field == LABEL:
        return f"label must be 0 or 1, got {shown}"
    if field in CRITEO_INT:
        return f"not an integer: {shown}"
    return f"not an 8-hex-digit hash: {shown}"


def _lines(path: Path) -> pl.LazyFrame:
    """(line number, line) rows of `path`: every line one string (NUL separator, no quoting)."""
    return pl.scan_csv(
        path, has_header=False, separator="\x00", quote_char=None, comment_prefix=None,
        schema={LINE: pl.String}, empty_string_is_null=False, encoding="utf8-lossy",
        row_index_name=LINENO, row_index_offset=1,
    )


def _chunks(path: Path, chunk_rows: int) -> Iterator[pl.DataFrame]:
    """(line number, line) frames of at most `chunk_rows` lines, streamed from `path`."""
    lines = _lines(path)
    try:
        for batch in lines.collect_batches(chunk_size=chunk_rows, maintain_order=True):
            # The engine may hand back larger or smaller batches; re-slice to the bound.
            for start in range(0, batch.height, chunk_rows):
                yield batch.slice(start, chunk_rows)
    except (pl.exceptions.PolarsError, OSError) as e:
        # a .gz cut short reads as "unexpected end of file"; a NUL byte splits a line in two
        if path.name.endswith(".gz") and (broken := gzip_check(path)) is not None:
            raise broken from None
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise DataError(path, None, None,
                        f"cannot read as lines of text (a NUL byte?): {first}") from None


def _blank_tail_dropped(chunks: Iterator[pl.DataFrame]) -> Iterator[pl.DataFrame]:
    """The chunks without the empty lines that end the file (its last line ended twice): an
    empty line that more lines follow is still a bad row. A chunk's closing empty lines wait
    for the next chunk."""
    held: pl.DataFrame | None = None
    for chunk in chunks:
        if held is not None:
            chunk, held = pl.concat([held, chunk]), None
        if chunk.height and chunk[LINE][-1] not in ("", "\r"):
            yield chunk  # (the common case: a look at its last line only)
            continue
        filled = ~chunk[LINE].is_in(["", "\r"]).to_numpy()
        if not filled.any():
            held = chunk
            continue
        end = len(filled) - int(np.argmax(filled[::-1]))  # after the last line with text
        if end < chunk.height:
            chunk, held = chunk.head(end), chunk.slice(end)
        yield chunk


def _split(lines: pl.LazyFrame) -> pl.LazyFrame:
    """The raw string fields of each line (null past its end), its field count and line number."""
    parts = pl.col(LINE).str.split("\t")
    return lines.select(LINENO, parts.alias("_parts")).select(
        LINENO,
        pl.col("_parts").list.len().alias("_nfields"),
        pl.col("_parts").list.to_struct(fields=list(FIELDS)).alias("_f"),
    ).unnest("_f")


def _first_failures(path: Path, bad_lines: pl.DataFrame,
                    checks: dict[str, pl.Expr]) -> list[DataError]:
    """One DataError per bad line (its first failing field), in line order."""
    field = pl.lit(None, dtype=pl.String)
    for name in reversed(checks):  # nested when/then: the earliest failing check wins
        field = pl.when(checks[name]).then(pl.lit(name)).otherwise(field)
    value = pl.lit(None, dtype=pl.String)
    for name in FIELDS:
        value = pl.when(pl.col("_field") == name).then(pl.col(name)).otherwise(value)
    rows = (_split(bad_lines.lazy()).with_columns(field.alias("_field"))
            .select(LINENO, "_field", "_nfields", value.alias("_value"),
                    pl.col(LABEL).alias("_first")).collect().iter_rows())
    return [DataError(path, line, name, _message(name, n, raw) + _looks(line, name, n, first))
            for line, name, n, raw, first in rows]


def _looks(line: int, field: str, nfields: int, first: str | None) -> str:
    """What a bad line looks like, where that says more than its first bad field: an empty
    line, or a header line (Criteo's TSV has none)."""
    if field == "fields" and nfields == 1 and not first:
        return " (an empty line)"
    if line == 1 and field == LABEL and first is not None and first.strip().isidentifier():
        return " (a header line? Criteo's TSV has none: remove it)"
    return ""


def _parse(chunk: pl.DataFrame, values: dict[str, pl.Expr], bad: pl.Expr) -> pl.DataFrame:
    """Typed label, C* and I* columns for a chunk of lines, plus `_bad` (a check fails).

    One lazy query, so the parse of each field is shared by its check and its value.
    """
    dense = [values[c].clip(lower_bound=0).fill_null(0).cast(pl.Float64).log1p()
             .cast(pl.Float32).alias(c) for c in CRITEO_INT]
    sparse = [values[c].alias(c) for c in CRITEO_CAT]
    return _split(chunk.lazy()).select(
        LINENO, bad.alias("_bad"), values[LABEL].alias(LABEL), *sparse, *dense).collect()


def _with_keys(parsed: pl.DataFrame, first_line: int, day: int) -> pl.DataFrame:
    """Add day, session_id (`first_line` + the row's line number - 1) and position to good
    parsed rows; columns in schema order."""
    session = pl.col(LINENO).cast(pl.Int64) + (first_line - 1)
    return parsed.select(
        pl.lit(day, dtype=pl.Int32).alias(DAY),
        session.alias(SESSION),
        pl.lit(0, dtype=pl.Int16).alias(POSITION),
        LABEL, *CRITEO_CAT, *CRITEO_INT,
    )


class _Writer:
    """Writes frames as `out/day=D/part-NNNNN.parquet`, numbering parts per day."""

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.schema = criteo_schema().arrow("impressions")
        self.parts: dict[int, int] = {}
        self.bytes = 0

    def write(self, df: pl.DataFrame) -> None:
        for (day,), piece in df.partition_by(DAY, maintain_order=True, as_dict=True).items():
            part = self.parts.get(day, 0)
            table = piece.to_arrow().cast(self.schema)
            self.bytes += io.write_parquet(table, part_path(self.out, day, part))
            self.parts[day] = part + 1


@dataclass
class _Counts:
    """What a unit wrote: rows, clicks, bad rows by reason, its days' part counts, bytes."""

    rows: int = 0
    positives: int = 0
    by_reason: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    parts: dict[int, int] = field(default_factory=dict)
    bytes: int = 0


def line_count(path: Path) -> int:
    """The lines of `path` as the reader numbers them (polars' own count of the same scan)."""
    return int(_lines(path).select(pl.len()).collect().item())


def _files_unit(index: int, *, files: list[Path], first_lines: list[int], out: Path,
                cfg: IngestConfig, rep: Reporter | None) -> _Counts:
    """Files `files[index]` (a day of its own), or every file (days: one): parse, check and
    write their rows; a unit of lrm.fanout. Line k of file j is session first_lines[j] + k - 1."""
    values = _values()
    checks = _checks(values)
    bad_expr = pl.any_horizontal(*checks.values())
    writer = _Writer(out)
    c = _Counts()
    todo = range(len(files)) if cfg.days == "one" else [index]
    io.unit_folder(part_path(out, index if cfg.days == "file" else 0, 0).parent)
    for j in todo:
        path = files[j]
        file_bad = 0
        for chunk in _blank_tail_dropped(_chunks(path, cfg.chunk_rows)):
            parsed = _parse(chunk, values, bad_expr)
            if parsed["_bad"].any():
                errors = _first_failures(path, chunk.filter(parsed["_bad"]), checks)
                if not cfg.skip_bad:
                    raise errors[0]
                if file_bad == 0:
                    log.warning("skipping bad rows in %s; the first: %s", path, errors[0])
                for e in errors:
                    c.by_reason[_reason(e.field)] += 1
                file_bad += len(errors)
                parsed = parsed.filter(~pl.col("_bad"))
            if parsed.height:
                typed = _with_keys(parsed, first_lines[j], j if cfg.days == "file" else 0)
                writer.write(typed)
                c.rows += typed.height
                c.positives += int(typed[LABEL].sum())
            if rep is not None:
                mb = (chunk[LINE].str.len_bytes().sum() + chunk.height) / 1e6
                rep.update(mb, rows=c.rows, bad_rows=sum(c.by_reason.values()))
        if file_bad:
            log.warning("%s: skipped %d bad rows", path, file_bad)
    c.parts, c.bytes = writer.parts, writer.bytes
    return c


def ingest(files: Sequence[Path], out: Path, cfg: IngestConfig) -> dict[str, Any]:
    """Convert Criteo TSV `files` into `out/day=D/part-NNNNN.parquet`; return the metrics.

    With a day per file (`days: file`) each file is a unit of lrm.fanout (a task of its own
    in the Prefect flows, on a cluster's workers there); its rows' session ids start after
    the lines of the files before it, so that they need not wait for each other (counted
    first, each file a unit). With `days: one` the files are parts of one day, read in turn.

    Metrics: rows (written), bad_rows (skipped), bad_by_reason, files, days, ctr, bytes.
    Raises DataError for the first bad row (unless cfg.skip_bad) and for a missing or empty
    file; `out` is then partly written, which is why callers wrap it in `io.atomic_dir`.
    """
    files = [Path(f) for f in files]
    check_files(files)
    for f in files:  # (polars' line scan reads zstd as it reads gzip)
        with open(f, "rb") as fh:
            if (compressed := compression(fh.read(10), read=("zstd",))) is not None:
                raise DataError(f, None, None, compressed)
    names = [f.name for f in files]
    counts = fanout.map_units("ingest lines", line_count, files[:-1], names[:-1])
    first_lines = [0, *itertools.accumulate(counts)]
    total_mb = sum(f.stat().st_size for f in files) / 1e6
    units = list(range(len(files))) if cfg.days == "file" else [0]
    with Reporter("ingest", total=round(total_mb, 1), unit="MB") as rep:
        done = fanout.map_units(
            "ingest file", partial(_files_unit, files=files, first_lines=first_lines, out=out,
                                   cfg=cfg, rep=rep if fanout.in_process() else None),
            units, [names[u] for u in units] if cfg.days == "file" else ["all"])
    rows = sum(c.rows for c in done)
    by_reason = {r: sum(c.by_reason[r] for c in done) for r in REASONS}
    bad_rows = sum(by_reason.values())
    if rows == 0:
        raise DataError(files[0] if len(files) == 1 else ", ".join(map(str, files)), None, None,
                        f"no valid rows to ingest ({bad_rows} bad rows skipped)")
    return {
        "rows": rows,
        "bad_rows": bad_rows,
        "bad_by_reason": by_reason,
        "files": len(files),
        "days": len({d for c in done for d in c.parts}),
        "ctr": sum(c.positives for c in done) / rows,
        "bytes": sum(c.bytes for c in done),
    }
