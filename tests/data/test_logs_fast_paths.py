"""The faster ways `ingest logs` takes give exactly what the plain ones give: cells packed
from several user buckets write the rows one bucket each would; numbers the CSV reader
parses give the rows their text gives (and a quoted empty value stays text, an error);
the one-key sort and the sort in runs are polars' sort; the chunk read ahead comes in
order, its error in its place; sessions by a session column without a user spread over
buckets (this crashed); each way of looking up ids gives the vocabulary's row; a value's
first day is its earliest in a chunk; days on two threads build one cell at a time;
calls run behind in order, and a spill's error neither hides a bad row's nor is lost; a
spill's batches, without the columns that hold one value there, read back as the chunks were.

Planted bugs that turn these red (each tried): the bucket left out of the gap sessions'
sort (cells.sessions); numbers read as float32 (blocks._read_text); a CSV block with quotes
read with numbers (blocks._text_chunks); the one-key sort without its tie-order check
(order.arg_sort); the sort in runs unstable, without its order check, or without each
run's offset (order._sort_runs); an error of the maker dropped (ahead); the session text
bucketed unhashed (read.Parser._bucket, as before); the vocabulary map's ids in hash
order, or a missing value mapped to 0 (vocab.Lookup); a chunk's first day its first row's
(read.Parser._values); the build without its lock, or the days on one thread
(ingest.write_day); `Behind.submit` giving the new call's result, its quiet close raising,
the read's spill closed loudly after a bad row or quietly at the end (ingest.read_file); a
left-out column put back with another value, a batch's place dropped though the other
chunk's varies, or its rows put back in another order (spill._write, spill._whole).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lrm.data.logs import ahead, blocks, ingest, order, spill, vocab
from lrm.data.logs.culprits import RowError
from lrm.data.logs.frame import BUCKET, DAY, FILE, ITEM, LABEL, POS, ROW, SEED, TIME, USER
from tests.data._logs import T0, frame, run, write

GAP = dict(label="clicked", user="user", item="item", time="ts", session_gap="30m")


def _log(n: int = 2000, seed: int = 3) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    return frame([{"user": f"u{int(u)}", "ts": int(T0 + t), "item": f"i{int(i)}",
                   "clicked": int(c), "sess": f"s{int(u)}-{int(t) // 7200}",
                   "price": round(float(p), 2)} for u, t, i, c, p in zip(
        rng.integers(0, 60, n), rng.integers(0, 2 * 86_400, n), rng.integers(0, 90, n),
        rng.random(n) < 0.2, rng.gamma(2.0, 3.0, n), strict=True)])


def _contents(out) -> dict[str, pa.Table]:
    """Each day file's rows, schema and metadata (not its row groups)."""
    return {str(p.relative_to(out)): pq.read_table(p) for p in sorted(out.glob("day=*/*.parquet"))}


def _files(out) -> dict[str, str]:
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.glob("day=*/*.parquet"))}


MODES = {"gap": dict(**GAP, history="auto"),
         "column": dict(label="clicked", user="user", item="item", time="ts", session="sess"),
         "page": dict(label="clicked", user="user", item="item", time="ts", history="none")}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_packed_cells_write_the_files_one_bucket_per_cell_writes(tmp_path, monkeypatch, mode):
    f = write(_log(), tmp_path / "l.csv")
    m1, packed = run([f], tmp_path / "packed", chunk_rows=150, dense=["price"], **MODES[mode])
    monkeypatch.setattr(ingest, "pack", lambda rows, limit: [[b] for b in sorted(rows)])
    m2, alone = run([f], tmp_path / "alone", chunk_rows=150, dense=["price"], **MODES[mode])
    m1.pop("bytes"), m2.pop("bytes")  # (a row group per cell: fewer groups, fewer bytes)
    assert m1["buckets"] > 5 and m1 == m2 and packed.equals(alone)
    a, b = _contents(tmp_path / "packed"), _contents(tmp_path / "alone")  # file by file
    assert a.keys() == b.keys() and all(a[k].equals(b[k], check_metadata=True) for k in a)


