"""The typed frame: what `lrm.data.logs.read.Parser` makes of a chunk of a log (the rest of
lrm.data.logs works on it, never on the raw columns), and the names it gives features.

* ``_file``, ``_row``: the input file's index and the 1-based data row (the header is not a
  row); ``_pos``: the impression's place in its page view (``explode``), else 0;
* ``_label`` int8 (0/1), ``_time`` int64 microseconds since the epoch (UTC), when mapped;
* ``_user``, ``_item``, ``_session`` and ``c:NAME`` (categorical, item attributes, vertical):
  the ids' 64-bit hashes (uint64, of their text: an integer id and its text in a CSV are the
  same id); ``q:NAME``: lists of them (sequences, a history column); ``d:NAME``: float64;
* ``_day`` (int32, the row's day) and ``_bucket`` (int32, the share of the day it is
  written with: `bucket_of`).

Each id's text is also returned per vocabulary (`read.Parsed.values`), so that
lrm.data.logs.vocab can give every distinct value its dense id; the hash only carries the
value from here to the day that is written (polars' hash is stable within a polars version,
and nothing stores it).
"""

from __future__ import annotations

import polars as pl

from lrm.config import LogsConfig

SEED = 0x1A2B  # the hash seed (any fixed value: the hashes never leave one run)
ROW, FILE, POS = "_row", "_file", "_pos"
LABEL, TIME, USER, ITEM, SESSION = "_label", "_time", "_user", "_item", "_session"
US_PER_DAY = 86_400_000_000
DAY = "_day"
BUCKET = "_bucket"
TEXT = "s:"  # + a typed column: its values' text, in the parse only (for the vocabularies)


def item_name(cfg: LogsConfig) -> str:
    """The item feature's name: the item column, or with explode `item` unless named."""
    return cfg.item or ("item" if cfg.explode else "")


def history_name(cfg: LogsConfig) -> str:
    """The history feature's name: the history column, `history` for auto, "" for none."""
    if cfg.history == "none":
        return ""
    return "history" if cfg.history == "auto" else cfg.history


def dense_names(cfg: LogsConfig) -> list[str]:
    """The dense features, in their order: the per-impression numbers, then the item's."""
    return [*cfg.dense, *cfg.item_dense]


def bucket_of(key: pl.Expr, buckets: int) -> pl.Expr:
    """The bucket of a hashed key (a user's, for her sessions and clicks alike)."""
    return (key % buckets).cast(pl.Int32)

