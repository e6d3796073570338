"""What an ingested log holds: page views exploded with positions, dense ids from
vocabularies (raw ids are tokens: -124 is a category), label mappings said, dense columns
scaled (numeric item attributes too), the schema's roles; the same rows
whatever the chunk and cell sizes; a continued ingest keeps every id.

Planted bugs that turn these red (each tried): positions from the input row instead of the
page view, vocabulary ids in value order only (not first day first), a continued ingest
re-numbering its vocabulary, the heavy-tail rule inverted, a count label mapped without
being asked, the spill's cells read for the wrong day, the negative-id check of before
(raw ids are tokens), numeric item attributes left out of the dense features.
"""

from __future__ import annotations

import json
import time

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

from lrm.data.logs import ingest
from lrm.data.logs.culprits import RowError
from lrm.data.schema import day_files, read_schema
from tests.data._logs import MIN, T0, clicks_log, frame, run, write

GAP = dict(label="clicked", user="user", item="item", time="ts", session_gap="30m")


def test_page_views_explode_into_impressions_with_positions_and_labels(tmp_path):
    log = frame([{"pv": "p1", "user": "U1", "t": "11/9/2019 10:00:00 AM",
                  "shown": "N3-0 N1-1 N2-0", "hist": "N9 N8"},
                 {"pv": "p2", "user": "U2", "t": "11/10/2019 9:00:00 PM",
                  "shown": "N1-0 N-4-1", "hist": ""}])
    m, rows = run([write(log, tmp_path / "b.tsv")], tmp_path / "out", explode="shown",
                  item="news", user="user", session="pv", time="t",
                  time_format="%m/%d/%Y %I:%M:%S %p", history="hist")
    assert m["rows"] == 5 and m["input_rows"] == 2 and m["sessions"] == 2 and m["days"] == 2
    schema, _ = read_schema(tmp_path / "out")
    assert schema.item_key == "news" and schema.user_seq == ("hist",)
    news = {v: i for i, v in enumerate(["N1", "N2", "N3", "N8", "N9", "N-4"])}  # day 0, then 1
    assert rows["news"].to_list() == [news[x] for x in ("N3", "N1", "N2", "N1", "N-4")]
    assert rows["label"].to_list() == [0, 1, 0, 0, 1]
    assert rows["position"].to_list() == [0, 1, 2, 0, 1]
    assert rows["hist"].to_list()[:3] == [[news["N8"], news["N9"]]] * 3
    assert rows["hist"].to_list()[3:] == [[], []]


def test_an_entry_without_its_label_names_the_page_view_row(tmp_path):
    log = frame([{"user": "U1", "shown": "N1-0 N2-1"}, {"user": "U2", "shown": "N1-0 N2"}])
    with pytest.raises(RowError) as e:
        run([write(log, tmp_path / "b.csv")], tmp_path / "out", explode="shown", user="user")
    assert (e.value.line, e.value.field) == (2, "shown") and "'N2'" in str(e.value)


def test_ids_are_dense_and_fixed_on_their_first_day(tmp_path):
    log = frame([{"user": "z", "ts": T0 + 86_400, "item": "a", "clicked": 0},  # day 1
                 {"user": "y", "ts": T0, "item": "b", "clicked": 0},  # day 0
                 {"user": "x", "ts": T0 + 86_400, "item": "c", "clicked": 1}])
    m, rows = run([write(log, tmp_path / "l.csv")], tmp_path / "out", **GAP)
    assert m["vocab"] == {"item": 3, "user": 3}
    # day 0's values first, then day 1's in value order: users y=0, x=1, z=2; b=0, a=1, c=2
    by_user = {r["user"]: r["item"] for r in rows.iter_rows(named=True)}
    assert by_user == {0: 0, 1: 2, 2: 1}
    schema, _ = read_schema(tmp_path / "out")
    assert schema.vocab == {"user": 3, "item": 3, "history": 3}  # the history: item ids


