"""Error forensics: a bad value located to its file, row and column (`RowError`, exit 2).

polars' readers fail a whole block on a row with more fields than the header, a JSON line
that does not parse, or a JSON value of another kind than its field's, and say neither the
row nor the field; they keep one of a column a header names twice, and read a list or an
object in a JSON text column as its JSON text. The functions here find those rows, each
only after such a failure or where the cheap sign of one shows (they walk lines in Python,
~50-100x polars' parse).
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from lrm.data.logs import files
from lrm.data.logs.files import GZIP_ERRORS, Source, gzip_error, open_file
from lrm.errors import DataError


@dataclass
class RowError(DataError):
    """A bad value, located to its file, data row (1-based) and column."""

    def __str__(self) -> str:
        where = str(self.file)
        if self.line is not None:
            where += f", row {self.line}"
        if self.field is not None:
            where += f", column {self.field}"
        return f"{where}: {self.message}"



# polars names a CSV header's second X `X_duplicated_0` (and reads on): the mapping's X would
# be the first silently. (Parquet with a name twice fails its read.)
DUPLICATED = re.compile(r"_duplicated_\d+$")


def header_twice(src: Source) -> DataError | None:
    """The first column a CSV/TSV header names twice (read from the header itself: a column
    may be called X_duplicated_0)."""
    try:
        with open_file(src.path) as fh:
            line = fh.readline().decode("utf-8", errors="replace").lstrip("\ufeff")
    except GZIP_ERRORS as e:
        return gzip_error(src.path, e)
    tsv = src.format == "tsv"
    names = next(csv.reader([line], delimiter="\t" if tsv else ",",
                            quoting=csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL), [])
    first: dict[str, int] = {}
    for k, name in enumerate(names, 1):
        if name in first:
            return RowError(src.path, None, name, f"the header names this column twice "
                                                  f"(columns {first[name]} and {k})")
        first[name] = k
    return None


def json_key_twice(path: Path) -> DataError | None:
    """A key twice in the file's first JSON object (polars keeps one of the two silently).
    Only the first line: a writer that repeats a key repeats it on every line, and a
    check of each line would cost ~100x polars' parse."""
    twice: list[str] = []

    def pairs(kv: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in kv]
        twice[:] = [k for k in keys if keys.count(k) > 1]  # the outer object's, called last
        return dict(kv)

    try:
        with open_file(path) as fh:
            line = next((ln for ln in fh if ln.strip()), b"")
        json.loads(line, object_pairs_hook=pairs)
    except GZIP_ERRORS as e:
        return gzip_error(path, e)
    except ValueError:  # not JSON: the read says where
        return None
    if twice:
        return RowError(path, 1, twice[0], "the JSON object holds this key twice")
    return None



# JSON lines: polars' reader fails a whole block on a value of another kind than its field's
# (a list where numbers are, text in a numeric time) and names neither its row nor its field.
# Only after such a failure, the lines are walked here to find them (~100x polars' parse).
_JSON_KINDS = {bool: "a boolean", int: "a number", float: "a number", str: "text",
               list: "a list", dict: "an object"}


def _json_allowed(dtype: pl.DataType) -> tuple[type, ...] | None:
    """The Python types of the JSON values a column of `dtype` reads (None: not checked)."""
    if dtype.is_integer():
        return (int,)
    if dtype.is_float():
        return (int, float)
    return {pl.String: (str,), pl.Boolean: (bool,), pl.List: (list,), pl.Array: (list,),
            pl.Struct: (dict,), pl.Null: ()}.get(dtype.base_type())


def _not_lines(line: bytes) -> str:
    """What a bad JSON line's start says the file is instead: an array of objects, or
    objects written over several lines (`jq -c` writes either as JSON lines)."""
    start = line.lstrip(b"\xef\xbb\xbf \t\r\n")
    if start.startswith(b"["):
        return "; a JSON array, not JSON lines (one object a line): jq -c '.[]' writes them"
    if start.rstrip() == b"{":
        return ("; an object over several lines, not JSON lines (one object a line): jq -c "
                "writes them")
    return ""


