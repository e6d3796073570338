"""BatchLoader: the RecD form equals the plain form, both equal the rows, in a fixed order."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from lrm.config import DedupConfig, GenerateConfig, VerticalConfig
from lrm.data import dedup, loader, parquet
from lrm.data.batch import Batch
from lrm.data.loader import BatchLoader
from lrm.data.schema import SESSION, part_path, read_schema, synthetic_schema
from lrm.errors import DataError
from tests.data.test_dedup import make_impressions, write_dataset

SCHEMA = synthetic_schema()
HASH = {"user_id": 7, "user_history": 5, "ad_id": 3, "advertiser_id": 11}


def _rows_of(root) -> pa.Table:
    """A dataset's impressions in stream order (a sessions dataset flattened)."""
    tabs = [parquet.read_table(f) for f in sorted(root.rglob("*.parquet"))]
    if read_schema(root)[1] == "sessions":
        tabs = [dedup.flatten_sessions(t) for t in tabs]
    return pa.concat_tables(tabs)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Three days (one missing in between) in both layouts, with small files so sessions
    straddle files of the impressions layout; a teacher_logit column rides along. Returns
    the root and each layout's rows in stream order (dedup sorts a file's sessions by
    user, so the sessions layout holds the same rows in another order)."""
    root = tmp_path_factory.mktemp("loader")
    days = {}
    for d, n in ((0, 40), (1, 25), (3, 30)):
        t = make_impressions(n, seed=20 + d, day=d, first_session=1000 * d, users=5)
        rng = np.random.default_rng(d)
        days[d] = t.append_column("teacher_logit",
                                  pa.array(rng.normal(size=t.num_rows).astype(np.float32)))
    write_dataset(root / "raw", days, rows_per_file=33)
    dedup.dedup_dataset(root / "raw", root / "sessions", DedupConfig(rows_per_file=12))
    return root, {"raw": pa.concat_tables(days.values()), "sessions": _rows_of(root / "sessions")}


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """Chunks much smaller than files, so batches and sessions cross chunk boundaries; the
    RecD form shares histories however short (the windows form, unless a test says not)."""
    monkeypatch.setattr(loader, "CHUNK_IMPRESSIONS", 13)
    monkeypatch.setattr(loader, "CHUNK_SESSIONS", 4)
    monkeypatch.setattr(loader, "WINDOWS_MIN_HISTORY", 0)


# --- helpers ----------------------------------------------------------------------------------


def _ids(v, size):
    vals = [] if v is None else [x for x in (v if isinstance(v, list) else [v]) if x is not None]
    return [x % size for x in vals] if size else vals


def reference(table: pa.Table, hash_sizes=None) -> dict[str, object]:
    """What the plain form must hold, from the rows, one row at a time."""
    hs = hash_sizes or {}
    rows = table.to_pylist()
    ref: dict[str, object] = {}
    for k in SCHEMA.sparse_features:
        per_row = [_ids(r[k], hs.get(k)) for r in rows]
        ref[k] = (np.array([len(v) for v in per_row]), np.array(sum(per_row, []), dtype=np.int64))
    ref["dense"] = np.array([[r[c] if r[c] is not None else 0.0 for c in SCHEMA.dense]
                             for r in rows], dtype=np.float32)
    ref["labels"] = np.array([r["label"] for r in rows], dtype=np.float32)
    if "teacher_logit" in table.column_names:
        ref["teacher"] = np.array([r["teacher_logit"] for r in rows], dtype=np.float32)
    return ref


def plain_arrays(b: Batch) -> dict[str, object]:
    """Per key (lengths, values) with one row per impression; the RecD form expanded."""
    b = b.session_form()
    out: dict[str, object] = {}
    for kjt, expand in ((b.user, b.deduped), (b.item, False)):
        for k, jt in kjt.to_dict().items():
            lens, vals = jt.lengths().numpy(), jt.values().numpy()
            if expand:
                offs = np.concatenate([[0], np.cumsum(lens)])
                inv = b.inverse.numpy()
                lens = lens[inv]
                vals = np.concatenate([vals[offs[i]:offs[i + 1]] for i in inv] or [vals[:0]])
            out[k] = (lens, vals)
    out["dense"], out["labels"] = b.dense.numpy(), b.labels.numpy()
    if b.teacher_logits is not None:
        out["teacher"] = b.teacher_logits.numpy()
    return out


def concat(arrays: list[dict[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in arrays[0].items():
        if isinstance(v, tuple):
            out[k] = tuple(np.concatenate([a[k][i] for a in arrays]) for i in (0, 1))
        else:
            out[k] = np.concatenate([a[k] for a in arrays])
    return out


def assert_same(a: dict[str, object], b: dict[str, object]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, tuple):
            np.testing.assert_array_equal(x[0], y[0], err_msg=f"{k} lengths")
            np.testing.assert_array_equal(x[1], y[1], err_msg=f"{k} values")
        else:
            np.testing.assert_array_equal(x, y, err_msg=k)


def check_batch_types(b: Batch, dedup_form: bool) -> None:
    B = b.size
    assert b.dense.dtype == b.labels.dtype == torch.float32
    assert b.dense.shape == (B, len(SCHEMA.dense)) and b.labels.shape == (B,)
    assert list(b.item.keys()) == list(SCHEMA.item_sparse) and b.item.stride() == B
    assert list(b.user.keys()) == list(SCHEMA.user_features)
    assert b.item.lengths().numel() == B * len(SCHEMA.item_sparse)
    if dedup_form:
        U = b.num_sessions
        assert b.inverse.dtype == torch.int64 and b.inverse.shape == (B,)
        assert b.inverse.min() == 0 and b.inverse.max() == U - 1
        assert (b.inverse.diff() >= 0).all()
        rows = b.user.stride()  # U sessions, then the history segments (windows form)
        assert b.user.lengths().numel() == rows * len(SCHEMA.user_features)
        if b.windows is None:
            assert rows == U
        else:
            w = b.windows
            assert w.keys == ["user_history"] and w.first.shape == w.end.shape == (1, U)
            assert w.segment_lengths.shape == (1, rows - U)
            lens = b.user.lengths().view(len(SCHEMA.user_features), rows)
            hist = SCHEMA.user_features.index("user_history")
            assert (lens[:hist, U:] == 0).all() and (lens[hist, :U] == 0).all()
            assert torch.equal(w.segment_lengths[0], lens[hist, U:].float())
    else:
        assert b.inverse is None and b.user.stride() == B and b.windows is None


# --- the forms ----------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["raw", "sessions"])
@pytest.mark.parametrize("batch_size", [1, 16, 97, 10_000])
def test_both_forms_hold_exactly_the_rows(data, layout, batch_size):
    root, tables = data
    ref = reference(tables[layout])
    forms = {}
    for dedup_form in (True, False):
        batches = list(BatchLoader(root / layout, batch_size, dedup=dedup_form,
                                   teacher_column="teacher_logit"))
        for b in batches:
            check_batch_types(b, dedup_form)
        forms[dedup_form] = batches
        assert_same(concat([plain_arrays(b) for b in batches]), ref)
    # batch by batch, the RecD form expanded by `inverse` is the plain form
    for bd, bp in zip(forms[True], forms[False], strict=True):
        assert_same(plain_arrays(bd), plain_arrays(bp))


@pytest.mark.parametrize("layout", ["raw", "sessions"])
@pytest.mark.parametrize("dedup_form", [True, False])
def test_batches_know_their_values_per_key_without_reading_the_device(data, layout,
                                                                     dedup_form):
    """torchrec reads a KJT's values per key in every input dist; a batch carries them,
    so a batch on a GPU is never read back for them (here: on the meta device, where
    torchrec would make counts up)."""
    root, _ = data
    batches = list(BatchLoader(root / layout, 16, dedup=dedup_form))
    assert any(b.windows is not None for b in batches) == (dedup_form and layout == "sessions")
    for b in batches:
        moved = b.to(torch.device("meta"))
        for kjt, on_meta in ((b.item, moved.item), (b.user, moved.user)):
            want = kjt.lengths().view(len(kjt.keys()), -1).sum(1).tolist()
            assert on_meta.length_per_key() == want and sum(want) == kjt.values().numel()


@pytest.mark.parametrize("layout", ["raw", "sessions"])
def test_one_user_row_per_session_in_the_batch(data, layout):
    root, tables = data
    sid = tables[layout].column(SESSION).to_numpy()
    B = 16
    loader_ = BatchLoader(root / layout, B)
    straddling = 0
    for k, b in enumerate(loader_):
        s = sid[k * B:(k + 1) * B]
        assert b.num_sessions == len(dedup.run_starts(s))  # merged across chunks and files
        np.testing.assert_array_equal(b.inverse.numpy(),
                                      np.cumsum(np.r_[True, s[1:] != s[:-1]]) - 1)
        straddling += int(k > 0 and sid[k * B - 1] == sid[k * B])
    assert straddling > 0  # some session straddles two batches (its user row in both)


def test_batch_sizes_len_and_drop_last(data):
    root, tables = data
    n = tables["raw"].num_rows
    for drop_last in (False, True):
        ld = BatchLoader(root / "sessions", 16, drop_last=drop_last)
        sizes = [b.size for b in ld]
        full, rest = divmod(n, 16)
        assert sizes == [16] * full + ([rest] if rest and not drop_last else [])
        assert len(ld) == len(sizes) and ld.num_rows() == n
    assert BatchLoader(root / "raw", 16).num_rows() == n


def test_days_filter(data):
    root, tables = data
    for layout in ("raw", "sessions"):
        table = tables[layout]
        ld = BatchLoader(root / layout, 50, days=[3, 0], dedup=False)
        got = concat([plain_arrays(b) for b in ld])
        days = table.column("day").to_numpy()
        want = reference(table.filter(pa.array(days != 1)))
        want.pop("teacher")
        assert_same(got, want)
    with pytest.raises(DataError, match=r"days \[2\]"):
        BatchLoader(root / "raw", 8, days=[0, 2])


def test_hash_sizes_map_ids_into_range(data):
    root, tables = data
    for layout in ("raw", "sessions"):
        ld = BatchLoader(root / layout, 32, hash_sizes=HASH, teacher_column="teacher_logit")
        got = concat([plain_arrays(b) for b in ld])
        assert_same(got, reference(tables[layout], HASH))
        for k, size in HASH.items():
            assert got[k][1].min() >= 0 and got[k][1].max() < size
    with pytest.raises(ValueError, match="not in the schema"):
        BatchLoader(root / "raw", 8, hash_sizes={"nope": 3})


@pytest.mark.parametrize("world_size", [2, 3])
def test_distributed_split(data, world_size):
    root, tables = data
    table = tables["sessions"]
    B = 8
    everything = list(BatchLoader(root / "sessions", B, num_workers=0))
    per_rank = [list(BatchLoader(root / "sessions", B, rank=r, world_size=world_size))
                for r in range(world_size)]
    counts = {len(p) for p in per_rank}
    assert counts == {len(everything) // world_size}
    for r, batches in enumerate(per_rank):
        assert len(BatchLoader(root / "raw", B, rank=r, world_size=world_size)) == len(batches)
        for k, b in enumerate(batches):  # rank r holds global batches r, r + W, ...
            assert_same(plain_arrays(b), plain_arrays(everything[r + k * world_size]))
    n_used = sum(b.size for p in per_rank for b in p)
    if len(everything) % world_size == 0:
        assert n_used == table.num_rows
    else:
        assert n_used < table.num_rows


def test_distributed_union_is_everything_when_divisible(data):
    root, tables = data
    table = tables["raw"]
    n = table.num_rows  # choose a batch size that splits the rows evenly across 2 ranks
    B = next(b for b in range(5, 60) if -(-n // b) % 2 == 0)
    seen = []
    for r in range(2):
        seen += [plain_arrays(b) for b in BatchLoader(root / "raw", B, rank=r, world_size=2)]
    got = sorted(seen, key=lambda a: tuple(a["dense"][0]))  # order across ranks is r::W
    want = reference(table)
    want.pop("teacher")
    assert sum(len(a["labels"]) for a in got) == n
    np.testing.assert_array_equal(np.sort(np.concatenate([a["labels"] for a in got])),
                                  np.sort(want["labels"]))
    np.testing.assert_array_equal(np.sort(np.concatenate([a["dense"] for a in got]), axis=0),
                                  np.sort(want["dense"], axis=0))


def test_prefetch_and_workers_do_not_change_the_output(data):
    root, _ = data
    outs = []
    for prefetch, workers in ((0, 0), (1, 1), (4, 2), (2, 3), (8, 1)):
        ld = BatchLoader(root / "raw", 24, prefetch=prefetch, num_workers=workers,
                         hash_sizes=HASH)
        outs.append([plain_arrays(b) for b in ld])
        assert [b["labels"].size for b in outs[-1]] == [b["labels"].size for b in outs[0]]
    for o in outs[1:]:
        for a, b in zip(o, outs[0], strict=True):
            assert_same(a, b)


def test_stopping_early_releases_the_workers(data):
    root, _ = data
    before = threading.active_count()
    for _ in range(3):
        it = iter(BatchLoader(root / "raw", 4, prefetch=2, num_workers=2))
        next(it)
        it.close()
    assert threading.active_count() == before


@pytest.mark.parametrize("world_size", [1, 2])
def test_resume_from_state_dict(data, world_size):
    root, _ = data
    ld = BatchLoader(root / "raw", 8, world_size=world_size, hash_sizes=HASH)
    full = [plain_arrays(b) for b in ld]
    assert ld.state_dict()["batch"] == len(full) == len(ld)
    it = iter(ld)
    for _ in range(5):
        next(it)
    state = ld.state_dict()
    it.close()
    assert state["batch"] == 5
    again = BatchLoader(root / "raw", 8, world_size=world_size, hash_sizes=HASH, prefetch=2,
                        num_workers=2)
    again.load_state_dict(state)
    rest = [plain_arrays(b) for b in again]
    assert len(rest) == len(full) - 5
    for a, b in zip(rest, full[5:], strict=True):
        assert_same(a, b)
    assert len(list(again)) == len(full)  # a resumed iteration does not stick
    with pytest.raises(ValueError, match="cannot resume"):
        BatchLoader(root / "raw", 16).load_state_dict(state)


def test_teacher_column(data, tmp_path):
    root, tables = data
    ld = BatchLoader(root / "sessions", 64, teacher_column="teacher_logit")
    got = np.concatenate([b.teacher_logits.numpy() for b in ld])
    np.testing.assert_array_equal(got, tables["sessions"].column("teacher_logit").to_numpy())
    assert next(iter(BatchLoader(root / "sessions", 64))).teacher_logits is None
    with pytest.raises(DataError, match="teacher_column"):
        BatchLoader(root / "raw", 64, teacher_column="teacher_logit_v2")


def test_sessions_without_impressions_are_skipped(tmp_path):
    """An empty session has no user row anywhere, even the one holding its run's items
    (the others of the run still read their windows from it)."""
    t = make_impressions(30, seed=9, users=3)
    s = dedup.share_histories(dedup.cluster(dedup._session_rows(t, SCHEMA, "x", 0), SCHEMA),
                              SCHEMA)
    hist = s.column("user_history").is_valid().to_numpy(zero_copy_only=False)
    off = s.column("user_history_offset").to_numpy()
    member = int(np.flatnonzero(~hist & (off >= 0))[0])
    head = int(np.flatnonzero(hist[:member])[-1])  # it holds the member's run's items
    per_imp = [c for c in s.column_names if c not in dedup.session_columns(SCHEMA)
               and c not in ("user_history_offset", "user_history_length")]
    rows = s.to_pylist()
    emptied = dict(rows[head], **{c: [] for c in per_imp}, session_id=-1)
    alone = dict(rows[head], **{c: [] for c in per_imp}, session_id=-2, user_history=[1, 2],
                 user_history_offset=0, user_history_length=2)  # a run of its own
    rows[head] = emptied
    rows.insert(0, alone)
    s = pa.Table.from_pylist(rows, schema=s.schema)
    path = part_path(tmp_path / "s", 0)
    path.parent.mkdir(parents=True)
    pq.write_table(s, path)
    keep = [r for r in dedup.flatten_sessions(s).to_pylist() if r["session_id"] >= 0]
    kept = pa.Table.from_pylist(keep, schema=t.schema)
    ref = reference(kept.append_column("teacher_logit", pa.nulls(len(keep), pa.float32())))
    ref.pop("teacher")
    for dedup_form in (True, False):
        batches = list(BatchLoader(tmp_path / "s", 5, dedup=dedup_form))
        if dedup_form:
            sid = kept.column(SESSION).to_numpy()
            assert [b.num_sessions for b in batches] == [
                len(dedup.run_starts(sid[k:k + 5])) for k in range(0, len(sid), 5)]
        assert_same(concat([plain_arrays(b) for b in batches]), ref)


def test_bad_arguments(data):
    root, _ = data
    with pytest.raises(ValueError):
        BatchLoader(root / "raw", 0)
    with pytest.raises(ValueError):
        BatchLoader(root / "raw", 8, rank=2, world_size=2)
    with pytest.raises(DataError, match="does not exist"):
        BatchLoader(root / "nope", 8)


# --- the required round trip ----------------------------------------------------------------------


def test_round_trip_generate_dedup_load(tmp_path, monkeypatch):
    """generate -> dedup -> load the sessions reproduces the plain form of the raw rows."""
    synthetic = pytest.importorskip("lrm.data.synthetic")
    monkeypatch.setattr(loader, "CHUNK_IMPRESSIONS", 500)
    monkeypatch.setattr(loader, "CHUNK_SESSIONS", 64)
    cfg = GenerateConfig(users=500, ads=200, advertisers=20, categories=6, days=2,
                         sessions_per_day=120, mean_session_length=4.0, max_history=12,
                         rows_per_file=150, verticals=[VerticalConfig(name="all")])
    synthetic.generate(cfg, tmp_path / "raw")
    m = dedup.dedup_dataset(tmp_path / "raw", tmp_path / "sessions",
                            DedupConfig(rows_per_file=50))
    assert m["sessions"] == 240 and m["rows"] > 240
    assert m["history_ratio"] > 1.3  # a user's sessions share their history (one surface:
    # runs of shared histories stop where the vertical changes)
    hs = {"user_id": 97, "ad_id": 50}
    plain = BatchLoader(tmp_path / "sessions", 64, dedup=False, hash_sizes=hs)
    recd = BatchLoader(tmp_path / "sessions", 64, dedup=True, hash_sizes=hs)
    assert recd.schema == plain.schema == synthetic.schema(cfg)
    assert len(recd) == len(plain) and recd.num_rows() == plain.num_rows() == m["rows"]
    n_user_rows = n_hist = n_hist_plain = 0
    got = []
    for bd, bp in zip(recd, plain, strict=True):
        assert bd.deduped and not bp.deduped and bd.windows is not None
        got.append(plain_arrays(bd))
        assert_same(got[-1], plain_arrays(bp))
        n_user_rows += bd.num_sessions
        n_hist += bd.user["user_history"].values().numel()
        n_hist_plain += bp.user["user_history"].values().numel()
    assert n_user_rows < m["rows"] / 2  # user features really were carried once per session
    assert n_hist < n_hist_plain / 5  # ... and a user's history once per batch
    raw = pa.concat_tables(parquet.read_table(f) for f in sorted((tmp_path / "raw").rglob("*.parquet")))
    ses = _rows_of(tmp_path / "sessions")
    assert_same(concat(got), reference(ses, hs))  # exactly the generated rows, reordered
    order = [("session_id", "ascending"), ("position", "ascending")]
    assert ses.sort_by(order).equals(raw.sort_by(order))


def test_windows_share_a_users_history_and_equal_the_session_form(data):
    root, tables = data
    for batch_size in (7, 64):
        shared = list(BatchLoader(root / "sessions", batch_size, hash_sizes=HASH))
        own = list(BatchLoader(root / "sessions", batch_size, hash_sizes=HASH, windows=False))
        for bw, bs in zip(shared, own, strict=True):
            assert bw.windows is not None and bs.windows is None
            sf = bw.session_form()
            assert sf.user.stride() == bs.user.stride() == bw.num_sessions
            for k in SCHEMA.user_features:
                assert torch.equal(sf.user[k].lengths(), bs.user[k].lengths()), k
                assert torch.equal(sf.user[k].values(), bs.user[k].values()), k
        looked_up = sum(b.user["user_history"].values().numel() for b in shared)
        assert looked_up < sum(b.user["user_history"].values().numel() for b in own)


def test_histories_are_shared_where_they_are_long(data, monkeypatch):
    root, _ = data
    values = sessions = 0
    for f in sorted((root / "sessions" / "day=0").glob("*.parquet"))[:1]:
        g = pq.ParquetFile(f).read_row_group(0)
        values, sessions = sum(g.column("user_history_length").to_pylist()), g.num_rows
    mean = values / sessions
    for threshold, shared in ((mean, True), (mean + 0.01, False)):
        monkeypatch.setattr(loader, "WINDOWS_MIN_HISTORY", threshold)
        assert BatchLoader(root / "sessions", 8).windows is shared
        assert not BatchLoader(root / "raw", 8).windows  # no runs to share
        assert not BatchLoader(root / "sessions", 8, dedup=False).windows
        assert BatchLoader(root / "sessions", 8, windows=not shared).windows is not shared


def test_the_first_sessions_layout_still_reads(data, tmp_path):
    """Session files from before shared histories (a list per row, no window columns):
    the same batches in the session form; a dataset mixing both is an error."""
    root, tables = data
    files = sorted((root / "sessions").rglob("*.parquet"))
    for f in files:
        out = tmp_path / "v1" / f.relative_to(root / "sessions")
        out.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(dedup.expand_histories(parquet.read_table(f), SCHEMA), out)
    old = list(BatchLoader(tmp_path / "v1", 16, hash_sizes=HASH))
    new = list(BatchLoader(root / "sessions", 16, hash_sizes=HASH))
    assert all(b.windows is None for b in old)
    for a, b in zip(old, new, strict=True):
        assert_same(plain_arrays(a), plain_arrays(b))
    pq.write_table(parquet.read_table(files[1]), tmp_path / "v1" / files[1].relative_to(
        root / "sessions"))  # one file of the new layout among old ones
    with pytest.raises(DataError, match="re-run dedup"):
        BatchLoader(tmp_path / "v1", 16)


def test_a_file_cut_inside_a_run_is_a_data_error(data, tmp_path):
    root, _ = data
    for f in sorted((root / "sessions").rglob("*.parquet")):  # a file with a shared history
        t = parquet.read_table(f)
        members = np.flatnonzero(~t.column("user_history").is_valid().to_numpy(
            zero_copy_only=False) & (t.column("user_history_offset").to_numpy() >= 0))
        if len(members):
            break
    member = int(members[0])
    path = part_path(tmp_path / "cut", 0)
    path.parent.mkdir(parents=True)
    pq.write_table(t.slice(member), path)
    with pytest.raises(DataError) as e:
        list(BatchLoader(tmp_path / "cut", 8))
    assert e.value.file == path and "re-run dedup" in str(e.value)
