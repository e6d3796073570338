"""Reading a click log: its files (Parquet, CSV/TSV, JSON lines; also .gz) streamed in
chunks (lrm.data.logs.blocks), every column a mapping names checked and parsed
(lrm.data.logs.checks) into one typed frame per chunk (lrm.data.logs.frame): the `Parser`.

Checks, each naming the file, the row and the column of the first bad value (`RowError`, an
exit-2 error): a column missing; a value its role cannot take, a time before 1970
(lrm.data.logs.checks); a CSV/TSV row with more or fewer fields than the header, a JSON
line that does not parse, or whose field holds a value of another kind than the column's (a
number in a text id column too) (lrm.data.logs.culprits). Before any row
(lrm.data.logs.files): a file of another format than its name says, two files of the same
content, a column a header names twice (JSON lines: a key twice in the first line), a .gz
that is not gzip or is cut short. An impression read twice (an overlapping export, a
repeated line) is found where its day is written (lrm.data.logs.cells.first_repeat).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from lrm.config import LogsConfig
from lrm.data.logs.checks import (
    Check, before_epoch, braces, dense, first_bad, hashed, id_list, id_text, label, time_us,
)
from lrm.data.logs.culprits import RowError
from lrm.data.logs.files import Source
from lrm.data.logs.frame import (
    BUCKET, DAY, FILE, ITEM, LABEL, POS, ROW, SEED, SESSION, TEXT, TIME, US_PER_DAY, USER,
    bucket_of, dense_names, item_name,
)


@dataclass
class Parsed:
    """A typed chunk and, per vocabulary, its distinct values: (hash, text, first day)."""

    frame: pl.DataFrame
    values: dict[str, pl.DataFrame]
    label_kind: str  # binary | bool | count


class TextNeeded(Exception):
    """A chunk read with numbers (`chunks`, typed) has a bad row: read it again as text,
    whose checks show the value as it is written."""


class Parser:
    """The checks and parses of one file's columns (built once per file, from its types)."""

    def __init__(self, src: Source, types: dict[str, pl.DataType], cfg: LogsConfig,
                 buckets: int) -> None:
        self.src, self.cfg, self.buckets = src, cfg, buckets
        # a column with no value at all (Parquet's or JSON's null type) is read as text
        # that is all missing: its role's check of a missing value holds (else the
        # wrong-type check, bad where a value is, passed every row)
        types = {c: pl.String() if t == pl.Null else t for c, t in types.items()}
        self.types = types
        self.typed: dict[tuple[Any, ...], Parser] = {}  # of chunks read with numbers
        need = [c for _, c in cfg.roles()]
        self.columns = [ROW, *dict.fromkeys(need)]
        self.checks: list[Check] = []  # row-level checks, in the order errors are reported
        self.out: dict[str, pl.Expr] = {}  # typed column -> its expression
        self.vocab_of: dict[str, str] = {}  # typed column -> the vocabulary it feeds
        self.label_kind = "binary"
        if cfg.label:
            chk, self.label_kind = label(src, cfg.label, types[cfg.label], cfg.label_count)
            self._add(LABEL, chk)
        if cfg.time:
            self._add(TIME, time := time_us(src, cfg.time, types[cfg.time], cfg))
            self.checks.append(before_epoch(time))
        if cfg.user:
            self._add(USER, id_text(src, cfg.user, types[cfg.user], "user", True), cfg.user)
        if cfg.item and not cfg.explode:
            self._add(ITEM, id_text(src, cfg.item, types[cfg.item], "item", True), cfg.item)
        if cfg.session:
            self._add(SESSION, id_text(src, cfg.session, types[cfg.session], "session", True),
                      None)
        for col in [*cfg.categorical, *cfg.item_attributes, *([cfg.vertical] if cfg.vertical
                                                               else [])]:
            self._add(f"c:{col}", id_text(src, col, types[col], "categorical", False), col)
        hist = cfg.history if cfg.history not in ("auto", "none") else ""
        for col in [*cfg.sequence, *([hist] if hist else [])]:
            vocab = item_name(cfg) if col == hist and item_name(cfg) else col
            self._add(f"q:{col}", id_list(src, col, types[col], cfg.item_sep, "sequence"),
                      vocab)
        for col in dense_names(cfg):
            self._add(f"d:{col}", dense(src, col, types[col]))
        self.explode: Check | None = None
        if cfg.explode:
            self.explode = id_list(src, cfg.explode, types[cfg.explode], cfg.item_sep,
                                   "explode")
            self.explode.bad = None  # the entries are checked once split

    def _add(self, name: str, chk: Check, vocab: str | None = None) -> None:
        self.checks.append(chk)
        self.out[name] = chk.value
        if vocab is not None:
            self.vocab_of[name] = vocab

    def parse(self, chunk: pl.DataFrame) -> Parsed:
        """The typed frame of a chunk; a RowError for its first bad row (TextNeeded for a
        chunk read with numbers)."""
        if nulls := [c for c in self.columns[1:] if chunk.schema.get(c) == pl.Null]:
            chunk = chunk.with_columns(pl.col(nulls).cast(pl.String))  # (see __init__)
        if all(chunk.schema.get(c) == self.types.get(c) for c in self.columns[1:]):
            return self._parse(chunk)
        key = tuple(chunk.schema.get(c) for c in self.columns)
        if key not in self.typed:
            self.typed[key] = Parser(self.src, {**self.types, **chunk.schema}, self.cfg,
                                     self.buckets)
        try:
            return self.typed[key]._parse(chunk)
        except RowError:
            raise TextNeeded from None

    def _parse(self, chunk: pl.DataFrame) -> Parsed:
        df = chunk.select(self.columns)
        if self.explode is not None:
            first_bad(self.src, df, self.checks)
            df = self._exploded(df)
        flags = [c.bad.alias(f"_bad{i}") for i, c in enumerate(self.checks)
                 if self.explode is None and c.bad is not None]
        texts = {name: expr for name, expr in self.out.items() if name in self.vocab_of}
        if self.explode is not None and item_name(self.cfg):
            texts[ITEM] = pl.col("_etext")
        pre = {k: e for c in self.checks for k, e in c.pre.items()}
        frame = (df.lazy().with_columns(**pre).select(  # one query: each parse runs once
            pl.lit(self.src.index, pl.Int32).alias(FILE), ROW,
            (pl.col(POS) if POS in df.columns else pl.lit(0, pl.Int32)).alias(POS),
            *[(hashed(e) if not name.startswith("q:") else
               e.list.eval(pl.element().hash(SEED))).alias(name) if name in texts else
              e.alias(name) for name, e in self.out.items()],
            *([LABEL, hashed(pl.col("_etext")).alias(ITEM)] if self.explode is not None
              else []),
            *[e.alias(TEXT + name) for name, e in texts.items()],  # for the vocabularies
            *flags,
        ).with_columns(self._day().alias(DAY)).with_columns(self._bucket().alias(BUCKET))
            .collect())
        if flags:
            if frame.select(pl.any_horizontal(pl.col(r"^_bad\d+$")).any()).item():
                first_bad(self.src, df, self.checks)
            frame = frame.drop(pl.col(r"^_bad\d+$"))
        values = self._values(frame, texts)
        return Parsed(frame.drop([TEXT + n for n in texts]), values, self.label_kind)

    def _exploded(self, df: pl.DataFrame) -> pl.DataFrame:
        """One row per shown item: `_etext` (the item), `_label`, `_pos` (its place)."""
        assert self.explode is not None
        cfg, col = self.cfg, self.cfg.explode
        entries = df.select(self.explode.value.alias("_e"))["_e"]
        lens = entries.list.len().to_numpy()
        df = df.with_columns(entries.alias("_e")).filter(pl.Series(lens > 0))
        lens = lens[lens > 0]
        out = df.explode("_e")
        starts = np.repeat(np.cumsum(lens) - lens, lens)
        pos = (np.arange(out.height, dtype=np.int64) - starts).astype(np.int32)
        sep = "".join("\\" + ch if not ch.isalnum() else ch for ch in cfg.label_sep)
        parts = pl.col("_e").str.extract_groups(f"^(.*){sep}(.*)$")
        out = out.with_columns(pl.Series(POS, pos), parts.struct.field("1").alias("_etext"),
                               parts.struct.field("2").alias("_elabel"))
        lab, self.label_kind = label(self.src, "_elabel", pl.String(), cfg.label_count)
        item = id_text(self.src, "_etext", pl.String(), "item", True)
        checks = [Check(col, pl.col("_e"), pl.col("_etext").is_null(),
                        f"expected ITEM{braces(cfg.label_sep)}LABEL entries, got {{value}}",
                        "_e"),
                  Check(col, pl.col("_e"), item.bad, "missing id in {value}",
                        "_e"),
                  Check(col, pl.col("_e"), lab.bad, "label must be 0 or 1 in {value}"
                        if not cfg.label_count else "a count label must be >= 0 in {value}",
                        "_e")]
        first_bad(self.src, out, checks)
        return out.with_columns(lab.value.alias(LABEL)).drop("_elabel")

    def _day(self) -> pl.Expr:
        mode = self.cfg.days if self.cfg.days != "auto" else ("time" if self.cfg.time
                                                              else "one")
        if mode == "time":
            start = self.cfg.day_start * 3_600_000_000
            return ((pl.col(TIME) - start) // US_PER_DAY).cast(pl.Int32)
        return pl.lit(self.src.index if mode == "file" else 0, pl.Int32)

    def _bucket(self) -> pl.Expr:
        """Which share of the day a row's session is written with: by user (a user's
        sessions and clicks all in one), else by session, else by row."""
        if self.buckets == 1:
            return pl.lit(0, pl.Int32)
        key = (pl.col(USER) if self.cfg.user else pl.col(SESSION).hash(SEED)  # (text)
               if self.cfg.session else pl.col(ROW).cast(pl.UInt64).hash(SEED))
        return bucket_of(key, self.buckets)

    def _values(self, frame: pl.DataFrame, texts: dict[str, pl.Expr]
                ) -> dict[str, pl.DataFrame]:
        """Per vocabulary: its distinct values in this chunk, (h, s, day) with the first day
        (one query per vocabulary, run together)."""
        vocab_of = {**self.vocab_of, **({ITEM: item_name(self.cfg)} if ITEM in texts and
                                        ITEM not in self.vocab_of else {})}
        # a chunk in day order (a log in time order: most are): a value's first row holds
        # its first day, and the rows where a value is first are found without a group-by
        # (a third of its time)
        days = frame[DAY].to_numpy()
        in_order = bool((days[1:] >= days[:-1]).all())
        parts: dict[str, list[pl.LazyFrame]] = {}
        for name in texts:
            piece = frame.lazy().select(pl.col(name).alias("h"), pl.col(TEXT + name).alias("s"),
                                        pl.col(DAY).alias("day"))
            if name.startswith("q:"):
                piece = piece.explode(["h", "s"])
            piece = piece.drop_nulls("h")
            if in_order:
                piece = piece.filter(pl.col("h").is_first_distinct())
            parts.setdefault(vocab_of[name], []).append(piece)
        queries = [_distinct(ps, in_order) for ps in parts.values()]
        # (the rows where a value is first hold views into the chunk's text, which keep all
        # of it alive, +70 MB at 10M rows: shrunk, each holds its own)
        got = [df.shrink_to_fit() if in_order else df for df in pl.collect_all(queries)]
        return dict(zip(parts, got, strict=True))


def _distinct(pieces: list[pl.LazyFrame], first_rows: bool) -> pl.LazyFrame:
    """(h, s, day) rows -> each h once, with its text and its least day (`first_rows`: each
    piece holds each h once already, at its least day; where a vocabulary has two columns,
    `vocab.Values` merges their rows)."""
    if first_rows:
        return pl.concat(pieces)
    return pl.concat(pieces).group_by("h").agg(pl.col("s").first(), pl.col("day").min())