def test_numbers_the_csv_reader_parses_give_the_rows_their_text_gives(tmp_path, monkeypatch):
    f = write(_log(), tmp_path / "l.csv")
    m1, typed = run([f], tmp_path / "typed", chunk_rows=300, dense=["price"], **GAP)
    monkeypatch.setattr(blocks, "numeric_columns", lambda *a: [])
    m2, text = run([f], tmp_path / "text", chunk_rows=300, dense=["price"], **GAP)
    assert m1 == m2 and typed.equals(text)
    assert _files(tmp_path / "typed") == _files(tmp_path / "text")


def test_a_quoted_empty_dense_value_is_text_and_bad_not_missing(tmp_path):
    lines = ["user,ts,item,clicked,price"] + [f"u{i},{T0 + i},i{i},0,{i}.5" for i in range(5)]
    lines[3] = f'u2,{T0 + 2},i2,0,""'  # the 3rd data row: an empty text, not a number
    f = tmp_path / "l.csv"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(RowError) as e:
        run([f], tmp_path / "out", dense=["price"], **GAP)
    assert (e.value.line, e.value.field) == (3, "price") and "''" in str(e.value)


def test_the_one_key_sort_is_polars_sort():
    rng = np.random.default_rng(1)
    tie = ["f", "r", "p"]
    for trial in range(200):
        n = int(rng.integers(0, 300))
        df = pl.DataFrame({
            "b": rng.integers(0, 3, n).astype(np.int32),
            "u": rng.choice(np.array([0, 5, 2**63 - 1, 2**63, 2**64 - 1], dtype=np.uint64), n),
            "t": rng.integers(-5, 5, n) * int(rng.choice([1, 10**6, 2**45])),
            "s": rng.choice(["", "a", "ab", "b", "Z", "é"], n),
            "v": np.uint64(2**64 - 1) - rng.integers(0, 9, n).astype(np.uint64),
            "f": rng.integers(0, 2, n).astype(np.int32),
            "r": rng.permutation(n).astype(np.uint32), "p": np.zeros(n, np.int32)})
        keys = [["b", "u", "t"], ["u"], ["s", "t"], ["t", "s", "u", "b"], ["v", "t"]][trial % 5]
        # in tie order, or not; in runs of the first key, each in the order of the last
        # (order._in_runs: a time-ordered log's cell)
        for d in (df, df.sort(tie), df.sort([keys[0], *tie]), df.sort([keys[0], keys[-1],
                                                                        *tie])):
            assert d[order.arg_sort(d, keys, tie)].equals(d.sort([*keys, *tie])), keys


def test_the_item_made_ahead_comes_in_order_and_its_error_in_its_place():
    def items():
        yield from range(5)
        raise ValueError("the sixth")

    got = []
    with pytest.raises(ValueError, match="the sixth"):
        for x in ahead.ahead(items()):
            got.append(x)
    assert got == [0, 1, 2, 3, 4]
    it = ahead.ahead(iter(range(10**6)))
    assert next(it) == 0
    it.close()  # the maker stops: no thread left behind
    assert not [t for t in threading.enumerate() if t.name == "lrm-read-ahead"]


def test_sessions_by_a_column_without_a_user_over_several_buckets(tmp_path):
    f = write(_log(600), tmp_path / "l.csv")
    mapping = dict(label="clicked", item="item", time="ts", session="sess")
    m1, one = run([f], tmp_path / "one", **mapping)
    m2, many = run([f], tmp_path / "many", chunk_rows=50, **mapping)
    assert m1["buckets"] == 1 and m2["buckets"] > 5 and m1["sessions"] == m2["sessions"]
    key = ["day", "item", "label", "position"]
    assert one.select(key).sort(key).equals(many.select(key).sort(key))


def test_each_way_of_looking_up_ids_gives_the_vocabularys_row():
    """A binary search (few values), a map of the vocabulary (no larger than the values),
    a map of the distinct values (a larger vocabulary): the id is the value's row."""
    rng = np.random.default_rng(5)
    for size in (3, 300, 5000):
        v = pl.DataFrame({"s": [f"v{i}" for i in rng.permutation(size)], "day": 0})
        lookup = vocab.Lookup(v)
        for n in (10, 400, 20_000):  # fewer values than SMALL, fewer than the vocabulary, more
            rows = rng.integers(0, size, n)
            got = lookup(v["s"].gather(rows).hash(SEED).to_numpy())
            assert np.array_equal(got, rows), (size, n)
            bad = np.r_[v["s"].gather(rows).hash(SEED).to_numpy(),
                        pl.Series(["absent"]).hash(SEED).to_numpy()]
            with pytest.raises(KeyError):
                lookup(bad)