def test_a_continued_ingest_keeps_every_id_and_matches_one_ingest_of_all_days(tmp_path):
    log = clicks_log()
    day0 = log.filter(pl.col("ts") < T0 + 86_400)
    day1 = log.filter(pl.col("ts") >= T0 + 86_400).with_columns(
        pl.lit("f").alias("item")).vstack(frame([{"user": "u3", "ts": T0 + 86_400 + 9,
                                                  "item": "a", "clicked": 1, "cat": "x"}]))
    both = day0.vstack(day1)
    _, ref = run([write(both, tmp_path / "all.parquet")], tmp_path / "all", history="auto",
                 **GAP)
    run([write(day0, tmp_path / "d0.parquet")], tmp_path / "d0", history="auto", **GAP)
    m, cont = run([write(day1, tmp_path / "d1.parquet")], tmp_path / "d1", history="auto",
                  prior=tmp_path / "d0", **GAP)
    assert m["vocab"] == {"item": 5, "user": 3}  # a-d, then f (u3: new; a: known)
    keep = ["user", "item", "label", "position", "history"]  # histories reach back to day 0
    assert cont.select(keep).equals(ref.filter(pl.col("day") == 1).select(keep))
    state = json.loads((tmp_path / "d1" / "_ingest" / "state.json").read_text())
    assert state["vocab"]["item"]["size"] == 5
    with pytest.raises(Exception, match="differs"):
        run([tmp_path / "d1.parquet"], tmp_path / "d2", history="none", prior=tmp_path / "d0",
            **GAP)
    # a state written before a mapping key was (item_dense): the key held its default
    f = tmp_path / "d0" / "_ingest" / "state.json"
    old = json.loads(f.read_text())
    del old["mapping"]["item_dense"]
    f.write_text(json.dumps(old))
    m, _ = run([tmp_path / "d1.parquet"], tmp_path / "d3", history="auto",
               prior=tmp_path / "d0", **GAP)
    assert m["vocab"] == {"item": 5, "user": 3}


@pytest.mark.parametrize("kind", ["bool", "count"])
def test_a_boolean_or_a_count_label_maps_to_one_and_says_so(tmp_path, kind, caplog):
    values = [True, False, True] if kind == "bool" else [3, 0, 1]
    log = frame([{"user": "u", "ts": T0 + i, "item": "a", "clicked": v}
                 for i, v in enumerate(values)])
    f = write(log, tmp_path / "l.parquet")
    if kind == "count":
        with pytest.raises(RowError, match="0 or 1, got 3 .*--label-count"):
            run([f], tmp_path / "o0", **GAP)
    with caplog.at_level("INFO", logger="lrm"):
        m, rows = run([f], tmp_path / "out", label_count=kind == "count", **GAP)
    assert rows["label"].to_list() == [1, 0, 1] and m["label_mapping"] == kind
    assert f"read as {kind}" in caplog.text


@pytest.mark.parametrize("unit", ["s", "ms", "us"])
def test_times_outside_any_click_log_are_said_with_what_other_units_give(tmp_path, unit,
                                                                        caplog):
    """Seconds read as ms put a week of 2019 into one day of 1970, silently before. Planted
    bugs that turn this red (each tried): the check not called; the span of the first file
    only; a file's span from its first chunk only; other units converted the wrong way."""
    log = clicks_log()  # two days of 2019, times in seconds, in two files
    files = [write(log.head(4), tmp_path / "a.csv"), write(log.tail(3), tmp_path / "b.csv")]
    with caplog.at_level("WARNING", logger="lrm"):
        m, _ = run(files, tmp_path / "out", time_unit=unit, chunk_rows=2, **GAP)
    last = T0 + 24 * 60 * MIN + 5 * MIN  # clicks_log's last time (day 1)
    per = {"s": 1, "ms": 1000, "us": 1_000_000}[unit]  # a second is this many of `unit`
    first_s, last_s = T0 // per, last // per  # each time, read in `unit`, in seconds
    fmt = "%Y-%m-%d %H:%M:%S"
    assert m["time_span"] == [time.strftime(fmt, time.gmtime(first_s)),
                              time.strftime(fmt, time.gmtime(last_s))]
    if unit == "s":
        assert caplog.text == "" and m["days"] == 2
        return
    assert m["days"] == 1 and "column ts's times run from 1970-01-" in caplog.text
    assert "as s: 2019-11-09 00:00:00 to 2019-11-10 00:05:00" in caplog.text, caplog.text


