"""RecD dedup: impressions <-> sessions on hand-made tables, and whole datasets on disk."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lrm.config import DedupConfig
from lrm.data import dedup, parquet
from lrm.data.schema import (
    SESSION,
    FeatureSchema,
    day_files,
    part_path,
    read_schema,
    synthetic_schema,
)
from lrm.errors import DataError

SCHEMA = synthetic_schema()


def make_impressions(n_sessions: int, seed: int = 0, day: int = 0, first_session: int = 0,
                     schema: FeatureSchema = SCHEMA, max_len: int = 5, users: int = 0,
                     verticals: int = 3) -> pa.Table:
    """A small impressions-layout table with every awkward case: one-impression sessions,
    null and empty histories, nulls inside histories, null ids, null dense.

    Sessions come from `users` users (default n_sessions // 3, the user key never null),
    in no order; a user's histories are windows sliding over her own stream (0-3 new items
    from one of her sessions to the next, a window of up to 8), so sorted together they
    share most of it."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, max_len + 1, n_sessions)
    lens[::4] = 1
    n = int(lens.sum())
    rep = np.repeat(np.arange(n_sessions), lens)
    sid = (first_session + rng.permutation(n_sessions * 3)[:n_sessions])[rep]
    user = rng.integers(0, max(1, users or n_sessions // 3), n_sessions)

    def ids(k: int, hi: int, null_p: float) -> pa.Array:
        v = rng.integers(0, hi, k)
        return pa.array(v, mask=rng.random(k) < null_p, type=pa.int64())

    cols: dict[str, pa.Array] = {
        "day": pa.array(np.full(n, day, dtype=np.int32)),
        "session_id": pa.array(sid, type=pa.int64()),
    }
    for i, c in enumerate(schema.user_sparse):
        if c == schema.user_key:
            cols[c] = pa.array(user[rep], type=pa.int64())
            continue
        if c == schema.vertical:  # its own generator: the other columns stay those drawn
            vertical = np.random.default_rng([seed, 1]).integers(0, verticals, n_sessions)
            cols[c] = pa.array(vertical[rep], type=pa.int64())  # before verticals
            continue
        cols[c] = ids(n_sessions, 50, 0.2 if i % 2 else 0.0).take(pa.array(rep))
    for c in schema.user_seq:
        window = rng.integers(1, 9, max(user) + 1)[user]  # each user's history length
        pos = np.zeros(n_sessions, np.int64)  # each user's stream position, session by session
        at = {}
        for k in range(n_sessions):
            at[user[k]] = pos[k] = at.get(user[k], 20) + int(rng.integers(0, 4))
        stream = rng.integers(0, 30, (max(user) + 1, int(pos.max()) + 1))
        hist = [[int(x) for x in stream[u, max(0, p - w):p][::-1]]
                for u, p, w in zip(user, pos, window, strict=True)]
        for k in range(1, n_sessions, 5):
            hist[k] = []
        for k in range(3, n_sessions, 11):  # a null inside
            hist[k] = hist[k][:1] + [None] + hist[k][1:]
        nulls = (rng.random(n_sessions) < 0.1) | (np.arange(n_sessions) % 7 == 2)
        cols[c] = pa.array([None if z else h for h, z in zip(hist, nulls, strict=True)],
                           type=pa.list_(pa.int64())).take(pa.array(rep))
    pos = np.concatenate([np.arange(k) for k in lens]).astype(np.int16)
    cols["position"] = pa.array(pos)
    cols["label"] = pa.array((rng.random(n) < 0.3).astype(np.int8))
    for c in schema.item_sparse:
        cols[c] = ids(n, 40, 0.1)
    for c in schema.dense:
        cols[c] = pa.array(rng.random(n).astype(np.float32), mask=rng.random(n) < 0.1)
    return pa.Table.from_pydict(cols, schema=schema.arrow("impressions"))


def write_dataset(root, tables_by_day: dict[int, pa.Table], rows_per_file: int) -> None:
    """Impressions-layout dataset, `rows_per_file` rows per file (sessions may straddle)."""
    for day, t in tables_by_day.items():
        for part, start in enumerate(range(0, t.num_rows, rows_per_file)):
            path = part_path(root, day, part)
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(t.slice(start, rows_per_file), path)


# --- tables -------------------------------------------------------------------------------


def test_dedup_then_flatten_is_the_identity():
    t = make_impressions(40, seed=1)
    s = dedup.dedup_table(t, SCHEMA)
    assert s.schema.metadata[b"lrm.layout"] == b"sessions"
    assert s.num_rows == len(set(t.column(SESSION).to_pylist())) == 40
    assert s.schema.remove_metadata().equals(SCHEMA.arrow("sessions").remove_metadata())
    back = dedup.flatten_sessions(s)
    assert back.equals(t)
    assert back.schema.equals(t.schema, check_metadata=True)


def test_session_rows_hold_user_fields_once_and_impressions_as_lists():
    t = make_impressions(12, seed=2)
    s = dedup.expand_histories(dedup.dedup_table(t, SCHEMA), SCHEMA)
    rows, sess = t.to_pylist(), s.to_pylist()
    i = 0
    for row in sess:
        k = len(row["label"])
        assert k >= 1
        for j in range(k):
            r = rows[i + j]
            for c in dedup.session_columns(SCHEMA):
                assert r[c] == row[c]
            for c in ("position", "label", *SCHEMA.item_sparse, *SCHEMA.dense):
                assert r[c] == row[c][j]
        i += k
    assert i == t.num_rows
    # one-impression sessions, empty and null histories are all present
    assert any(len(r["label"]) == 1 for r in sess)
    assert any(r["user_history"] == [] for r in sess)
    assert any(r["user_history"] is None for r in sess)


def test_extra_per_impression_columns_travel_as_lists():
    t = make_impressions(10, seed=3)
    t = t.append_column("teacher_logit", pa.array(np.linspace(-1, 1, t.num_rows, dtype=np.float32)))
    s = dedup.dedup_table(t, SCHEMA)
    assert s.schema.field("teacher_logit").type == pa.list_(pa.float32())
    assert dedup.flatten_sessions(s).equals(t)


def test_empty_table():
    t = make_impressions(3).slice(0, 0)
    s = dedup.dedup_table(t, SCHEMA)
    assert s.num_rows == 0
    assert dedup.flatten_sessions(s).num_rows == 0


def test_non_contiguous_session_names_the_session():
    t = make_impressions(6, seed=4)
    sid = t.column(SESSION).to_numpy().copy()
    first = sid[0]
    sid[-1] = first  # the first session comes back at the very end
    t = t.set_column(1, SESSION, pa.array(sid))
    with pytest.raises(DataError) as e:
        dedup.dedup_table(t, SCHEMA, source="x.parquet")
    assert e.value.field == SESSION and str(e.value.file) == "x.parquet"
    assert f"session {first} " in str(e.value) and "contiguous" in str(e.value)


@pytest.mark.parametrize("field", ["user_age", "user_gender", "user_history", "day"])
def test_non_constant_user_field_names_session_and_field(field):
    t = make_impressions(8, seed=5, max_len=4)
    lens = np.diff(np.flatnonzero(np.r_[True, np.diff(t.column(SESSION).to_numpy()) != 0,
                                        True]))
    s_idx = int(np.flatnonzero(lens > 1)[0])  # a session with at least two rows
    row = int(lens[:s_idx].sum()) + 1  # its second row
    rows = t.to_pylist()
    old = rows[row][field]
    rows[row][field] = ([7, 7] if old != [7, 7] else [8]) if field == "user_history" else (
        None if old is not None and field == "user_gender" else (old or 0) + 1)
    bad = pa.Table.from_pylist(rows, schema=t.schema)
    with pytest.raises(DataError) as e:
        dedup.dedup_table(bad, SCHEMA, source="f.parquet")
    assert e.value.field == field
    assert f"session {rows[row]['session_id']} " in str(e.value)


def test_wrong_layout_is_a_data_error():
    s = dedup.dedup_table(make_impressions(4), SCHEMA)
    with pytest.raises(DataError, match="layout"):
        dedup.dedup_table(s, SCHEMA)
    with pytest.raises(DataError, match="layout"):
        dedup.flatten_sessions(make_impressions(4), SCHEMA)


def test_flatten_rejects_ragged_sessions():
    s = dedup.dedup_table(make_impressions(4, seed=6), SCHEMA)
    lab = s.column("label").to_pylist()
    lab[0] = lab[0] + [1]
    s = s.set_column(s.schema.get_field_index("label"), "label", pa.array(lab, pa.list_(pa.int8())))
    with pytest.raises(DataError, match="entries"):
        dedup.flatten_sessions(s)


# --- datasets -------------------------------------------------------------------------------


def _read_day(root, day, flatten=False):
    tabs = [parquet.read_table(f) for f in day_files(root)[day]]
    if flatten:
        tabs = [dedup.flatten_sessions(t) for t in tabs]
    return pa.concat_tables(tabs)


def _by_user(t: pa.Table, sessions_per_file: int) -> pa.Table:
    """What dedup writes, by hand: the rows of every `sessions_per_file` sessions (in input
    order), those sessions ordered by user id (None last), then vertical, in input order per
    user and vertical."""
    rows = t.to_pylist()
    sessions: list[list[dict]] = []
    for r in rows:
        if not sessions or sessions[-1][0][SESSION] != r[SESSION]:
            sessions.append([])
        sessions[-1].append(r)
    out = []
    for k in range(0, len(sessions), sessions_per_file):
        part = sessions[k:k + sessions_per_file]
        part = sorted(part, key=lambda ss: (ss[0]["user_id"] is None, ss[0]["user_id"] or 0,
                                            ss[0].get("vertical", 0)))
        out += [r for ss in part for r in ss]
    return pa.Table.from_pylist(out, schema=t.schema)


def test_dedup_dataset_streams_and_never_splits_a_session(tmp_path):
    src, dst = tmp_path / "raw", tmp_path / "sessions"
    days = {d: make_impressions(60, seed=10 + d, day=d) for d in (0, 1, 3)}
    write_dataset(src, days, rows_per_file=37)  # sessions straddle input files
    m = dedup.dedup_dataset(src, dst, DedupConfig(rows_per_file=16), chunk_rows=23)
    assert m["rows"] == sum(t.num_rows for t in days.values())
    assert m["sessions"] == 180
    assert m["dedup_ratio"] == pytest.approx(m["rows"] / 180)
    assert m["bytes_out"] > 0
    assert m["storage_ratio"] == pytest.approx(m["bytes_in"] / m["bytes_out"])
    assert read_schema(dst) == (SCHEMA, "sessions")
    files = day_files(dst)
    assert sorted(files) == [0, 1, 3]
    for d, t in days.items():
        counts = [pq.read_metadata(f).num_rows for f in files[d]]
        assert counts == [16, 16, 16, 12]
        assert _read_day(dst, d, flatten=True).equals(_by_user(t, 16))


def test_a_users_sessions_share_one_stored_history(tmp_path, monkeypatch):
    """Sorted by user, a user's sliding histories are stored once per run; a run never
    crosses a row group (each row group reads on its own); the metrics count both."""
    monkeypatch.setattr(parquet, "ROW_GROUP_IMPRESSIONS", 8 * 7)  # 7 sessions a row group
    t = make_impressions(80, seed=12, users=4, verticals=1)  # runs stop at a vertical
    write_dataset(tmp_path / "raw", {0: t}, rows_per_file=1000)
    m = dedup.dedup_dataset(tmp_path / "raw", tmp_path / "s", DedupConfig(rows_per_file=40))
    (f0, f1) = day_files(tmp_path / "s")[0]
    whole = dedup.expand_histories(parquet.read_table(f0), SCHEMA)
    by_hand = _by_user(t, 40)
    hist = dedup.flatten_sessions(parquet.read_table(f0)).column("user_history").to_pylist()
    assert hist == by_hand.slice(0, len(hist)).column("user_history").to_pylist()
    carried = sum(len(h or []) for h in whole.column("user_history").to_pylist())
    pf = pq.ParquetFile(f0)
    assert pf.num_row_groups == 6
    for k in range(pf.num_row_groups):  # every row group on its own
        g = pf.read_row_group(k)
        assert dedup.expand_histories(g, SCHEMA).column("user_history").equals(
            whole.column("user_history").slice(7 * k, g.num_rows))
    stored = parquet.read_table(f0).column("user_history").to_pylist()
    own = whole.column("user_history").to_pylist()

    def slides(prev, cur):  # cur = new items + prev's first len(cur) - s items, for some s
        clean = prev and cur and None not in prev and None not in cur
        return clean and any(cur[s:] == prev[:len(cur) - s] for s in range(len(cur))
                             if len(cur) - s <= len(prev))

    shared = cut = 0
    for i in range(len(own)):  # stored exactly where the history does not slide on
        if i % 7 and slides(own[i - 1], own[i]):
            assert stored[i] is None, i
            shared += 1
        else:  # a run's first row: its items (None only for a null history)
            assert (stored[i] is None) == (own[i] is None), i
            cut += i % 7 == 0 and i > 0 and bool(slides(own[i - 1], own[i]))
    assert shared >= 5 and cut >= 1  # (a row group cut a run at least once)
    assert sum(len(h) for h in stored if h) < carried
    both = [parquet.read_table(f) for f in (f0, f1)]
    assert m["history_values"] == sum(
        len(h or []) for b in both
        for h in dedup.expand_histories(b, SCHEMA).column("user_history").to_pylist())
    assert m["history_values_stored"] == sum(
        len(h) for b in both for h in b.column("user_history").to_pylist() if h)
    assert m["history_ratio"] == pytest.approx(m["history_values"] / m["history_values_stored"])


def test_flatten_reads_the_first_sessions_layout():
    """A file written before histories were shared (version 1: every row its own list, no
    window columns) still flattens to its rows."""
    t = make_impressions(20, seed=13)
    s = dedup.dedup_table(t, SCHEMA)
    v1 = dedup.expand_histories(s, SCHEMA)
    assert b"lrm.layout_version" not in v1.schema.metadata
    assert not {"user_history_offset", "user_history_length"} & set(v1.column_names)
    assert dedup.flatten_sessions(v1).equals(t)


def test_a_window_without_its_run_is_a_data_error():
    t = make_impressions(40, seed=14, users=4)
    s = dedup.share_histories(dedup.cluster(dedup._session_rows(t, SCHEMA, "x", 0), SCHEMA),
                              SCHEMA)
    member = int(np.flatnonzero(~s.column("user_history").is_valid().to_numpy(
        zero_copy_only=False) & (s.column("user_history_offset").to_numpy() >= 0))[0])
    with pytest.raises(DataError) as e:  # cut inside a run
        dedup.flatten_sessions(s.slice(member), source="cut.parquet")
    assert e.value.field == "user_history" and "row 0" in str(e.value)
    assert "re-run dedup" in str(e.value) and str(e.value.file) == "cut.parquet"
    off = s.column("user_history_offset").to_numpy().copy()
    off[member] += 100  # past its run's items
    bad = s.set_column(s.schema.get_field_index("user_history_offset"), "user_history_offset",
                       pa.array(off))
    with pytest.raises(DataError, match=f"row {member}"):
        dedup.flatten_sessions(bad)


def test_dedup_dataset_finds_a_session_split_across_files(tmp_path):
    t = make_impressions(20, seed=7, day=1)
    sid = t.column(SESSION).to_numpy().copy()
    sid[-1] = sid[0]  # session comes back, in the second file of day 1
    t = t.set_column(1, SESSION, pa.array(sid))
    write_dataset(tmp_path / "raw", {0: make_impressions(30, seed=8), 1: t},
                  rows_per_file=t.num_rows - 1)
    with pytest.raises(DataError) as e:
        dedup.dedup_dataset(tmp_path / "raw", tmp_path / "out", DedupConfig(), chunk_rows=8)
    assert e.value.field == SESSION and f"session {sid[0]} " in str(e.value)
    assert "day=1" in str(e.value.file) and "part-00001" in str(e.value.file)


def test_dedup_dataset_error_names_the_row_in_its_file(tmp_path):
    t = make_impressions(40, seed=11)
    sid = t.column(SESSION).to_numpy()
    rows_per_file = 50
    # the second row of a session that lies inside the second file
    row = next(i for i in range(rows_per_file + 10, t.num_rows)
               if sid[i] == sid[i - 1] and sid[i - 1] == sid[i - 2])
    rows = t.to_pylist()
    rows[row]["user_geo"] = 999
    write_dataset(tmp_path / "raw", {0: pa.Table.from_pylist(rows, schema=t.schema)},
                  rows_per_file=rows_per_file)
    with pytest.raises(DataError) as e:
        dedup.dedup_dataset(tmp_path / "raw", tmp_path / "out", DedupConfig(), chunk_rows=7)
    assert e.value.field == "user_geo" and "part-00001" in str(e.value.file)
    assert f"session {sid[row]} " in str(e.value)
    assert f"(row {row - rows_per_file} differs" in str(e.value)


def test_dedup_dataset_rejects_sessions_layout_and_wrong_day(tmp_path):
    src = tmp_path / "raw"
    write_dataset(src, {0: make_impressions(5)}, rows_per_file=100)
    dedup.dedup_dataset(src, tmp_path / "s", DedupConfig())
    with pytest.raises(DataError, match="impressions layout"):
        dedup.dedup_dataset(tmp_path / "s", tmp_path / "s2", DedupConfig())
    wrong = tmp_path / "wrong"
    write_dataset(wrong, {2: make_impressions(5, day=1)}, rows_per_file=100)
    with pytest.raises(DataError, match="day=2"):
        dedup.dedup_dataset(wrong, tmp_path / "w2", DedupConfig())


def test_a_day_holding_a_users_file_is_never_skipped_nor_replaced_unasked(tmp_path):
    """A day's folder whose file the user replaced is not up to date (its input did not
    change, but it no longer holds what dedup wrote): the run stops naming the file, the
    user's file kept; with force it is made again."""
    from lrm.errors import OutputError

    write_dataset(tmp_path / "raw", {0: make_impressions(30, seed=1)}, rows_per_file=1000)
    dedup.update(tmp_path / "raw", tmp_path / "sessions", DedupConfig())
    part = day_files(tmp_path / "sessions")[0][0]
    made = part.read_bytes()
    part.write_bytes(b"the user's own file now")
    with pytest.raises(OutputError, match=rf"{part.name} \(changed since lrm wrote it\)"):
        dedup.update(tmp_path / "raw", tmp_path / "sessions", DedupConfig())
    assert part.read_bytes() == b"the user's own file now"
    m = dedup.update(tmp_path / "raw", tmp_path / "sessions", DedupConfig(), force=True)
    assert m["written"] == [0] and part.read_bytes() == made


def test_a_day_stored_in_an_older_session_order_is_made_again(tmp_path, monkeypatch):
    """Days written vertical after vertical (before the order became user, then vertical)
    trained every-vertical models badly; an update with the same input and settings must
    not keep them."""
    write_dataset(tmp_path / "raw", {0: make_impressions(30, seed=1)}, rows_per_file=1000)
    monkeypatch.setattr(dedup, "CLUSTER_ORDER", "vertical,user")
    dedup.update(tmp_path / "raw", tmp_path / "sessions", DedupConfig())
    monkeypatch.undo()
    assert dedup.update(tmp_path / "raw", tmp_path / "sessions", DedupConfig())["written"] == [0]
    assert dedup.update(tmp_path / "raw", tmp_path / "sessions", DedupConfig())["skipped"] == [0]


def test_numbers_stored_as_text_do_not_fit_the_layout(tmp_path):
    t = make_impressions(30, seed=1)
    i = t.schema.get_field_index("label")
    t = t.set_column(i, "label", pa.array([str(x) for x in t.column("label").to_pylist()]))
    write_dataset(tmp_path / "raw", {0: t}, rows_per_file=1000)
    with pytest.raises(DataError, match="field label: type string does not fit"):
        dedup.update(tmp_path / "raw", tmp_path / "sessions", DedupConfig())


def test_a_days_session_ids_are_kept_as_runs():
    """dedup checks a day's sessions for repeats in memory that does not grow with the day
    when ids count up (one run of a million ids, in chunks); ids out of order or with gaps
    are runs too, and a repeat anywhere in a run is named with its file."""
    seen = dedup._SessionIds()
    for c in range(100):
        seen.add(np.arange(c * 10_000, (c + 1) * 10_000), Path("a.parquet"))
    assert (seen.lo.tolist(), seen.hi.tolist()) == ([0], [999_999])
    other = dedup._SessionIds()
    for ids in ([20, 21, 22], [5, 7], [10, 11], [6, 8, 9]):  # out of order, with gaps
        other.add(np.array(ids), Path("b.parquet"))
    assert (other.lo.tolist(), other.hi.tolist()) == ([5, 20], [11, 22])
    with pytest.raises(DataError, match="session 5 is not contiguous") as e:
        other.add(np.array([30, 3, 4, 5, 6]), Path("c.parquet"))
    assert str(e.value.file) == "c.parquet" and e.value.field == SESSION
