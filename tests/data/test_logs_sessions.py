"""Sessions, histories and days of an ingested log: cut where they must be, never leaking.

Planted bugs that turn these red (each tried): a gap of exactly `session_gap` kept in the
session (`>` for `>=` in cells.sessions); the user change not cutting a gap session; a
history that takes the clicks at the session's start (allow_exact_matches=True: the
session's own first click) or up to its end; histories oldest first; the day computed
without `day_start`; a history column not reversed.
"""

from __future__ import annotations

import polars as pl

from lrm.data.schema import read_schema
from tests.data._logs import MIN, T0, clicks_log, frame, run, write

GAP = dict(label="clicked", user="user", item="item", time="ts", session_gap="30m")


def _sessions(rows: pl.DataFrame) -> list[list[str]]:
    """Each session's items (as ids), in order."""
    return [g["item"].to_list() for _, g in rows.group_by("session_id", maintain_order=True)]


def test_a_gap_of_at_least_session_gap_or_another_user_starts_a_session(tmp_path):
    log = frame([
        {"user": "u1", "ts": T0, "item": "a", "clicked": 0},
        {"user": "u1", "ts": T0 + 29 * MIN, "item": "b", "clicked": 0},  # closer: same
        {"user": "u1", "ts": T0 + 59 * MIN, "item": "c", "clicked": 0},  # 30m: a new one
        {"user": "u2", "ts": T0 + 10 * MIN, "item": "d", "clicked": 0},  # another user
        {"user": "u2", "ts": T0 + 5 * MIN, "item": "e", "clicked": 1},  # out of time order
    ])
    _, rows = run([write(log, tmp_path / "log.parquet")], tmp_path / "out", **GAP)
    ids = {"a": 0, "b": 1, "c": 2, "d": 3, "e": 4}  # day 0, in value order
    got = sorted(_sessions(rows))
    assert got == sorted([[ids["a"], ids["b"]], [ids["c"]], [ids["e"], ids["d"]]])
    # positions count from 0 in each session, in time order
    assert rows.filter(pl.col("item") == ids["e"])["position"].item() == 0
    assert rows.filter(pl.col("item") == ids["d"])["position"].item() == 1


def test_sessions_never_straddle_a_day_and_day_start_moves_the_cut(tmp_path):
    log = frame([{"user": "u1", "ts": T0 - 10 * MIN, "item": "a", "clicked": 0},  # 23:50
                 {"user": "u1", "ts": T0 + 10 * MIN, "item": "b", "clicked": 1},  # 00:10
                 {"user": "u1", "ts": T0 + 70 * MIN, "item": "c", "clicked": 0}])  # 01:10
    f = write(log, tmp_path / "log.csv")
    m, rows = run([f], tmp_path / "utc", **GAP)
    assert m["days"] == 2 and m["sessions"] == 3  # 23:50 | 00:10 | 01:10 (gap 60m)
    assert rows.group_by("day").len().sort("day")["len"].to_list() == [1, 2]
    assert rows["day"].n_unique() == 2
    m, rows = run([f], tmp_path / "shifted", day_start=1, **GAP)
    assert m["days"] == 2 and m["sessions"] == 2  # days start at 01:00: 23:50 and 00:10
    assert rows.group_by("day").len().sort("day")["len"].to_list() == [2, 1]
    first = rows.filter(pl.col("day") == 0)
    assert first["session_id"].n_unique() == 1  # ... now one session of one day


def test_history_is_the_users_clicks_before_the_session_most_recent_first(tmp_path):
    _, rows = run([write(clicks_log(), tmp_path / "log.parquet")], tmp_path / "out",
                  history="auto", **GAP)
    item = {v: i for i, v in enumerate("abcde")}  # vocabulary: (first day, value)
    hist = {tuple(g["item"].to_list()): g["history"][0].to_list()
            for _, g in rows.group_by("session_id", maintain_order=True)}
    a, b, c, d, e = (item[x] for x in "abcde")
    assert hist[(a, b, c)] == []  # u1's first session: nothing before it
    assert hist[(a,)] == []  # u2: never clicked
    assert hist[(d, b)] == [c, a]  # not d nor b: the session's own clicks (d at its start)
    assert hist[(e,)] == [b, d, c, a]  # the next day: every earlier click, newest first
    # the history is the session's: the same on every impression of it
    assert rows.group_by("session_id").agg(pl.col("history").n_unique())["history"].max() == 1


def test_history_is_cut_at_max_history(tmp_path):
    _, rows = run([write(clicks_log(), tmp_path / "log.parquet")], tmp_path / "out",
                  history="auto", max_history=2, **GAP)
    last = rows.filter(pl.col("day") == 1)["history"][0].to_list()
    assert last == [1, 3]  # b, d: the two most recent


def test_a_history_column_is_reversed_to_most_recent_first_and_shares_the_item_ids(tmp_path):
    log = frame([{"user": "u1", "ts": T0, "item": "c", "clicked": 1, "hist": "a b"},
                 {"user": "u1", "ts": T0 + 1, "item": "a", "clicked": 0, "hist": "a b"}])
    _, rows = run([write(log, tmp_path / "log.tsv")], tmp_path / "out", history="hist",
                  label="clicked", user="user", item="item", time="ts",
                  session_gap="30m")
    schema, _ = read_schema(tmp_path / "out")
    assert schema.user_seq == ("hist",) and schema.vocab["hist"] == schema.vocab["item"] == 3
    ids = {"a": 0, "b": 1, "c": 2}
    assert rows["hist"][0].to_list() == [ids["b"], ids["a"]]  # oldest first in the log


def test_a_days_history_never_holds_a_later_days_clicks_even_at_earlier_times(tmp_path):
    """Days from files: file k is day k whatever its times. Day 1's file holds u1's clicks
    two days before day 0's session: they are in no history of day 0 (a day's rows never
    depend on later days), and in the histories of day 1, before its later session."""
    def imp(t: int, item: str, click: int) -> dict:
        return {"user": "u1", "ts": t, "item": item, "clicked": click, "cat": "x"}

    day0 = [imp(T0 + k * MIN, f"i{k}", k % 2) for k in range(4)]  # clicks i1, i3
    day1 = [imp(T0 - 2 * 24 * 60 * MIN + k * MIN, f"k{k}", 1) for k in range(3)]
    day1.append(imp(T0 + 10 * 60 * MIN, "z", 0))  # a later session of day 1
    files = [write(frame(day0), tmp_path / "a.csv"), write(frame(day1), tmp_path / "b.csv")]
    _, rows = run(files, tmp_path / "out", days="file", history="auto", **GAP)
    ids = dict(zip(["i0", "i1", "i2", "i3", "k0", "k1", "k2", "z"], range(8)))  # by first day
    hist = {tuple(g["item"].to_list()): g["history"][0].to_list()
            for _, g in rows.group_by("session_id", maintain_order=True)}
    assert hist[tuple(ids[f"i{k}"] for k in range(4))] == []  # not k0..k2: day 1's
    assert hist[(ids["k0"], ids["k1"], ids["k2"])] == []
    # day 1's later session: day 0's clicks and its own day's before it, newest first
    assert hist[(ids["z"],)] == [ids[x] for x in ("i3", "i1", "k2", "k1", "k0")]