@pytest.mark.parametrize("unit", ["s", "ms"])
def test_a_time_column_mixing_units_names_the_row_of_the_last_time(tmp_path, unit):
    """Seconds and milliseconds in one column cut days 1000x apart (a day of year 55840):
    an error at the last time's row, naming the first's; read in small chunks, so that the
    rows come from the chunks that hold them. Red with the check not called, or with the
    rows kept from a file's first chunk."""
    log = clicks_log()  # times in seconds
    ms = log.tail(3).with_columns(pl.col("ts") * 1000)  # b.csv's rows 1-3
    files = [write(log.head(4), tmp_path / "a.csv"), write(ms, tmp_path / "b.csv")]
    with pytest.raises(RowError) as e:
        run(files, tmp_path / "out", time_unit=unit, chunk_rows=2, **GAP)
    assert (e.value.file.name, e.value.line, e.value.field) == ("b.csv", 3, "ts")
    assert "row 1 of " in str(e.value) and "a.csv" in str(e.value)
    assert "mix units" in str(e.value) and f"--time-unit {unit}" in str(e.value)
    # one unit throughout: no error (the two days of 2019 span far less than 100x)
    m, _ = run([files[0], write(log.tail(3), tmp_path / "c.csv")], tmp_path / "out2",
               chunk_rows=2, **GAP)
    assert m["days"] == 2


def test_dense_columns_are_log_scaled_where_heavy_tailed_and_standardized(tmp_path):
    rng = np.random.default_rng(0)
    n = 4000
    log = frame([{"user": f"u{i % 50}", "ts": T0 + i, "item": f"i{i % 30}", "clicked": i % 2,
                  "dwell": float(v), "score": float(s)}
                 for i, (v, s) in enumerate(zip(rng.pareto(1.5, n) * 10,
                                                rng.normal(5, 2, n), strict=True))])
    m, rows = run([write(log, tmp_path / "l.parquet")], tmp_path / "out", dense=["dwell",
                                                                                 "score"], **GAP)
    how = m["dense_scaling"]
    assert how["dwell"]["transform"] == "log1p" and how["score"]["transform"] == "none"
    for c in ("dwell", "score"):
        assert abs(rows[c].mean()) < 1e-3 and abs(rows[c].std() - 1) < 1e-2
    expect = (np.log1p(log["dwell"].to_numpy()) - how["dwell"]["mean"]) / how["dwell"]["std"]
    np.testing.assert_allclose(np.sort(rows["dwell"].to_numpy()), np.sort(expect), rtol=1e-5)
    f = day_files(tmp_path / "out")[0][0]
    meta = pq.read_schema(f).field("dwell").metadata
    assert json.loads(meta[b"lrm.scaling"])["transform"] == "log1p"  # said in the schema


def test_roles_land_in_the_schema_and_item_attributes_are_stored_once_after_dedup(tmp_path):
    from lrm.config import DedupConfig
    from lrm.data import dedup
    from lrm.data.items import TABLE_KEY

    rng = np.random.default_rng(1)
    rows = []
    for s in range(2000):
        surface = ["home", "search"][s % 2]
        for j in range(5):
            item = int(rng.integers(0, 300))
            rows.append({"user": f"u{s % 60}", "ts": T0 + s * 40 + j, "item": f"i{item}",
                         "clicked": int(rng.random() < 0.2), "brand": f"b{item * 7919 % 1009}",
                         "surface": surface, "slot": f"s{j}", "seen": "x y z"})
    m, out = run([write(frame(rows), tmp_path / "l.parquet")], tmp_path / "raw",
                 item_attributes=["brand"], vertical="surface", categorical=["slot"],
                 sequence=["seen"], history="none", **GAP)
    schema, _ = read_schema(tmp_path / "raw")
    assert schema.user_sparse == ("user", "surface") and schema.vertical == "surface"
    # the verticals are named by the column's values, in the order of their ids (issue 44)
    assert schema.verticals() == {0: "home", 1: "search"}
    ids = out.group_by("surface").agg(pl.len()).sort("surface")["surface"].to_list()
    assert ids == [0, 1] and schema.vertical_names == ("home", "search")
    assert schema.item_sparse == ("item", "brand", "slot") and schema.user_seq == ("seen",)
    assert out.group_by("session_id").agg(pl.col("surface").n_unique())["surface"].max() == 1
    d = dedup.dedup_dataset(tmp_path / "raw", tmp_path / "sessions", DedupConfig())
    assert d["item_columns"] == ["brand"]  # once per item in the file; slot is not the item's
    assert TABLE_KEY in pq.ParquetFile(day_files(tmp_path / "sessions")[0][0]).metadata.metadata


