"""The checks and parses of a log's columns, one per role: a `Check` holds the column's
parsed value, where it is bad and what is wrong there (the message shows the value as
written); `first_bad` raises the `RowError` of the earliest bad row.

What is bad: a column of a type its role cannot take (ids must be text or integers, a dense
value a number, ...); a label that is not 0/1 (or a boolean, or with ``label_count`` a
count); a time that does not parse; a dense value that is not finite. A raw id is an opaque
token (`id_text`): `-124` or `NA` is a category, not an error. A null dense value is
missing (its feature reads 0); a null categorical is a missing id; a null label, user,
item, session or time is an error, and so is an empty user, item or session id. A column
with no value at all is a column of missing values.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from lrm.config import LogsConfig
from lrm.data.logs.culprits import RowError, json_float_row
from lrm.data.logs.files import Source
from lrm.data.logs.frame import ROW, SEED

_ISO = ("%Y-%m-%d %H:%M:%S%.f%#z", "%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%d %H:%M%#z",
        "%Y-%m-%d %H:%M", "%Y-%m-%d")
UNIT_US = {"s": 1_000_000, "ms": 1_000, "us": 1}  # microseconds in a unit of --time-unit


def iso_time(us: int) -> str:
    """Microseconds since the epoch as UTC text, e.g. 2019-11-09 10:00:00. (numpy, not
    datetime: a time in the wrong unit reaches the year 51824, past datetime's 9999.)"""
    return str(np.datetime64(int(us), "us").astype("datetime64[s]")).replace("T", " ")



@dataclass
class Check:
    """A parsed column: its value, where it is bad, and what is wrong there."""

    column: str  # the source column named in an error
    value: pl.Expr
    bad: pl.Expr | None  # True where the row's value is bad
    why: str  # the message, with {value} for the raw value (other braces doubled: braces)
    shown: str = ""  # the column whose value the message shows ("": `column`)
    # columns `value` and `bad` both read, computed first (a parse shared, never run twice)
    pre: dict[str, pl.Expr] = field(default_factory=dict)
    hint: Callable[[Any], str] | None = None  # more to say, from the raw value


def _text_float(s: pl.Series) -> pl.Series:
    """Text as float64 (surrounding blanks ignored; null where it is not a number). polars'
    cast takes no blanks and stripping every value costs 4x the cast: only a chunk that has
    values the plain cast misses is stripped (where it succeeds the two agree)."""
    x = s.cast(pl.Float64, strict=False)
    if x.null_count() > s.null_count():
        x = s.str.strip_chars().cast(pl.Float64, strict=False)
    return x


def text_float(col: str) -> pl.Expr:
    return pl.col(col).map_batches(_text_float, return_dtype=pl.Float64)


def braces(text: object) -> str:
    """`text` as a literal in a `Check.why` template (a struct's type text has braces)."""
    return str(text).replace("{", "{{").replace("}", "}}")


def _wrong_type(col: str, dtype: pl.DataType, role: str, want: str,
                value: pl.DataType, at: int | None = None, hint: str = "") -> Check:
    """A column whose type its role cannot take: bad at its first value (or at row `at`,
    the row that gave it the type)."""
    bad = pl.col(col).is_not_null()
    if at is not None:
        bad = bad & (pl.col(ROW) >= at)
    return Check(col, pl.lit(None, value), bad, f"a {role} column must hold {braces(want)}, "
                                                f"this one holds {braces(dtype)}: {{value}}"
                                                + braces(hint))


# a column of numbers where ids are expected: what the user may have meant
_NUMBER_HINT = (" (a measure, not an id? --dense reads a number per impression, "
                "--item-dense one of the item's)")



def _is_int(dt: pl.DataType) -> bool:
    return dt.is_integer()


def id_text(src: Source, col: str, dtype: pl.DataType, role: str,
            required: bool) -> Check:
    """An id column as text, the vocabulary's key. A raw id is an opaque token: `-1`,
    `-124`, `NA` and `0.5` are values like any other (an export's "unknown" is a category
    of its own); only lrm's own dense ids, in its Parquet layouts, have a sign rule
    (lrm.data.values). A required id (user, item, session) must not be missing or empty."""
    c = pl.col(col)
    empty = pl.lit(False)
    if dtype == pl.String:
        value = c
        empty = c.str.len_bytes() == 0  # "" (JSON, Parquet, an exploded "-1"): missing too
    elif _is_int(dtype):
        value = c.cast(pl.String)
    else:
        at = json_float_row(src, col) if dtype.is_float() else None
        return _wrong_type(col, dtype, role, "ids (text or integers)", pl.String, at,
                           _NUMBER_HINT if dtype.is_numeric() else "")
    if not required:
        return Check(col, value, None, "")
    return Check(col, value, c.is_null() | empty, "missing id: {value}")


def id_list(src: Source, col: str, dtype: pl.DataType, sep: str, role: str) -> Check:
    """A list column of ids, or a delimited string of them, as a list of text (null: []);
    its ids are tokens as `id_text`'s are."""
    c = pl.col(col)
    if dtype == pl.String:
        items = c.str.split(sep).list.eval(pl.element().filter(pl.element() != ""))
    elif isinstance(dtype, pl.List) and (dtype.inner == pl.String or _is_int(dtype.inner)):
        items = c.list.eval(pl.element().cast(pl.String))
    else:
        at = (json_float_row(src, col) if isinstance(dtype, pl.List) and
              dtype.inner.is_float() else None)
        return _wrong_type(col, dtype, role, f"lists of ids (or ids joined by {sep!r})",
                           pl.List(pl.String), at)
    return Check(col, items.fill_null(pl.lit([], dtype=pl.List(pl.String))), None, "")


_COUNT = " (a count of clicks? --label-count reads a count > 0 as 1)"
_LABEL_TEXT = {**{k: 1 for k in ("1", "1.0", "true", "True", "TRUE")},
               **{k: 0 for k in ("0", "0.0", "false", "False", "FALSE")}}


def _label_text(s: pl.Series) -> pl.Series:
    """A text label as 0/1 int8 (null where it is none of `_LABEL_TEXT`)."""
    one = s == "1"
    if (one | (s == "0")).all():  # nulls too: they stay null
        return one.cast(pl.Int8)
    x = s.replace_strict(_LABEL_TEXT, default=None, return_dtype=pl.Int8)
    if x.null_count() > s.null_count():  # blanks around a value (` 1`, as a time or a dense
        # value may have them): only a chunk that has one is stripped
        x = s.str.strip_chars().replace_strict(_LABEL_TEXT, default=None, return_dtype=pl.Int8)
    return x


def label(src: Source, col: str, dtype: pl.DataType, count: bool) -> tuple[Check, str]:
    """The label as 0/1 int8, and how it was mapped: binary | bool | count."""
    c = pl.col(col)
    if dtype == pl.Boolean:
        return Check(col, c.cast(pl.Int8), c.is_null(), "missing label"), "bool"
    if dtype.is_numeric():
        x = c.cast(pl.Float64)
        if count:
            bad = (x < 0) | (x != x.floor()) | ~x.is_finite()
            return Check(col, (x > 0).cast(pl.Int8), bad.fill_null(True),
                         "a count label must be an integer >= 0, got {value}"), "count"
        return Check(col, x.cast(pl.Int8, strict=False), ~x.is_in([0.0, 1.0]).fill_null(False)
                     | x.is_null(), "label must be 0 or 1, got {value}" + _COUNT), "binary"
    if dtype != pl.String:
        return _wrong_type(col, dtype, "label", "0/1, booleans or counts", pl.Int8), \
            "binary"
    # one hash lookup per row (a chain of comparisons on the text costs 10x more); a chunk
    # of 0s and 1s only needs one comparison
    t = c.map_batches(_label_text, return_dtype=pl.Int8)
    if count:
        n = c.str.strip_chars().str.to_integer(strict=False)
        v = pl.coalesce((n > 0).cast(pl.Int8), t)
        return Check(col, v, v.is_null() | (n < 0).fill_null(False),
                     "a count label must be an integer >= 0 (or true/false), got {value}"), \
            "count"
    return Check(col, t, t.is_null(), "label must be 0 or 1 (or true/false), got {value}"
                 + _COUNT), "binary"


def time_us(src: Source, col: str, dtype: pl.DataType, cfg: LogsConfig) -> Check:
    """The time as int64 microseconds since the epoch, UTC."""
    c = pl.col(col)
    if isinstance(dtype, pl.Datetime):
        t = c.dt.convert_time_zone("UTC") if dtype.time_zone else c
        return Check(col, t.dt.epoch("us"), c.is_null(), "missing time")
    if dtype == pl.Date:
        return Check(col, c.cast(pl.Datetime("us")).dt.epoch("us"), c.is_null(),
                     "missing time")
    if dtype.is_numeric():
        if cfg.time_unit == "iso" or cfg.time_format:
            return _wrong_type(col, dtype, "time", "text (the time is read with "
                               "--time-unit iso or --time-format)", pl.Int64)
        x = c.cast(pl.Float64) * UNIT_US[cfg.time_unit]
        return Check(col, x.round().cast(pl.Int64, strict=False), _bad_time(x),
                     _TIME_WHY.format(unit=cfg.time_unit))
    if dtype != pl.String:
        return _wrong_type(col, dtype, "time", "numbers, text or timestamps", pl.Int64)
    if cfg.time_format:
        parsed = c.str.strptime(pl.Datetime("us", "UTC"), cfg.time_format, strict=False)
    elif cfg.time_unit == "iso":
        # Z, or UTC as BigQuery's exports write it ('2019-11-09 10:00:00 UTC')
        norm = c.str.strip_chars().str.replace(r"\s*(?:[Zz]|UTC|GMT)$", "+00:00").str.replace(
            "T", " ", literal=True)
        parsed = pl.coalesce([norm.str.strptime(pl.Datetime("us", "UTC"), f, strict=False)
                              for f in _ISO])
    else:
        name = f"_x:{col}"
        x = pl.col(name)
        return Check(col, x.round().cast(pl.Int64, strict=False), _bad_time(x),
                     _TIME_WHY.format(unit=cfg.time_unit),
                     pre={name: text_float(col) * UNIT_US[cfg.time_unit]}, hint=_time_text)
    return Check(col, parsed.dt.epoch("us"), parsed.is_null(), "time does not parse: {value}")


def _time_text(raw: Any) -> str:
    """A text time where a number was expected: the option that reads it."""
    if isinstance(raw, str) and re.match(r"\s*\d{4}-\d\d-\d\d", raw):
        return " (ISO 8601 text: give --time-unit iso)"
    if isinstance(raw, str) and re.search(r"\d[/:.]\d", raw) and re.search(r"[/:]", raw):
        return " (text: give its --time-format, e.g. '%m/%d/%Y %I:%M:%S %p')"
    return ""


def before_epoch(time: Check) -> Check:
    """A time before 1970: no log's (a negative number since the epoch made a day of its
    own, which trained)."""
    return Check(time.column, time.value, (time.value < 0).fill_null(False),
                 "time before 1970 (UTC): {value}", pre=time.pre)


# a number of --time-unit units: in microseconds it must fit an int64 (nanoseconds read as
# seconds do not, and became nulls that crashed the day cut)
_MAX_US = 2.0 ** 62
_TIME_WHY = "time does not parse as a number of {unit} since 1970 (UTC): {{value}}"


def _bad_time(us: pl.Expr) -> pl.Expr:
    return (~us.is_finite() | (us.abs() > _MAX_US)).fill_null(True)


def dense(src: Source, col: str, dtype: pl.DataType) -> Check:
    """A dense value as float64 (null: missing); text that is not a number, and values that
    are not finite, are bad."""
    c = pl.col(col)
    if dtype.is_numeric():
        x = c.cast(pl.Float64)
        return Check(col, x, (~x.is_finite()).fill_null(False),
                     "dense value is not finite: {value}")
    if dtype != pl.String:
        return _wrong_type(col, dtype, "dense", "numbers", pl.Float64)
    name = f"_x:{col}"
    x = pl.col(name)
    bad = (c.is_not_null() & x.is_null()) | ~x.is_finite().fill_null(True)
    return Check(col, x, bad, "dense value is not a finite number: {value}",
                 pre={name: text_float(col)})


def hashed(text: pl.Expr) -> pl.Expr:
    """The 64-bit hash of an id's text; null stays null."""
    return pl.when(text.is_not_null()).then(text.hash(SEED))


def _names_itself(df: pl.DataFrame, cols: Sequence[str], at: int) -> bool:
    """Whether row `at` holds each column's name (a header line where a row should be: its
    first bad value alone would read as a label 'clicked' or a time 'ts')."""
    return bool(cols) and all(df.schema[c] == pl.String and df[c][at] == c for c in cols)


def first_bad(src: Source, df: pl.DataFrame, checks: Sequence[Check]) -> None:
    """Raise the RowError of the first bad row (the earliest check at that row)."""
    flags = [c for c in checks if c.bad is not None]
    if not flags:
        return
    read = [c for c in df.columns if c != ROW]  # (before the checks' own columns)
    pre = {k: e for c in flags for k, e in c.pre.items() if k not in df.columns}
    if pre:
        df = df.with_columns(**pre)
    bad = df.select([c.bad.alias(f"_b{i}")  # type: ignore[union-attr]
                     for i, c in enumerate(flags)])
    rows = df[ROW].to_numpy()
    best: tuple[int, int] | None = None
    for i in range(len(flags)):
        b = bad[f"_b{i}"].to_numpy()
        if b.any():
            at = int(np.argmax(b))
            if best is None or rows[at] < rows[best[1]]:
                best = (i, at)
    if best is None:
        return
    i, at = best
    if src.format in ("csv", "tsv") and _names_itself(df, read, at):
        raise RowError(src.path, int(rows[at]), None,
                       "the header line again, among the rows (files joined with their "
                       "headers? give them apart)")
    raw: Any = df[flags[i].shown or flags[i].column][at]
    if isinstance(raw, pl.Series):
        raw = raw.to_list()
    shown = repr(raw) if raw is not None else "missing"
    if isinstance(raw, str) and len(raw) > 40:
        shown = repr(raw[:40] + "...")
    hint = flags[i].hint(raw) if flags[i].hint is not None else ""
    raise RowError(src.path, int(rows[at]), flags[i].column,
                   flags[i].why.format(value=shown) + hint)

