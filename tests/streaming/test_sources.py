"""The stream's sources: the synthetic world's days, and files dropped in an inbox (Parquet
with the lrm schema, Criteo TSV), each the next day, by content; one schema per stream."""

from __future__ import annotations

import dataclasses
import gzip
import os
import time

import polars as pl
import pyarrow.parquet as pq
import pytest

from lrm import io
from lrm.config import GenerateConfig, IngestConfig, LogsConfig
from lrm.data import synthetic
from lrm.data.schema import DAY, read_schema
from lrm.errors import DataError
from lrm.streaming import sources
from tests.data._logs import MIN, T0, clicks_log, write
from tests.data.test_criteo import random_lines

WORLD = GenerateConfig(users=500, ads=100, advertisers=10, categories=4, sessions_per_day=20,
                       max_history=5)


def test_synthetic_days_are_made_once_and_the_same_every_time(tmp_path):
    a = sources.synthetic_day(WORLD, 4, tmp_path / "a")
    b = sources.synthetic_day(WORLD, 4, tmp_path / "b")
    assert a["files"] == b["files"] and a["origin"] == {"source": "synthetic", "seed": 0}
    mtime = (tmp_path / "a" / "day=4" / "part-00000.parquet").stat().st_mtime_ns
    assert sources.synthetic_day(WORLD, 4, tmp_path / "a") == a  # read back, not made again
    assert (tmp_path / "a" / "day=4" / "part-00000.parquet").stat().st_mtime_ns == mtime
    assert sources.raw_days(tmp_path / "a") == [4]


def test_inbox_files_become_days_by_content_and_keep_one_schema(tmp_path):
    inbox, raw = tmp_path / "inbox", tmp_path / "raw"
    inbox.mkdir()
    (inbox / "a.tsv").write_text("\n".join(random_lines(30)) + "\n")
    (inbox / "b.tsv").write_text("\n".join(random_lines(20, seed=1)) + "\n")
    assert sources.folder_days(inbox, raw, IngestConfig(), settle=0) == [0, 1]
    t = pq.read_table(raw / "day=1" / "part-00000.parquet")
    assert t.num_rows == 20 and set(t.column(DAY).to_pylist()) == {1}  # renumbered
    assert read_schema(raw / "day=1" / "part-00000.parquet")[0].name == "criteo"
    assert sources.read_source(raw, 1)["origin"]["file"] == "b.tsv"
    (inbox / "c-same-as-a.tsv").write_bytes((inbox / "a.tsv").read_bytes())
    assert sources.folder_days(inbox, raw, IngestConfig(), settle=0) == []  # the same content: no day
    pq.write_table(synthetic.generate_day(WORLD, 0), inbox / "d.parquet")
    with pytest.raises(DataError, match="d.parquet: its features differ"):
        sources.folder_days(inbox, raw, IngestConfig(), settle=0)
    assert sources.raw_days(raw) == [0, 1]  # nothing half-written