def _vocab(out, name: str) -> pl.DataFrame:
    """A dataset's vocabulary (value `s`, first `day`; the id is the row)."""
    state = json.loads((out / ingest.STATE / "state.json").read_text())
    return pl.read_parquet(out / ingest.STATE / state["vocab"][name]["file"])


@pytest.mark.parametrize("in_order", [False, True])
def test_a_values_first_day_is_its_earliest_in_a_chunk_of_several_days(tmp_path, in_order):
    """Item a is seen on day 1, then on day 0: its id is fixed on day 0 (ids in order of
    first day, then value: a=0, b=1, c=2), read in input order or in day order (a chunk's
    values take their earliest day, not their first row's)."""
    log = frame([{"user": "u", "ts": T0 + 86_400, "item": "a", "clicked": 0},
                 {"user": "v", "ts": T0, "item": "a", "clicked": 0},
                 {"user": "w", "ts": T0 + 5, "item": "b", "clicked": 0},
                 {"user": "x", "ts": T0 + 86_400 + 5, "item": "c", "clicked": 0}])
    log = log.sort("ts") if in_order else log
    _, rows = run([write(log, tmp_path / "l.csv")], tmp_path / "out", history="none", **GAP)
    v = _vocab(tmp_path / "out", "item")
    assert v["s"].to_list() == ["a", "b", "c"] and v["day"].to_list() == [0, 0, 1]
    assert sorted(rows["item"].to_list()) == [0, 0, 1, 2]


def test_a_value_in_two_columns_of_one_vocabulary_has_the_earlier_first_day(tmp_path):
    """In day order, item a is first an impression on day 1 but a history entry on day 0:
    its first day is 0 (the vocabulary's columns are merged before the first day is
    taken)."""
    log = frame([{"user": "u", "ts": T0, "item": "b", "clicked": 0, "hist": "a"},
                 {"user": "v", "ts": T0 + 86_400, "item": "a", "clicked": 0, "hist": ""}])
    run([write(log, tmp_path / "l.csv")], tmp_path / "out", history="hist", **GAP)
    v = _vocab(tmp_path / "out", "item")
    assert v["s"].to_list() == ["a", "b"] and v["day"].to_list() == [0, 0]


def test_days_run_on_two_threads_but_build_one_cell_at_a_time(tmp_path, monkeypatch):
    """Memory holds one cell being built (ingest._BUILDING), while another day's is written."""
    running, most, threads = [0], [0], set()
    build, guard = ingest.cells.build, threading.Lock()

    def watched(*args, **kwargs):
        with guard:
            running[0] += 1
            most[0] = max(most[0], running[0])
            threads.add(threading.current_thread().name)
        time.sleep(0.05)  # (two builds at once would meet here)
        try:
            return build(*args, **kwargs)
        finally:
            with guard:
                running[0] -= 1

    monkeypatch.setattr(ingest.cells, "build", watched)
    f = write(_log(600), tmp_path / "l.csv")  # two days
    m, _ = run([f], tmp_path / "out", chunk_rows=100, **GAP)
    assert m["days"] == 2 and len(threads) == 2 and most[0] == 1


def test_calls_run_behind_in_order_their_results_and_errors_come_back():
    behind = ahead.Behind("test-behind")
    seen = []

    def call(x: int) -> int:
        time.sleep(0.01)
        seen.append(x)
        if x == 3:
            raise ValueError("call 3")
        return x * 10

    assert [behind.submit(call, x) for x in range(3)] == [None, 0, 10]
    assert behind.wait() == 20 and seen == [0, 1, 2]
    behind.submit(call, 3)
    with pytest.raises(ValueError, match="call 3"):
        behind.close()
    behind = ahead.Behind("test-behind")
    behind.submit(call, 3)
    assert behind.close(quiet=True) is None  # (the caller's own error says more)
    assert not [t for t in threading.enumerate() if t.name.startswith("test-behind")]