def test_the_same_rows_whatever_the_chunk_and_cell_sizes(tmp_path):
    rng = np.random.default_rng(2)
    n = 3000
    log = frame([{"user": f"u{int(u)}", "ts": int(T0 + t), "item": f"i{int(i)}",
                  "clicked": int(c)} for u, t, i, c in zip(
        rng.integers(0, 80, n), rng.integers(0, 3 * 86_400, n), rng.integers(0, 200, n),
        rng.random(n) < 0.1, strict=True)])
    f = write(log, tmp_path / "l.csv")
    m1, one = run([f], tmp_path / "one", history="auto", **GAP)
    m2, many = run([f], tmp_path / "many", history="auto", chunk_rows=97, **GAP)
    assert m1["buckets"] == 1 and m2["buckets"] > 20
    key = ["day", "user", "item", "label", "position", "history"]

    def canon(df: pl.DataFrame) -> pl.DataFrame:
        return df.with_columns(pl.col("history").cast(pl.List(pl.String)).list.join(",")
                               ).select(key).sort(key)
    assert canon(one).equals(canon(many))
    assert m1["sessions"] == m2["sessions"] and m1["history_mean"] == m2["history_mean"] > 0
    # and every session id is unique in the dataset, every session within one day
    assert many.group_by("session_id").agg(pl.col("day").n_unique())["day"].max() == 1


