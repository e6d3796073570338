"""A log file read in chunks: its columns and their types (`scan`, `check_columns`), then
its rows about `rows` at a time (`chunks`): text files in blocks of whole lines, Parquet a
row group at a time, memory holding a chunk and not the file. A read that fails says so in
one line naming the file (and, through lrm.data.logs.culprits, the row and column)."""

from __future__ import annotations

import io
import itertools
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import polars as pl
import polars.selectors as cs
import pyarrow as pa
import pyarrow.parquet as pq

from lrm.config import LogsConfig
from lrm.data.logs import culprits, files
from lrm.data.logs.ahead import ahead
from lrm.data.logs.culprits import RowError
from lrm.data.logs.files import GZIP_ERRORS, Source, gzip_check, gzip_error, open_file
from lrm.data.logs.frame import ROW, dense_names
from lrm.errors import DataError

F = TypeVar("F", pl.DataFrame, pl.LazyFrame)
log = logging.getLogger("lrm")


def _polars_error(path: Path, e: Exception) -> DataError:
    if isinstance(e, GZIP_ERRORS):
        return gzip_error(path, e)
    if path.name.endswith(".gz") and (broken := gzip_check(path)) is not None:
        return broken
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return DataError(path, None, None, f"cannot read as {path.suffix.lstrip('.') or 'a log'}: "
                                       f"{first}")



def scan(src: Source, cfg: LogsConfig) -> pl.LazyFrame:
    """The file's raw columns, lazily, with `_row`; CSV/TSV columns are all text (each role
    parses its own, so a bad value names its row instead of failing the whole read)."""
    p = src.path
    if src.format == "parquet":
        lf = _plain_text(pl.scan_parquet(p))
    elif src.format == "jsonl" and (head := _bom_lines(src)) is not None:
        lf = pl.scan_ndjson(head, infer_schema_length=files.JSON_INFER_ROWS)
    elif src.format == "jsonl":
        lf = pl.scan_ndjson(p, infer_schema_length=files.JSON_INFER_ROWS)
    else:
        header = not cfg.columns
        lf = pl.scan_csv(p, separator="\t" if src.format == "tsv" else ",",
                         has_header=header, new_columns=None if header else list(cfg.columns),
                         infer_schema=False, quote_char=None if src.format == "tsv" else '"',
                         encoding="utf8-lossy")
    return lf.with_row_index(ROW, offset=1)


BOM = b"\xef\xbb\xbf"  # UTF-8's byte order mark: Windows tools start a text file with it


def _skip_bom(fh: Any) -> None:
    if fh.read(len(BOM)) != BOM:
        fh.seek(0)


def _bom_lines(src: Source) -> io.BytesIO | None:
    """A JSON-lines file that starts with a BOM (polars' JSON reader fails on it): its
    lines that type the columns, without it; None: no BOM (polars' CSV reader skips one)."""
    try:
        with open_file(src.path) as fh:
            if fh.read(len(BOM)) != BOM:
                return None
            return io.BytesIO(b"".join(itertools.islice(fh, files.JSON_INFER_ROWS)))
    except GZIP_ERRORS:
        return None  # (a broken .gz: the read names it)


def check_columns(src: Source, lf: pl.LazyFrame, cfg: LogsConfig) -> dict[str, pl.DataType]:
    """The file's column types; a DataError for the first mapped column it lacks."""
    try:
        schema = dict(lf.collect_schema())
    except (pl.exceptions.PolarsError, OSError) as e:
        if src.format == "jsonl" and (culprit := culprits.json_typing_culprit(src.path)):
            raise culprit from None  # values of two kinds in one field: its row
        raise _polars_error(src.path, e) from None
    twice = None
    if src.format == "jsonl":
        twice = culprits.json_key_twice(src.path)
    elif not cfg.columns and any(culprits.DUPLICATED.search(c) for c in schema):
        twice = culprits.header_twice(src)
    if twice is not None:
        raise twice
    for role, col in cfg.roles():
        if col not in schema:
            # (a name with blanks around it shown quoted: `user, ts` has the column ' ts')
            have = ", ".join(repr(c) if c != c.strip() else c for c in schema if c != ROW)
            blanks = [c for c in schema if c != ROW and c != col and c.strip() == col.strip()]
            near = f": the file's is {blanks[0]!r}, with blanks" if blanks else ""
            raise RowError(src.path, None, col, f"column missing (the {role} column; the file "
                                                f"has: {have}){near}{_separated(src, schema)}")
    return schema


