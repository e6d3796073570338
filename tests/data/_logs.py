"""Small click logs for the ingest tests, and reading an ingest's output back."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import polars as pl

from lrm.config import LogsConfig
from lrm.data.logs.ingest import ingest
from lrm.data.schema import day_files

T0 = 1_573_257_600  # 2019-11-09 00:00:00 UTC, in seconds
MIN = 60


def frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    return pl.DataFrame(rows)


def write(df: pl.DataFrame, path: Path) -> Path:
    """`df` in the format of `path`'s suffix (.parquet, .csv, .tsv, .jsonl; .gz compresses)."""
    name = path.name.removesuffix(".gz")
    if name.endswith(".parquet"):
        df.write_parquet(path)
        return path
    if name.endswith(".jsonl"):
        text = df.write_ndjson()
    else:
        tsv = name.endswith(".tsv")  # TSV: no quoting (a quote is a character)
        text = df.write_csv(separator="\t" if tsv else ",",
                            quote_style="never" if tsv else "necessary")
    data = text.encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def run(files: list[Path], out: Path, **mapping: Any) -> tuple[dict[str, Any], pl.DataFrame]:
    """Ingest with `mapping` (LogsConfig keys; chunk_rows and max_history too); the metrics
    and every written row (days in order, files in order)."""
    opts = {k: mapping.pop(k) for k in ("chunk_rows", "max_history", "prior") if k in mapping}
    m = ingest(files, out, LogsConfig(**mapping), **opts)
    return m, read_rows(out)


def read_rows(out: Path) -> pl.DataFrame:
    return pl.concat([pl.read_parquet(f) for fs in day_files(out).values() for f in fs])


def clicks_log() -> pl.DataFrame:
    """Two users over two days; times in seconds. u1: a session of three impressions at
    T0+0..2m (clicks a, c), one at T0+60m (clicks b; its first impression too), one on the
    next day; u2: one session."""
    r = []

    def imp(user: str, t: int, item: str, click: int, cat: str = "x") -> None:
        r.append({"user": user, "ts": t, "item": item, "clicked": click, "cat": cat})

    imp("u1", T0 + 0 * MIN, "a", 1)
    imp("u1", T0 + 1 * MIN, "b", 0)
    imp("u1", T0 + 2 * MIN, "c", 1)
    imp("u2", T0 + 3 * MIN, "a", 0, "y")
    imp("u1", T0 + 60 * MIN, "d", 1)  # a new session (gap 58m > 30m), clicked at its start
    imp("u1", T0 + 61 * MIN, "b", 1)
    imp("u1", T0 + 24 * 60 * MIN + 5 * MIN, "e", 0)  # day 1
    return frame(r)