def test_inbox_logs_go_through_the_mapping_each_day_continuing_the_last(tmp_path):
    """Planted bugs that turn this red (each tried): a log day started without the day
    before's state (ids restart, histories forget), the session ids left at day 0's."""
    inbox, raw = tmp_path / "inbox", tmp_path / "raw"
    inbox.mkdir()
    log = clicks_log()
    write(log.filter(pl.col("ts") < T0 + 86_400), inbox / "a.csv")
    write(log.filter(pl.col("ts") >= T0 + 86_400), inbox / "b.jsonl.gz")
    (inbox / "notes.md").write_text("not a log")
    ingest = dataclasses.replace(IngestConfig(), logs=LogsConfig(
        label="clicked", user="user", item="item", time="ts", session_gap="30m"))
    assert sources.folder_days(inbox, raw, ingest, settle=0) == [0, 1]
    d0, d1 = (pl.read_parquet(raw / f"day={d}" / "part-00000.parquet") for d in (0, 1))
    assert d1["day"].to_list() == [1] and d1["user"].to_list() == [0]  # u1 keeps her id
    assert d1["history"].to_list() == [[1, 3, 2, 0]]  # day 0's clicks, newest first
    assert (d1["session_id"] // 2**40).to_list() == [1] and (d0["session_id"] // 2**40).max() == 0
    schema, _ = read_schema(raw / "day=1" / "part-00000.parquet")
    assert schema.vocab == {} and schema.user_key == "user"  # hashed in the stream's tables
    assert (raw / "day=1" / "_ingest" / "state.json").is_file()
    assert sources.folder_days(inbox, raw, ingest, settle=0) == []  # nothing new


def test_an_inbox_log_that_does_not_come_after_the_days_before_is_no_day(tmp_path):
    """An earlier export (day 0's rows, but its last) and a log of times before the day
    before's are exit 2 naming the file, its first row and the time column, and no day:
    their sessions would take the later days' clicks as their history. Red with the check
    dropped (each became day 2, promoted on in the stream)."""
    inbox, raw = tmp_path / "inbox", tmp_path / "raw"
    inbox.mkdir()
    log = clicks_log()
    write(log.filter(pl.col("ts") < T0 + 86_400), inbox / "a.csv")
    write(log.filter(pl.col("ts") >= T0 + 86_400), inbox / "b.csv")
    ingest = dataclasses.replace(IngestConfig(), logs=LogsConfig(
        label="clicked", user="user", item="item", time="ts", session_gap="30m"))
    assert sources.folder_days(inbox, raw, ingest, settle=0) == [0, 1]
    write(log.filter(pl.col("ts") < T0 + 86_400).head(5), inbox / "c.csv.gz")
    with pytest.raises(DataError, match=r"c\.csv\.gz, row 1, column ts: time 2019-11-09 "
                                        r"00:00:00 precedes 2019-11-10 00:05:00"):
        sources.folder_days(inbox, raw, ingest, settle=0)
    assert sources.raw_days(raw) == [0, 1]  # nothing half-written
    (inbox / "c.csv.gz").unlink()
    late = log.filter(pl.col("ts") >= T0 + 86_400).with_columns(
        pl.Series("ts", [T0 + 24 * 60 * MIN]))  # before day 1's last time
    write(pl.concat([late.with_columns(pl.Series("ts", [T0 + 2 * 86_400])), late]),
          inbox / "d.csv")
    with pytest.raises(DataError, match=r"d\.csv, row 2, column ts: time 2019-11-10 00:00:00"):
        sources.folder_days(inbox, raw, ingest, settle=0)
    write(late.with_columns(pl.Series("ts", [T0 + 2 * 86_400])), inbox / "d.csv")
    assert sources.folder_days(inbox, raw, ingest, settle=0) == [2]  # after them: the next day


def test_a_compressed_copy_of_a_day_s_file_is_that_day_without_a_time_to_tell(tmp_path):
    """A log mapped without a time (one file, one day) cannot be told by its times: a gzip
    copy of a day's file, or the plain copy of a gzipped one, is found by the decompressed
    content. Red with the bytes alone compared (each became a day, the models promoted
    on a day they had seen)."""
    inbox, raw = tmp_path / "inbox", tmp_path / "raw"
    inbox.mkdir()
    log = clicks_log().with_columns(sess=pl.col("ts") // 3600)
    write(log.head(4), inbox / "a.csv")
    write(log.tail(3), inbox / "b.csv.gz")
    ingest = dataclasses.replace(IngestConfig(), logs=LogsConfig(
        label="clicked", user="user", item="item", session="sess"))
    assert sources.folder_days(inbox, raw, ingest, settle=0) == [0, 1]
    (inbox / "c.csv.gz").write_bytes(gzip.compress((inbox / "a.csv").read_bytes(), 1))
    (inbox / "d.csv").write_bytes(gzip.decompress((inbox / "b.csv.gz").read_bytes()))
    assert sources.folder_days(inbox, raw, ingest, settle=0) == []
    assert sources.read_source(raw, 1)["origin"]["content_sha256"] == \
        io.read_sha256(inbox / "d.csv")
    write(log.tail(2), inbox / "e.csv.gz")  # other content: the next day
    assert sources.folder_days(inbox, raw, ingest, settle=0) == [2]


def test_inbox_files_become_days_with_their_numbers_read_as_numbers(tmp_path):
    """day2.tsv before day10.tsv (plain sorting puts day10 first: a day out of order). Red
    with the inbox sorted as text."""
    inbox, raw = tmp_path / "inbox", tmp_path / "raw"
    inbox.mkdir()
    (inbox / "day10.tsv").write_text("\n".join(random_lines(10, seed=10)) + "\n")
    (inbox / "day2.tsv").write_text("\n".join(random_lines(20, seed=2)) + "\n")
    assert sources.folder_days(inbox, raw, IngestConfig(), settle=0) == [0, 1]
    assert [sources.read_source(raw, d)["origin"]["file"] for d in (0, 1)] == [
        "day2.tsv", "day10.tsv"]


LOG_INGEST = dataclasses.replace(IngestConfig(), logs=LogsConfig(
    label="clicked", user="user", item="item", time="ts", session_gap="30m"))


def _log_days(days: int, per_day: int = 4) -> list[pl.DataFrame]:
    """`days` days of a click log, `per_day` impressions each, every day after the last."""
    return [pl.DataFrame([{"user": f"u{i % 2}", "ts": T0 + d * 86_400 + i * MIN,
                           "item": "abcde"[(d + i) % 5], "clicked": (d + i) % 2}
                          for i in range(per_day)]) for d in range(days)]


def _settled(*paths, ago=3600):
    """Files last written `ago` seconds back (dropped in the inbox a while ago)."""
    t = time.time() - ago
    for p in paths:
        os.utime(p, (t, t))


def _rows(raw, day):
    return pq.read_metadata(raw / f"day={day}" / "part-00000.parquet").num_rows


def test_a_file_still_being_written_waits_and_becomes_its_day_whole(tmp_path):
    """The issue-45 probe: day2.csv half written when the stream ran was taken as the whole
    day (half of it trained on and promoted), and every run after the writer finished failed.
    A file changed within streaming.settle seconds waits, and the files after it too. Red with
    the settle check dropped (the half file was day 1, the next file day 2)."""
    inbox, raw = tmp_path / "inbox", tmp_path / "raw"
    inbox.mkdir()
    d0, d1, d2 = _log_days(3)
    _settled(write(d0, inbox / "day0.csv"))
    write(d1.head(2), inbox / "day1.csv")  # the writer is at row 2 of 4
    _settled(write(d2, inbox / "day2.csv"))  # settled, but after the one being written
    assert sources.folder_days(inbox, raw, LOG_INGEST, settle=60) == [0]
    assert sources.raw_days(raw) == [0]
    write(d1, inbox / "day1.csv")  # whole now, just written
    assert sources.folder_days(inbox, raw, LOG_INGEST, settle=60) == []
    _settled(inbox / "day1.csv", ago=61)
    assert sources.folder_days(inbox, raw, LOG_INGEST, settle=60) == [1, 2]
    assert [_rows(raw, d) for d in (0, 1, 2)] == [4, 4, 4]
    assert sources.read_source(raw, 1)["origin"]["file"] == "day1.csv"


def test_a_file_changed_while_it_is_read_is_not_taken(tmp_path, monkeypatch):
    """Appended to between its hash and its read: not the day (its hash would name other
    bytes); taken whole by a later run. Red with the check after the read dropped."""
    inbox, raw = tmp_path / "inbox", tmp_path / "raw"
    inbox.mkdir()
    (d0,) = _log_days(1)
    _settled(write(d0.head(2), inbox / "day0.csv"))
    read, writer = sources._log_day, {"rows": 2}

    def appended_while_read(path, *a, **kw):
        out = read(path, *a, **kw)
        if writer["rows"] < d0.height:  # the writer goes on meanwhile, once
            writer["rows"] = d0.height
            write(d0, path)
        return out

    monkeypatch.setattr(sources, "_log_day", appended_while_read)
    assert sources.folder_days(inbox, raw, LOG_INGEST, settle=0) == []
    assert sources.raw_days(raw) == []
    assert sources.folder_days(inbox, raw, LOG_INGEST, settle=0) == [0]
    assert _rows(raw, 0) == 4
    assert sources.read_source(raw, 0)["origin"]["sha256"] == io.read_sha256(inbox / "day0.csv")


def test_a_day_s_file_changed_since_is_named_not_taken_again(tmp_path):
    """A file taken (a writer paused past streaming.settle), then written on: "day1.csv
    changed since it became day 1", exit 2 naming it, rather than a new day that fails on
    its first row's time run after run. Red with the check dropped (the error was "row 1 ...
    precedes")."""
    inbox, raw = tmp_path / "inbox", tmp_path / "raw"
    inbox.mkdir()
    d0, d1 = _log_days(2)
    write(d0, inbox / "day0.csv")
    write(d1.head(2), inbox / "day1.csv")
    assert sources.folder_days(inbox, raw, LOG_INGEST, settle=0) == [0, 1]
    write(d1, inbox / "day1.csv")
    with pytest.raises(DataError, match=r"day1\.csv: day1\.csv changed since it became day 1 "
                                        r"\(sha256 [0-9a-f]{12} then, [0-9a-f]{12} now\)"):
        sources.folder_days(inbox, raw, LOG_INGEST, settle=0)
    assert sources.raw_days(raw) == [0, 1]
    (inbox / "day1.csv").rename(tmp_path / "day1.csv")  # out of the inbox; the rest anew
    write(d1.tail(2), inbox / "day1-rest.csv")
    assert sources.folder_days(inbox, raw, LOG_INGEST, settle=0) == [2]