def _separated(src: Source, schema: dict[str, pl.DataType]) -> str:
    """Where a CSV/TSV header read as one column holds another separator: which, and what
    to give (polars' reader reads the line whole)."""
    names = [c for c in schema if c != ROW]
    if src.format not in ("csv", "tsv") or len(names) != 1:
        return ""
    if src.format == "csv" and "\t" in names[0]:
        return ": tabs separate its header, give --format tsv"
    if src.format == "tsv" and "," in names[0]:
        return ": commas separate its header, give --format csv"
    for sep in (";", "|"):
        if sep in names[0]:
            return f": '{sep}' separates its header; lrm reads commas (csv) and tabs (tsv)"
    return ""



def chunks(src: Source, types: dict[str, pl.DataType], cfg: LogsConfig, rows: int, *,
           typed: bool = True) -> Iterator[pl.DataFrame]:
    """The file's rows, about `rows` at a time, with `_row`, streamed: memory holds a chunk,
    not the file. Text files are read in blocks of whole lines (a CSV block never ends
    inside a quoted field), each parsed on its own with the file's column names (JSON
    lines: its column types); Parquet a row group at a time. (polars' and pyarrow's own
    streaming readers read ahead: measured on a 10M-row CSV, ~400 MB of buffers.) The next
    chunk is read while the caller works on this one (lrm.data.logs.ahead: one ahead).

    typed: a CSV/TSV block's numeric columns (`numeric_columns`) come as float64 where the
    CSV reader parses every value of the block as a number: the values parsing their text
    gives, for less work (a block where one is not a number, or a CSV block with a quote,
    whose quoted empty value is text and not a missing number, is read as text). Chunks
    are cut at the same rows either way: `Parser` reads a bad chunk again as text
    (`TextNeeded`) so that its error shows the value as written."""
    try:
        if src.format == "parquet":
            yield from ahead(_parquet_chunks(src, rows))
            return
        numbers = numeric_columns(src, types, cfg) if typed else []
        yield from ahead(_text_chunks(src, [c for c in types if c != ROW], types, cfg, rows,
                                      numbers))
    except (pl.exceptions.PolarsError, OSError, pa.ArrowException, *GZIP_ERRORS) as e:
        raise _polars_error(src.path, e) from None


def _plain_text(frame: F) -> F:
    """Dictionary-encoded text (pandas' `category`, Arrow's dictionary type: polars'
    Categorical or Enum) as plain text: the values are the ids, the encoding is the
    writer's choice."""
    return frame.with_columns(cs.by_dtype(pl.Categorical, pl.Enum).cast(pl.String))


def _parquet_chunks(src: Source, rows: int) -> Iterator[pl.DataFrame]:
    f = pq.ParquetFile(src.path)
    n = 1
    for batch in f.iter_batches(batch_size=rows):
        df = _plain_text(pl.from_arrow(batch))  # type: ignore[arg-type]
        yield df.with_row_index(ROW, offset=n)
        n += batch.num_rows


def numeric_columns(src: Source, types: dict[str, pl.DataType], cfg: LogsConfig
                    ) -> list[str]:
    """The text columns of a CSV/TSV file that a chunk may carry as float64: the time when
    it is a number of units, and the dense columns."""
    if src.format not in ("csv", "tsv"):
        return []
    time = [cfg.time] if cfg.time and cfg.time_unit != "iso" and not cfg.time_format else []
    return [c for c in dict.fromkeys([*time, *dense_names(cfg)]) if types.get(c) == pl.String]


ID_ROLES = ("user", "item", "session", "categorical", "item_attributes", "vertical")
BLOCK_MAX = 1 << 26  # bytes read at once from a text file (a block's rows can be few and long)