def json_culprit(path: Path, lines: Iterable[bytes], first_row: int,
                  schema: dict[str, pl.DataType] | None = None) -> RowError | None:
    """The first row of `lines` (data rows from `first_row`; blank lines are not rows) that
    is not a JSON object, or whose field holds a value of another kind than `schema` gives
    (no schema: than the field's first value in these lines)."""
    allowed: dict[str, tuple[tuple[type, ...], str]] = {}  # column -> (kinds, what they are)
    for col, dtype in (schema or {}).items():
        if (kinds := _json_allowed(dtype)) is not None:
            allowed[col] = (kinds, f" is {dtype} (as its first rows give it)")
    row = first_row
    for line in lines:
        if not line.strip():
            continue
        try:
            obj = json.loads(line.strip())
        except json.JSONDecodeError as e:
            return RowError(path, row, None, f"not a JSON line ({e.msg} at character "
                                             f"{e.pos + 1}){_not_lines(line)}")
        except ValueError as e:  # bytes that are not UTF-8
            return RowError(path, row, None, f"not a JSON line ({e})")
        if not isinstance(obj, dict):
            return RowError(path, row, None, f"not a JSON object: {line[:80]!r}"
                                             f"{_not_lines(line)}")
        for col, v in obj.items():
            if v is None:
                continue
            if col not in allowed:
                if schema is None:  # a field's first value sets its kind (numbers: both)
                    kind = (int, float) if type(v) in (int, float) else (type(v),)
                    allowed[col] = (kind, f"'s first value (row {row}) is "
                                          f"{_JSON_KINDS.get(type(v), type(v).__name__)}")
                continue
            kinds, what = allowed[col]
            if type(v) not in kinds:
                shown = json.dumps(v)
                shown = shown if len(shown) <= 40 else shown[:37] + "..."
                return RowError(path, row, col, f"{_JSON_KINDS.get(type(v), type(v).__name__)} "
                                                f"({shown}) where the column{what}")
        row += 1
    return None


def json_nested(path: Path, df: pl.DataFrame, data: bytes, first_row: int,
                 cols: Sequence[str]) -> RowError | None:
    """The first row of a JSON block (`df` read from `data`) whose text column `cols` holds
    a list or an object: polars reads one as its JSON text ('["x", "z"]') without a word.
    Only the rows whose text starts like one are parsed again."""
    like = [pl.col(c).str.starts_with("[") | pl.col(c).str.starts_with("{") for c in cols]
    hits = df.select(pl.any_horizontal(like).arg_true())[:, 0]
    if hits.is_empty():
        return None
    lines = [ln for ln in data.splitlines() if ln.strip()]  # (blank lines are not rows)
    for k in hits.to_list():
        try:
            obj = json.loads(lines[k])
        except (ValueError, IndexError):
            continue
        for c in cols:
            v = obj.get(c) if isinstance(obj, dict) else None
            if isinstance(v, (list, dict)):
                shown = json.dumps(v)
                shown = shown if len(shown) <= 40 else shown[:37] + "..."
                return RowError(path, first_row + k, c, f"{_JSON_KINDS[type(v)]} ({shown}) "
                                                        f"in a column of text (a field's "
                                                        f"values must all be of one kind)")
    return None


def json_kind_in_text(path: Path, data: bytes, first_row: int, cols: Sequence[str]
                      ) -> RowError | None:
    """The first row of a JSON block whose text column `cols` holds a number or a boolean:
    polars reads one into a text column as its text (123 as "123") without a word. Only a
    block where such a value shows (a regular expression over its bytes) is parsed again."""
    keys = b"|".join(re.escape(json.dumps(c).encode()) for c in cols)
    if re.search(rb"(?:" + keys + rb")\s*:\s*[-0-9tf]", data) is None:
        return None
    return json_culprit(path, data.splitlines(), first_row, {c: pl.String() for c in cols})


def json_typing_culprit(path: Path) -> DataError | None:
    """The first value of another kind than its field's first among the rows polars types
    the columns by (`files.JSON_INFER_ROWS`)."""
    try:
        with open_file(path) as fh:
            return json_culprit(path, itertools.islice(fh, files.JSON_INFER_ROWS), 1)
    except GZIP_ERRORS as e:
        return gzip_error(path, e)


def csv_culprit(path: Path, data: bytes, first_row: int, fields: int, sep: str,
                quoted: bool, named_by: str = "the header") -> RowError | None:
    """The first row of a CSV/TSV block with more fields than the header (polars' reader
    fails the block without its row) or fewer (polars reads nulls where it ends: a line
    cut short). Only after a sign of one: Python's csv reader is ~50x slower."""
    text = io.StringIO(data.decode("utf-8", errors="replace"), newline="")
    rows = csv.reader(text, delimiter=sep, quoting=csv.QUOTE_MINIMAL if quoted
                      else csv.QUOTE_NONE, strict=False)
    for k, rec in enumerate(rows):
        if len(rec) != fields:
            cut = (" (an empty line)" if not rec else " (a line cut short?)"
                   if len(rec) < fields else "")
            return RowError(path, first_row + k, None, f"{len(rec)} fields where {named_by} "
                                                       f"has {fields}{cut}")
    return None



def json_float_row(src: Source, col: str) -> int | None:
    """The first JSON line whose `col` holds a float (or a list with one), among the rows
    that type the columns: where a column of integer ids became Float64 (an error then
    shows that line, not the first). None: not JSON lines, or none found."""
    if src.format != "jsonl":
        return None
    row = 1
    try:
        with open_file(src.path) as fh:
            for line in itertools.islice(fh, files.JSON_INFER_ROWS):
                if not line.strip():
                    continue
                v = json.loads(line).get(col)
                if isinstance(v, float) or (isinstance(v, list) and
                                            any(isinstance(x, float) for x in v)):
                    return row
                row += 1
    except (ValueError, AttributeError, *GZIP_ERRORS):  # the read reports those
        return None
    return None

