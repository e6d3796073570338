"""Vocabularies: every distinct raw id (a string such as ``N123`` or ``U456``, an integer, a
64-bit hash) of a feature gets a dense id 0, 1, 2, ..., so the feature's table has exactly as
many rows as it has values (`FeatureSchema.vocab`) and no two values share a row.

Why not hash ids into the table as Criteo's are (`TableConfig.hash_size`, `fit_tables`):
`id mod rows` at rows = the distinct count puts 63% of the ids on a row another id also uses
(1 - 1/e). A vocabulary costs what the table costs anyway (a row per value) and makes none.

A value's id is fixed on the first day it appears, and a vocabulary only grows: ids are given
in order of (first day, value), so day d's ids never depend on later days, and ingesting the
days one at a time (the stream) gives the same ids as ingesting them together. A vocabulary is
stored with the dataset (``_ingest/vocab/NAME.parquet``: value, first day; the id is the row)
and a later ingest that continues it (`prior`) keeps every id and appends the new values.

Values are carried from the read to the write as 64-bit hashes of their text (lrm.data.logs.
frame); `Lookup` maps a hash to its id by binary search. Two distinct values with the same hash
would share an id (at a million values the chance is about 3e-8).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from lrm import io
from lrm.data.logs.frame import SEED

SMALL = 256  # a lookup this small: a binary search per value is as fast


def _merge(frames: Iterable[pl.DataFrame]) -> pl.DataFrame:
    """(h, s, day) frames -> distinct h, its text and its first day."""
    return pl.concat(list(frames)).group_by("h").agg(pl.col("s").first(), pl.col("day").min())


@dataclass
class Values:
    """The distinct values of one vocabulary seen so far, merged as they come (a merge runs
    once the pending pieces outweigh what is merged, so the work stays linear)."""

    merged: pl.DataFrame | None = None
    pending: list[pl.DataFrame] = field(default_factory=list)
    pending_rows: int = 0

    def add(self, piece: pl.DataFrame) -> None:
        self.pending.append(piece)
        self.pending_rows += piece.height
        if self.pending_rows > max(100_000, self.merged.height if self.merged is not None
                                   else 0):
            self.flush()

    def flush(self) -> pl.DataFrame:
        if self.pending:
            self.merged = _merge(([self.merged] if self.merged is not None else [])
                                 + self.pending)
            self.pending, self.pending_rows = [], 0
        if self.merged is None:
            self.merged = pl.DataFrame(schema={"h": pl.UInt64, "s": pl.String,
                                               "day": pl.Int32})
        return self.merged


def assign(seen: pl.DataFrame, prior: pl.DataFrame | None, day_offset: int) -> pl.DataFrame:
    """The vocabulary (value `s`, first `day`; the id is the row): `prior`'s rows as they
    are, then the values of `seen` it lacks in order of (first day, value). Days in `seen`
    are shifted by `day_offset` (the data's days as the dataset numbers them)."""
    seen = seen.select("s", (pl.col("day") - day_offset).cast(pl.Int32).alias("day"))
    if prior is not None:
        seen = seen.join(prior.select("s"), on="s", how="anti")
    new = seen.sort(["day", "s"])
    return new if prior is None else pl.concat([prior.select("s", "day"), new])


class Lookup:
    """hash of a value's text -> its id, for one vocabulary."""

    def __init__(self, vocab: pl.DataFrame) -> None:
        h = vocab["s"].hash(SEED)
        # for a hash map of the whole vocabulary (not where two values share a hash: the
        # map takes each key once; the search gives them one id)
        self.keys = h if h.n_unique() == len(h) else None
        self.row_ids = pl.Series(np.arange(len(h), dtype=np.int64))
        h = h.to_numpy()
        order = np.argsort(h, kind="stable")
        self.hashes = h[order]
        self.ids = order.astype(np.int64)
        self.size = vocab.height

    def __call__(self, h: np.ndarray) -> np.ndarray:
        """ids of hashes `h` (every one must be in the vocabulary)."""
        if self.size == 0:
            return np.zeros(len(h), np.int64)
        if len(h) <= SMALL:
            return self._search(h)
        # a binary search per value misses the cache on a large vocabulary: map the values
        # by a hash lookup, of the vocabulary where it is no larger than them (half the
        # time of a search per value, even at 12 values), else of their distinct values
        # (each searched once)
        s = pl.Series(h)
        if self.keys is not None and self.size <= len(h):
            keys, ids = self.keys, self.row_ids
        else:
            keys = s.unique()
            ids = pl.Series(self._search(keys.to_numpy()))
        try:
            return s.replace_strict(keys, ids).to_numpy()
        except pl.exceptions.InvalidOperationError:
            raise KeyError("a value is missing from its vocabulary") from None

    def expr(self, column: str, rows: int) -> pl.Expr | None:
        """The ids of a column of `rows` hashes as an expression (run in one query with
        others), where `__call__` would map them by a hash lookup of the whole vocabulary;
        None: call it. A value missing from the vocabulary fails the query."""
        if self.keys is None or not SMALL < rows or not 0 < self.size <= rows:
            return None
        return pl.col(column).replace_strict(self.keys, self.row_ids)

    def _search(self, h: np.ndarray) -> np.ndarray:
        at = np.searchsorted(self.hashes, h).clip(0, self.size - 1)
        if not np.array_equal(self.hashes[at], h):
            raise KeyError("a value is missing from its vocabulary")
        return self.ids[at]


def save(vocabs: dict[str, pl.DataFrame], folder: Path) -> None:
    for name, v in vocabs.items():
        io.write_parquet(v.to_arrow(), Path(folder) / f"{name}.parquet")


def load(folder: Path, names: Iterable[str]) -> dict[str, pl.DataFrame]:
    return {n: pl.read_parquet(Path(folder) / f"{n}.parquet") for n in names}