def test_a_bad_row_is_the_error_even_while_a_spill_fails(tmp_path, monkeypatch):
    """The chunk before a bad row is being spilled when the bad row is found: a failing
    spill does not hide the bad row's error, and a failing spill alone is the error (also
    the last chunk's)."""
    log = _log(600)
    f = write(log.with_columns(pl.when(pl.int_range(pl.len()) == 450).then(pl.lit("x"))
                               .otherwise(pl.col("clicked").cast(pl.String)).alias("clicked")),
              tmp_path / "bad.csv")

    write_spill, failing = ingest.spill.write, ["-c3.arrow"]  # rows 301-400: before the bad

    def full(frame, path, *a):
        if path.name.endswith(failing[0]):
            time.sleep(0.2)  # (still spilling when the bad row is found)
            raise OSError("disk full")
        return write_spill(frame, path, *a)

    monkeypatch.setattr(ingest.spill, "write", full)
    with pytest.raises(RowError) as e:
        run([f], tmp_path / "out", chunk_rows=100, **GAP)
    assert (e.value.line, e.value.field) == (451, "clicked")
    good = write(log, tmp_path / "good.csv")
    for k, chunk in enumerate(("-c3.arrow", "-c5.arrow")):  # one of six, and the last
        failing[0] = chunk
        with pytest.raises(OSError, match="disk full"):
            run([good], tmp_path / f"out{k}", chunk_rows=100, **GAP)


def _chunk(file: int, rows: int, pos: np.ndarray, seed: int) -> pl.DataFrame:
    """A parsed chunk as `read.Parser` makes one (the columns the spill reads back)."""
    rng = np.random.default_rng(seed)
    return pl.DataFrame({
        FILE: pl.Series(np.full(rows, file, np.int32)),
        ROW: pl.Series(np.arange(1, rows + 1, dtype=np.uint32)),
        POS: pl.Series(pos.astype(np.int32)),
        LABEL: pl.Series((rng.random(rows) < 0.3).astype(np.int8)),
        TIME: pl.Series(rng.integers(0, 10**12, rows)),
        USER: pl.Series(rng.integers(0, 2**63, rows).astype(np.uint64)),
        ITEM: pl.Series(rng.integers(0, 2**63, rows).astype(np.uint64)),
        DAY: pl.Series(rng.integers(4, 6, rows).astype(np.int32)),
        BUCKET: pl.Series(rng.integers(0, 3, rows).astype(np.int32)),
    })


def test_a_spill_reads_back_the_rows_and_columns_of_its_chunks(tmp_path):
    """The spill leaves out of its batches the columns that hold one value there (a cell's
    day and bucket, the chunk's file, a place in a page view where there is none) and puts
    them back: a day's cells and the clicks read back are the chunks' rows, every column
    with its values and type, in their order; also where one chunk's place is constant and
    the other's is not (their batches differ in columns). The clicks of a day's buckets
    are theirs up to that day, none later."""
    one = _chunk(0, 500, np.zeros(500), 1)  # no page views: its place left out
    two = _chunk(3, 400, np.arange(400) % 4, 2)  # page views: its place kept
    spilled = [spill.write(c, tmp_path / f"c{k}.arrow", clicks=True)
               for k, c in enumerate((one, two))]
    assert spilled[0].fixed["cells"] == {FILE: 0, POS: 0}
    assert spilled[1].fixed["cells"] == {FILE: 3}
    both = pl.concat([one, two])
    for day in (4, 5):
        for buckets in ([0, 1, 2], [2, 0], [1]):
            want = pl.concat([both.filter((pl.col(DAY) == day) & (pl.col(BUCKET) == b))
                              for b in buckets])
            got = spill.read_cell(spilled, day, buckets)
            assert got is not None and got.schema == both.schema
            assert got.equals(want)
        clicks = spill.read_clicks(spilled, [2, 0], through_day=day)  # (in any order)
        want = both.filter((pl.col(LABEL) == 1) & pl.col(BUCKET).is_in([0, 2])
                           & (pl.col(DAY) <= day))
        assert clicks.sort(FILE, ROW).equals(want.select(spill.CLICK_COLUMNS))