def _text_chunks(src: Source, names: list[str], types: dict[str, pl.DataType],
                 cfg: LogsConfig, rows: int, numbers: Sequence[str] = ()
                 ) -> Iterator[pl.DataFrame]:
    quoted = src.format == "csv"
    texts = [c for c in dict.fromkeys(c for _, c in cfg.roles()) if types.get(c) == pl.String]
    id_texts = [c for role, c in cfg.roles() if role in ID_ROLES and c in texts]
    n = 1
    said = False  # (bytes that are not UTF-8: said once a file)
    with open_file(src.path) as fh:
        _skip_bom(fh)
        if src.format != "jsonl" and not cfg.columns:
            fh.readline()  # the header: `names` already holds it
        block = 1 << 16  # bytes; fitted to `rows` lines after the first block
        blank = b""  # empty lines that ended the block before: rows only if more follow
        while True:
            data = fh.read(block)
            if not data:
                return
            data = blank + data + fh.readline()
            quotes = quoted and b'"' in data
            while quotes and data.count(b'"') % 2:  # inside a quoted field: read on
                more = fh.readline()
                if not more:
                    break
                data += more
            if src.format != "jsonl":  # (polars' JSON reader skips empty lines)
                data, blank = _trailing_blank(data)
                if not data:
                    continue
            lossy = False  # (a CSV/TSV block read with bytes that are not UTF-8 replaced)
            if src.format == "jsonl":
                schema = {c: types[c] for c in names}
                try:
                    df = pl.read_ndjson(io.BytesIO(data), schema=schema)
                except pl.exceptions.PolarsError:
                    # a value of another kind among the rows that typed the columns
                    # (polars may type a column by the odd one), else in the block
                    culprit = (culprits.json_typing_culprit(src.path)
                               or culprits.json_culprit(src.path, data.splitlines(), n, schema))
                    if culprit is None:
                        raise
                    raise culprit from None
                odd = culprits.json_nested(src.path, df, data, n, texts) if texts else None
                if odd is None and id_texts:  # (an id's number in a text column)
                    odd = culprits.json_kind_in_text(src.path, data, n, id_texts)
                if odd is not None:
                    raise odd
            else:
                sep = "\t" if src.format == "tsv" else ","
                named = "--columns" if cfg.columns else "the header"
                df = None
                if numbers and not quotes:
                    try:
                        df, lossy = _read_text(data, names, sep, quoted, numbers)
                    except pl.exceptions.PolarsError:
                        pass  # a value that is not a number (or a block that starts with
                        # an empty line: one column, to polars): read as text, checked there
                if df is None:
                    try:
                        df, lossy = _read_text(data, names, sep, quoted)
                    except pl.exceptions.PolarsError:
                        culprit = culprits.csv_culprit(src.path, data, n, len(names), sep,
                                                       quoted, named)
                        if culprit is None:
                            raise
                        raise culprit from None
                # a row with fewer fields than the header reads as nulls where it ends: a
                # line cut short (the last of a truncated export) would go in. Its last
                # column is null; an empty last value is too, so without quotes a block's
                # separators then say it exactly (counting them costs a sixth of the
                # block's parse: only where a null shows); with them, the rows are looked at
                short = df[names[-1]].null_count() > 0
                if short and not quotes:
                    short = data.count(sep.encode()) != df.height * (len(names) - 1)
                if short and (culprit := culprits.csv_culprit(src.path, data, n, len(names),
                                                              sep, quoted, named)):
                    raise culprit
            if lossy and not said:
                said = True
                _say_not_utf8(src.path, data, n, quotes)
            if df.height:  # (at most BLOCK_MAX: a line of megabytes is a block on its own)
                block = max(1 << 12, min(BLOCK_MAX, len(data) * rows // df.height))
            # contiguous columns: the readers' come in pieces, and each query on a frame
            # whose columns are cut apart copies them all first (a third of the parse)
            df = df.rechunk().with_row_index(ROW, offset=n)
            n += df.height
            for start in range(0, df.height, rows):  # the first block may hold more
                yield df.slice(start, rows)



def _trailing_blank(data: bytes) -> tuple[bytes, bytes]:
    """A block without the empty lines that end it, and those lines: an export's last line
    ended twice (or a final empty line) is no row, while an empty line that more rows follow
    is one with no fields (an error naming it)."""
    body = data.rstrip(b"\r\n")
    end = data[len(body):]
    keep = 2 if end.startswith(b"\r\n") else min(1, len(end))
    if not body:
        keep = 0
    return data[:len(body) + keep], end[keep:]


def _read_text(data: bytes, names: list[str], sep: str, quoted: bool,
               numbers: Sequence[str] = ()) -> tuple[pl.DataFrame, bool]:
    """A block of CSV/TSV lines, every column as text but `numbers` (float64); bytes that
    are not UTF-8 replaced (checking for them costs a sixth of the parse: only a block that
    fails reads again)."""
    opts: dict[str, Any] = dict(has_header=False, new_columns=names, separator=sep,
                                infer_schema=False, quote_char='"' if quoted else None,
                                schema_overrides={c: pl.Float64 for c in numbers} or None)
    try:
        return pl.read_csv(data, encoding="utf8", **opts), False
    except pl.exceptions.ComputeError:
        return pl.read_csv(data, encoding="utf8-lossy", **opts), True


def _say_not_utf8(path: Path, data: bytes, first_row: int, quotes: bool) -> None:
    """A warning for a file whose bytes are not all UTF-8 (a Latin-1 or cp1252 export, as
    Excel writes CSV on Windows): read as U+FFFD, ids that differ only there are one."""
    at = ""
    if not quotes:  # (a line is a row: no quoted line break)
        for k, line in enumerate(data.splitlines()):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                at = f", row {first_row + k}"
                break
    log.warning("%s%s: bytes that are not UTF-8, each read as U+FFFD (ids that differ only "
                "there become one id): a Latin-1 or cp1252 export? convert it (iconv -f "
                "cp1252 -t utf-8)", path, at)