def test_criteo_is_one_mapping_of_the_same_machinery(tmp_path):
    """Criteo TSV through `ingest logs` (headerless columns, label, dense I*, categorical C*,
    a day per file): the same rows, labels and days as `ingest criteo`, each hash a dense id
    one-to-one. Planted bug that turns it red (tried): a column of ids with missing values
    read through numpy as floats (its 64-bit hashes rounded: a crash before it was found)."""
    from lrm.config import IngestConfig
    from lrm.data import criteo
    from lrm.data.schema import CRITEO_CAT, CRITEO_INT
    from tests.data.test_criteo import random_lines

    files = []
    for k in range(2):
        files.append(tmp_path / f"day{k}.tsv")
        files[-1].write_text("\n".join(random_lines(300, seed=k)) + "\n")
    criteo.ingest(files, tmp_path / "criteo", IngestConfig(days="file"))
    ref = pl.concat([pl.read_parquet(f) for fs in day_files(tmp_path / "criteo").values()
                     for f in fs])
    m, rows = run(files, tmp_path / "logs", columns=["label", *CRITEO_INT, *CRITEO_CAT],
                  label="label", dense=list(CRITEO_INT), categorical=list(CRITEO_CAT),
                  days="file")
    assert m["rows"] == 600 and m["days"] == 2 and m["sessions"] == 600
    assert rows["label"].to_list() == ref["label"].to_list()
    assert rows["day"].to_list() == ref["day"].to_list()
    for c in CRITEO_CAT:  # hash <-> id, one to one; missing stays missing
        pairs = pl.DataFrame({"h": ref[c], "i": rows[c]}).unique()
        assert pairs["h"].n_unique() == pairs["i"].n_unique() == pairs.height
        assert (ref[c].is_null() == rows[c].is_null()).all()
    assert m["dense_scaling"]["I2"]["transform"] in ("log1p", "signed_log1p", "none")


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_raw_ids_are_opaque_tokens_that_the_vocabulary_maps(tmp_path, suffix):
    """An export writes "unknown" as -124 (or -1, NA) and codes as text or integers: each is
    a category of its own, never an error (only lrm's own dense ids have a sign rule): every
    row's ids decode, through the stored vocabularies, to the tokens it was written with.
    Red with the negative-id check of before (text or integers)."""
    codes = ["-124", "-1", "NA", "0.5", "3", "-124", "7", "-1"]
    rows = [{"user": f"-{i % 3 + 1}", "ts": T0 + 60 * i, "item": f"{-i}", "clicked": i % 2,
             "age": codes[i]} for i in range(len(codes))]
    log = frame(rows)
    if suffix == ".parquet":  # integer ids typed as integers, the codes as text
        log = log.with_columns(pl.col("user").cast(pl.Int64), pl.col("item").cast(pl.Int64))
    m, out = run([write(log, tmp_path / f"l{suffix}")], tmp_path / "out",
                 categorical=["age"], history="none", **GAP)
    assert m["vocab"] == {"user": 3, "item": 8, "age": 6}
    cols = ("user", "item", "age")
    state = ingest.State.load(tmp_path / "out" / ingest.STATE)
    tokens = {c: state.vocabs[c]["s"] for c in cols}
    got = sorted(tuple(tokens[c][i] for c, i in zip(cols, r, strict=True))
                 for r in out.select(cols).iter_rows())
    want = sorted((r["user"], r["item"], r["age"]) for r in rows)
    assert got == want


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_numeric_item_attribute_is_scaled_and_stored_once_per_item(tmp_path, suffix):
    """--item-dense: a video's duration, a number of the item: a dense feature scaled as
    --dense is (log1p: durations are heavy-tailed), stored once per item after dedup. A
    float column named as a categorical item attribute says where it belongs. Red with the
    numeric attributes left out of the schema's dense features, or of the parse."""
    from lrm.config import DedupConfig
    from lrm.data import dedup

    rng = np.random.default_rng(4)
    duration = rng.pareto(1.2, 200) * 30 + 5  # seconds, per item
    rows = [{"user": f"u{int(u)}", "ts": T0 + 45 * k, "item": f"v{int(i)}",
             "clicked": int(rng.random() < 0.1), "video_duration": float(duration[i])}
            for k, (u, i) in enumerate(zip(rng.integers(0, 50, 3000),
                                           rng.integers(0, 200, 3000), strict=True))]
    f = write(frame(rows), tmp_path / f"l{suffix}")
    m, out = run([f], tmp_path / "raw", item_dense=["video_duration"], **GAP)
    schema, _ = read_schema(tmp_path / "raw")
    assert schema.dense == ("video_duration",) and schema.item_key == "item"
    how = m["dense_scaling"]["video_duration"]
    assert how["transform"] == "log1p"
    raw = np.array([r["video_duration"] for r in rows])
    expect = (np.log1p(raw) - how["mean"]) / how["std"]
    np.testing.assert_allclose(np.sort(out["video_duration"].to_numpy()), np.sort(expect),
                               rtol=1e-5)
    assert out.group_by("item").agg(pl.col("video_duration").n_unique())[
        "video_duration"].max() == 1
    d = dedup.dedup_dataset(tmp_path / "raw", tmp_path / "sessions", DedupConfig())
    assert d["item_columns"] == ["video_duration"]  # once per item in the sessions files
    if suffix == ".parquet":  # a float column where ids go: the error names the right key
        with pytest.raises(RowError) as e:
            run([f], tmp_path / "bad", item_attributes=["video_duration"], **GAP)
        assert e.value.field == "video_duration" and "--item-dense" in str(e.value)


def test_a_partial_first_or_last_day_is_a_day_and_said(tmp_path, caplog):
    """An export that starts 55 minutes before midnight and ends at noon: its first day is
    day 0 (its rows are not dropped or moved), counted per day in the metrics, and said in
    one line; a day of ordinary size is not. Red with the line not said."""
    import logging

    hours = [23.1, 23.5, 23.9] + [24 + h / 4 for h in range(96)] + [48 + h / 4 for h in range(96)] \
        + [72 + h / 4 for h in range(40)]  # day 0: 3 rows; days 1-2: 96; day 3: until 10:00
    log = frame([{"user": f"u{i % 9}", "ts": int(T0 + h * 3600), "item": f"i{i % 13}",
                  "clicked": i % 4 == 0} for i, h in enumerate(hours)])
    with caplog.at_level(logging.INFO, logger="lrm"):
        m, rows = run([write(log, tmp_path / "l.csv")], tmp_path / "out", **GAP)
    assert m["day_rows"] == {0: 3, 1: 96, 2: 96, 3: 40} and rows.height == len(hours)
    said = [r.getMessage() for r in caplog.records if "median day" in r.getMessage()]
    assert len(said) == 1 and "the first day (0) holds 3 rows" in said[0], said
