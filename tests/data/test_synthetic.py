"""lrm.data.synthetic: schema, determinism, session structure, popularity, churn, drift."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from lrm import io
from lrm.config import GenerateConfig, VerticalConfig, from_dict
from lrm.errors import ConfigError
from lrm.data import synthetic
from lrm.data.synthetic import days as simulation
from lrm.data.synthetic.days import chunks
from lrm.data.synthetic.world import World
from lrm.data.schema import day_files, read_schema

USER_SIDE = ("user_id", "user_age", "user_gender", "user_geo", "user_device", "session_hour",
             "vertical")
USER_ATTRS = ("user_age", "user_gender", "user_geo", "user_device")


def tiny(**kw: object) -> GenerateConfig:
    base = dict(users=2_000, ads=500, days=2, sessions_per_day=300, seed=1)
    return GenerateConfig(**{**base, **kw})  # type: ignore[arg-type]


def col(t: pa.Table, name: str) -> np.ndarray:
    return t.column(name).to_numpy()


def session_starts(t: pa.Table) -> np.ndarray:
    """Index of the first row of each row's session (sessions are contiguous)."""
    sid = col(t, "session_id")
    new = np.r_[True, sid[1:] != sid[:-1]]
    return np.flatnonzero(new)[np.cumsum(new) - 1]


def on_vertical(t: pa.Table, j: int) -> pa.Table:
    """`t` with every session moved to vertical j (a counterfactual of the same rows)."""
    at = t.schema.get_field_index("vertical")
    return t.set_column(at, t.schema.field(at), pa.array(np.full(t.num_rows, j, np.int64)))


def ne(labels: np.ndarray, logits: np.ndarray) -> float:
    """Normalized entropy by hand: log loss over the entropy of the empirical CTR."""
    y = labels.astype(np.float64)
    p = np.clip(1 / (1 + np.exp(-logits)), 1e-12, 1 - 1e-12)
    c = y.mean()
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
                 / -(c * np.log(c) + (1 - c) * np.log(1 - c)))


def test_schema_matches_exactly_and_ids_lie_in_their_vocab() -> None:
    cfg = tiny()
    t = synthetic.generate_day(cfg, 0)
    vocab = synthetic.vocab(cfg)
    assert t.schema.equals(synthetic.schema(cfg).arrow("impressions"), check_metadata=True)
    assert synthetic.schema(cfg).verticals() == dict(enumerate(v.name for v in cfg.verticals))
    # with churn, two slots per live id (arrivals get new ids)
    assert vocab["user_id"] == 2 * cfg.users
    assert vocab["ad_id"] == vocab["user_history"] == 2 * cfg.ads
    assert synthetic.vocab(tiny(churn=0.0))["ad_id"] == cfg.ads
    assert vocab["advertiser_id"] == cfg.advertisers and vocab["ad_category"] == cfg.categories
    for name, size in vocab.items():
        arr = t.column(name).combine_chunks()
        values = arr.values if name == "user_history" else arr
        v = values.to_numpy()
        assert v.min() >= 0 and v.max() < size, name
        assert arr.null_count == 0, name
    for name in synthetic.schema(cfg).dense:
        assert np.isfinite(col(t, name)).all() and np.abs(col(t, name)).max() < 10, name


def test_same_config_same_bytes_and_seed_changes_output(tmp_path: Path) -> None:
    cfg = tiny()
    assert synthetic.generate_day(cfg, 1).equals(synthetic.generate_day(cfg, 1))
    assert not synthetic.generate_day(cfg, 1).equals(synthetic.generate_day(tiny(seed=2), 1))
    assert not synthetic.generate_day(cfg, 0).equals(synthetic.generate_day(cfg, 1))
    m1 = synthetic.generate(cfg, tmp_path / "a")
    m2 = synthetic.generate(cfg, tmp_path / "b")
    assert m1 == m2
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.parquet"))
    assert files == [Path("day=0/part-00000.parquet"), Path("day=1/part-00000.parquet")]
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()


def test_sessions_are_contiguous_and_share_user_side_columns() -> None:
    cfg = tiny()
    days = [synthetic.generate_day(cfg, d) for d in range(2)]
    for t in days:
        sid, start = col(t, "session_id"), session_starts(t)
        runs = np.count_nonzero(np.r_[True, sid[1:] != sid[:-1]])
        assert runs == len(np.unique(sid)) == cfg.sessions_per_day  # contiguous
        assert (col(t, "position") == np.arange(t.num_rows) - start).all()  # 0..n-1
        for name in USER_SIDE:
            assert (col(t, name) == col(t, name)[start]).all(), name
        hist = t.column("user_history").to_pylist()
        assert all(hist[i] == hist[s] for i, s in enumerate(start))
        lengths = np.array([len(h) for h in hist])
        assert lengths.min() >= 1 and lengths.max() <= cfg.max_history
    sids = [set(col(t, "session_id")) for t in days]
    assert not sids[0] & sids[1]  # globally unique across days
    both = pa.concat_tables(days)
    for name in USER_ATTRS:  # attributes are a function of the user, on every day
        pairs = np.unique(np.c_[col(both, "user_id"), col(both, name)], axis=0)
        assert len(pairs) == len(np.unique(col(both, "user_id"))), name
    for name in ("advertiser_id", "ad_category", "ad_format"):  # ... and of the ad
        pairs = np.unique(np.c_[col(both, "ad_id"), col(both, name)], axis=0)
        assert len(pairs) == len(np.unique(col(both, "ad_id"))), name


def test_session_length_ctr_and_history_near_targets() -> None:
    cfg = tiny(days=1, sessions_per_day=4_000, users=20_000, ads=5_000)
    t = synthetic.generate_day(cfg, 0)
    assert t.num_rows / cfg.sessions_per_day == pytest.approx(cfg.mean_session_length, abs=0.2)
    assert [v.base_ctr for v in cfg.verticals] == [None, 0.05, 0.015]  # feed: generate.base_ctr
    vertical = col(t, "vertical")
    for j, ctr in enumerate((cfg.base_ctr, 0.05, 0.015)):
        assert col(t, "label")[vertical == j].mean() == pytest.approx(ctr, rel=0.25), j
        # each vertical's intercept: the day's rows, all shown on it, click at its base rate
        truth = 1 / (1 + np.exp(-synthetic.hidden_logit(cfg, on_vertical(t, j))))
        assert truth.mean() == pytest.approx(ctr, rel=1e-3), j
    lengths = pc.list_value_length(t.column("user_history")).to_numpy()
    assert 60 <= lengths.mean() <= 95
    short = tiny(days=1, mean_session_length=1.0, base_ctr=0.1, max_history=5)
    t = synthetic.generate_day(short, 0)
    assert t.num_rows == short.sessions_per_day and (col(t, "position") == 0).all()
    assert pc.list_value_length(t.column("user_history")).to_numpy().max() <= 5


def three(**own: float) -> list[VerticalConfig]:
    """Verticals a (share 5, position 1), b (3, position 2), c (2, position 0.5) of one base
    CTR; `own` sets a vertical's own part by name."""
    return [VerticalConfig(name=n, share=share, position=position, own=own.get(n, 0.0))
            for n, share, position in (("a", 5, 1.0), ("b", 3, 2.0), ("c", 2, 0.5))]


def test_verticals_split_the_sessions_over_shared_users_and_ads() -> None:
    """A session is on one vertical, drawn with the verticals' shares, and the verticals
    see the same users and ads (what lets data of every vertical teach the shared
    structure)."""
    cfg = tiny(days=1, sessions_per_day=6_000, users=5_000, ads=2_000, verticals=three())
    t = synthetic.generate_day(cfg, 0)
    first = np.unique(session_starts(t))
    on = col(t, "vertical")
    for j, share in enumerate((0.5, 0.3, 0.2)):
        assert (on[first] == j).mean() == pytest.approx(share, abs=0.02), j
    for name, least in (("user_id", 0.6), ("ad_id", 0.9)):  # b's and c's ids: a's too
        ids = col(t, name)
        for j in (1, 2):
            assert np.isin(ids[on == j], ids[on == 0]).mean() > least, (name, j)


def test_each_vertical_has_its_own_position_effect() -> None:
    """The logit falls with the slot by the vertical's multiple of the per-format slopes:
    in each vertical's own rows the top slot's lead over slots 3+ orders as the
    multiples do, and the same rows moved from vertical to vertical change their lead
    in proportion to the multiple (b's 2 minus a's 1 is twice a's 1 minus c's 0.5)."""
    cfg = tiny(days=1, sessions_per_day=6_000, users=5_000, ads=2_000, verticals=three())
    t = synthetic.generate_day(cfg, 0)
    top, low, on = col(t, "position") == 0, col(t, "position") >= 3, col(t, "vertical")
    z = synthetic.hidden_logit(cfg, t)
    lead = [z[top & (on == j)].mean() - z[low & (on == j)].mean() for j in range(3)]
    assert lead[2] + 0.1 < lead[0] and lead[0] + 0.3 < lead[1], lead  # c < a < b
    moved = [synthetic.hidden_logit(cfg, on_vertical(t, j)) for j in range(3)]
    lead = [m[top].mean() - m[low].mean() for m in moved]
    assert lead[0] - lead[2] > 0.15, lead
    assert lead[1] - lead[0] == pytest.approx(2 * (lead[0] - lead[2]), rel=1e-6)


def test_each_vertical_has_a_part_of_the_click_function_of_its_own() -> None:
    """Moving rows to a vertical with a part of its own (`own`) shifts their logits by a
    function of the user and the ad with about that std, unrelated to another vertical's
    part; between verticals without one the shift is one constant (the intercepts)."""
    cfg = tiny(days=1, sessions_per_day=3_000, verticals=[
        VerticalConfig(name="plain"), VerticalConfig(name="x", own=0.6),
        VerticalConfig(name="y", own=0.6), VerticalConfig(name="z")])
    t = synthetic.generate_day(cfg, 0)
    z = [synthetic.hidden_logit(cfg, on_vertical(t, j)) for j in range(4)]
    x, y = z[1] - z[0], z[2] - z[0]
    assert x.std() == pytest.approx(0.6, rel=0.35) and y.std() == pytest.approx(0.6, rel=0.35)
    assert abs(np.corrcoef(x, y)[0, 1]) < 0.5
    assert (z[3] - z[0]).std() < 1e-9
    pairs = np.c_[col(t, "user_id"), col(t, "ad_id")]  # a function of (user, ad) on a day
    _, pair, count = np.unique(pairs, axis=0, return_inverse=True, return_counts=True)
    repeated = count[pair] > 1
    assert repeated.sum() > 100
    spread = np.bincount(pair, weights=x**2) / count - (np.bincount(pair, weights=x) / count)**2
    assert spread[pair[repeated]].max() < 1e-9


def test_identical_verticals_are_the_single_surface_world() -> None:
    """Verticals that differ in nothing but their name give every column of the one-vertical
    world, labels and true logits included: the vertical draw and the intercepts disturb
    nothing else (and one vertical is the world as it was before verticals)."""
    one = tiny(verticals=[VerticalConfig(name="all")])
    same = tiny(verticals=[VerticalConfig(name=n) for n in "abc"])
    a, b = synthetic.generate_day(one, 1), synthetic.generate_day(same, 1)
    assert (col(a, "vertical") == 0).all() and set(col(b, "vertical")) == {0, 1, 2}
    assert a.drop_columns(["vertical"]).equals(b.drop_columns(["vertical"]))
    np.testing.assert_array_equal(synthetic.hidden_logit(one, a), synthetic.hidden_logit(same, b))


@pytest.mark.parametrize("verticals, needle", [
    ([], "generate.verticals: list at least one vertical"),
    ([{"name": "a"}, {"name": "a"}], "generate.verticals: repeated names"),
    ([{"share": 1}], "generate.verticals[0].name: must not be empty"),
    ([{"name": "a"}, {"name": "b", "share": 0}], "generate.verticals[1].share: must be > 0"),
    ([{"name": "a", "base_ctr": 0.7}], "generate.verticals[0].base_ctr"),
    ([{"name": "a", "position": -1}], "generate.verticals[0].position: must be >= 0"),
    ([{"name": "a", "own": -0.5}], "generate.verticals[0].own: must be >= 0"),
])
def test_bad_verticals_name_the_key(verticals, needle) -> None:
    with pytest.raises(ConfigError) as e:
        from_dict(GenerateConfig, {"verticals": verticals}, "generate")
    assert needle in str(e.value)


def test_degenerate_id_spaces_still_work() -> None:
    cfg = tiny(users=1, ads=1, advertisers=1, categories=3, churn=0.5)
    t = synthetic.generate_day(cfg, 2)
    assert t.num_rows > cfg.sessions_per_day
    # one live user and one live ad (two slots each: one id or the other, by generation)
    assert len(set(col(t, "user_id"))) == len(set(col(t, "ad_id"))) == 1
    assert set(pc.list_flatten(t.column("user_history")).to_numpy()) <= {0, 1}


def test_user_and_ad_popularity_is_skewed() -> None:
    cfg = tiny(users=10_000, ads=10_000, sessions_per_day=5_000)
    t = synthetic.generate_day(cfg, 0)
    starts = np.unique(session_starts(t))
    for ids, space in ((col(t, "user_id")[starts], cfg.users), (col(t, "ad_id"), cfg.ads)):
        counts = np.sort(np.bincount(ids, minlength=space))[::-1]
        top = counts[: space // 100].sum() / counts.sum()
        assert top > 0.2, top  # the top 1% of ids get far more than 1% of the traffic


def test_churn_replaces_a_fraction_of_ids_per_day() -> None:
    ranks = np.arange(20_000)
    for churn in (0.0, 0.1, 0.3):
        pop = World(tiny(users=10**6, churn=churn)).users
        changed = (pop.ids(ranks, 0) != pop.ids(ranks, 1)).mean()
        assert changed == pytest.approx(churn, abs=0.02)
        assert (pop.ids(ranks, 3) != pop.ids(ranks, 0)).mean() == pytest.approx(
            min(3 * churn, 1.0), abs=0.04)

    def overlap(churn: float) -> float:
        """Share of day 1's impressions whose ad was already seen on day 0."""
        cfg = tiny(ads=10**6, churn=churn, sessions_per_day=1_000)
        seen = set(col(synthetic.generate_day(cfg, 0), "ad_id"))
        return float(np.isin(col(synthetic.generate_day(cfg, 1), "ad_id"), list(seen)).mean())

    stationary, churned = overlap(0.0), overlap(0.5)
    assert stationary - churned > 0.15, (stationary, churned)

    def ad_age(churn: float, day: int) -> float:
        return float(col(synthetic.generate_day(tiny(churn=churn), day), "d_ad_age").mean())

    assert ad_age(0.0, 1) > ad_age(0.0, 0)  # without churn every ad grows older


def test_arrivals_are_new_ids_and_ramp_up() -> None:
    """No two live ids are equal, an arrival's id was held by nobody in the days before it,
    an ad's age is a function of its id, and an arrival gets a fraction of its rank's
    traffic on its first day (synthetic.population.RAMP_DAYS)."""
    cfg = tiny(users=10**6, ads=20_000, churn=0.3)
    w, ranks = World(cfg), np.arange(cfg.ads)
    ids = [w.ads.ids(ranks, d) for d in range(8)]  # generations 0-3
    space, rest = synthetic.vocab(cfg)["ad_id"], int(1 / cfg.churn)
    for d in range(8):
        assert len(np.unique(ids[d])) == cfg.ads and ids[d].max() < space
    for d in range(1, 8):
        arrived = ids[d] != ids[d - 1]
        assert arrived.mean() == pytest.approx(cfg.churn, abs=0.02)
        assert not np.isin(ids[d][arrived], np.concatenate(ids[max(0, d - rest):d])).any()
    t = synthetic.generate_day(cfg, 3)
    pairs = np.unique(np.c_[col(t, "ad_id"), col(t, "d_ad_age")], axis=0)
    assert len(pairs) == len(np.unique(col(t, "ad_id")))  # one age per ad on a day

    def first_day_share(draw) -> float:  # share of draws on ranks that arrived today
        rank = draw(np.random.default_rng(0))
        return float((w.ads.age_days(rank, 3) < 1).mean())

    law = w.ads.law
    plain = first_day_share(lambda rng: law.sample(rng, 200_000))
    ramped = first_day_share(lambda rng: w.ads.sample(rng, 200_000, 3))
    weight = law.mass(ranks) * w.ads.exposure(ranks, 3)  # the ramped draw's distribution
    expected = weight[w.ads.age_days(ranks, 3) < 1].sum() / weight.sum()
    assert plain > 0.2 and ramped < 0.55 * plain, (plain, ramped)
    assert ramped == pytest.approx(expected, rel=0.05)
    still = World(tiny(churn=0.0)).ads  # without churn nothing arrives
    assert (still.sample(np.random.default_rng(0), 100, 3)
            == still.law.sample(np.random.default_rng(0), 100)).all()


def test_drift_moves_the_click_model_and_zero_drift_does_not() -> None:
    for drift in (0.0, 0.3):
        cfg = tiny(drift=drift, churn=0.0)
        t = synthetic.generate_day(cfg, 0)
        same_rows_tomorrow = synthetic.hidden_logit(cfg, t, day=1) - synthetic.hidden_logit(cfg, t)
        on = col(t, "vertical")  # the intercepts' recalibration: a constant per vertical
        spread = max(same_rows_tomorrow[on == j].std() for j in np.unique(on))
        assert (spread > 0.05) if drift else (spread < 1e-9), (drift, spread)


def test_a_huge_id_space_is_fast_and_small() -> None:
    cfg = tiny(users=10**8, ads=10**8)
    tracemalloc.start()
    t0 = time.perf_counter()
    t = synthetic.generate_day(cfg, 3)
    seconds = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert seconds < 5 and peak < 64 * 2**20, (seconds, peak)
    assert 10**7 < col(t, "user_id").max() < synthetic.vocab(cfg)["user_id"]


def test_labels_are_learnable() -> None:
    """The hidden logit, and even a small logistic regression, beat the base rate."""
    cfg = tiny(users=5_000, ads=1_000, sessions_per_day=2_000, seed=3)
    train, test = (synthetic.generate_day(cfg, d) for d in (0, 1))
    y_test = col(test, "label")
    assert ne(y_test, synthetic.hidden_logit(cfg, test)) < 0.9

    def features(t: pa.Table) -> np.ndarray:
        eye = np.eye
        return np.concatenate([
            eye(cfg.categories)[col(t, "ad_category")],
            eye(10)[np.minimum(col(t, "position"), 9)],
            eye(4)[col(t, "ad_format")],
            np.stack([col(t, c) for c in ("d_bid", "d_ad_age", "d_user_activity")], 1),
            np.ones((t.num_rows, 1)),
        ], axis=1).astype(np.float64)

    x, y = features(train), col(train, "label").astype(np.float64)
    w = np.zeros(x.shape[1])
    w[-1] = np.log(y.mean() / (1 - y.mean()))
    for _ in range(12):  # Newton steps with a little L2
        p = 1 / (1 + np.exp(-x @ w))
        hess = (x * (p * (1 - p))[:, None]).T @ x + np.eye(len(w))
        w -= np.linalg.solve(hess, x.T @ (p - y) + w * (np.arange(len(w)) < len(w) - 1))
    assert ne(y_test, features(test) @ w) < 0.99


def test_rows_per_file_splits_days_between_sessions(tmp_path: Path) -> None:
    cfg = tiny(rows_per_file=500)
    metrics = synthetic.generate(cfg, tmp_path / "raw")
    files = day_files(tmp_path / "raw")
    assert sorted(files) == [0, 1] and all(len(f) > 2 for f in files.values())
    assert read_schema(tmp_path / "raw") == (synthetic.schema(cfg), "impressions")
    for day, paths in files.items():
        parts = [pq.read_table(p) for p in paths]
        assert all(p.num_rows <= 500 for p in parts)
        sids = [set(col(p, "session_id")) for p in parts]
        assert sum(map(len, sids)) == len(set().union(*sids))  # no session in two files
        assert pa.concat_tables(parts).equals(synthetic.generate_day(cfg, day))
    assert metrics["files"] == sum(len(f) for f in files.values())
    assert metrics["bytes"] == io.dir_bytes(tmp_path / "raw")
    assert metrics["rows"] == sum(pq.read_metadata(p).num_rows for f in files.values() for p in f)
    assert metrics["sessions"] == cfg.days * cfg.sessions_per_day
    assert set(metrics["ctr_per_day"]) == {"0", "1"}
    assert 0 < metrics["users_active"] <= metrics["sessions"]
    assert 0 < metrics["ads_active"] <= cfg.ads
    assert 0 < metrics["oracle_ne"] < 1
    written = pa.concat_tables(pq.read_table(p) for f in files.values() for p in f)
    y, truth = col(written, "label"), synthetic.hidden_logit(cfg, written)
    assert metrics["oracle_ne"] == pytest.approx(ne(y, truth), rel=1e-9)  # by hand
    on = col(written, "vertical")
    assert list(metrics["verticals"]) == ["feed", "search", "video"]
    for j, m in enumerate(metrics["verticals"].values()):  # each vertical's, by hand
        assert m["rows"] == (on == j).sum() and m["ctr"] == pytest.approx(y[on == j].mean())
        assert m["oracle_ne"] == pytest.approx(ne(y[on == j], truth[on == j]), rel=1e-9)


def _sessions(t: pa.Table) -> tuple[np.ndarray, np.ndarray, list[list[int]]]:
    """(user, hour, history) of each session, in file order."""
    first = np.unique(session_starts(t))
    hist = t.column("user_history").to_pylist()
    return col(t, "user_id")[first], col(t, "session_hour")[first], [hist[i] for i in first]


def _shift(prev: list[int], cur: list[int]) -> int | None:
    """The s with cur = s new items + prev[:len(cur) - s] (a window slid by s), or None."""
    return next((s for s in range(len(cur) + 1) if cur[s:] == prev[:len(cur) - s]), None)


def test_sessions_are_logged_in_time_order_and_histories_slide():
    """A user's histories are windows of one stream: from one of her sessions to the next
    the window slides by the few ads she browsed in between (days apart too), and the day
    is logged in the order sessions happen."""
    cfg = tiny(sessions_per_day=600, users=3_000, days=2)
    days = [_sessions(synthetic.generate_day(cfg, d)) for d in range(2)]
    shifts, across = [], []
    for user, hour, hist in days:
        assert (np.diff(hour) >= 0).all()  # time order
        last: dict[int, list[int]] = {}
        for u, h in zip(user, hist, strict=True):
            if u in last:
                s = _shift(last[u], h)
                assert s is not None and len(h) == len(last[u]), (u, last[u], h)
                shifts.append(s)
            last[u] = h
    (u0, _, h0), (u1, _, h1) = days
    end_of_day0 = dict(zip(u0, h0, strict=True))  # each user's last session of day 0
    for u, h in zip(u1, h1, strict=True):
        if u in end_of_day0:
            across.append(_shift(end_of_day0.pop(u), h))
    assert len(shifts) > 300 and np.median(shifts) <= 3 and max(shifts) < cfg.max_history
    assert sum(s is not None and s < 20 for s in across) > 0.5 * len(across) > 10


def test_a_day_does_not_depend_on_the_days_generated_before():
    """The world caches drifted tables and pools across days; a day generated after later
    ones (or in a fresh world) is the same, histories reaching back a week included."""
    cfg = tiny(days=1, sessions_per_day=200)
    fresh = next(chunks(World(cfg), 9))
    w = World(cfg)
    for d in (30, 2, 9):
        got = next(chunks(w, d))
    np.testing.assert_array_equal(got.hist, fresh.hist)
    np.testing.assert_array_equal(got.imps["label"], fresh.imps["label"])
    np.testing.assert_array_equal(got.intercepts, fresh.intercepts)


def test_a_day_of_several_chunks_is_whole_in_time_order_and_calibrated(tmp_path: Path,
                                                                         monkeypatch) -> None:
    """A day of more than CHUNK_SESSIONS sessions, simulated a chunk at a time: every
    session once, in time order across the chunks, ids 0..S-1 in order, parts within a
    chunk; the same bytes run after run; the CTR and the oracle NE as the hidden model
    says (its intercept calibrated on a sample of the day)."""
    monkeypatch.setattr(simulation, "CHUNK_SESSIONS", 250)
    cfg = tiny(days=2, sessions_per_day=1_000, users=5_000, rows_per_file=1_500)
    metrics = synthetic.generate(cfg, tmp_path / "a")
    synthetic.generate(cfg, tmp_path / "b")
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.parquet"))
    assert len(files) >= 8  # at least a part per chunk
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    days = day_files(tmp_path / "a")
    for day, paths in days.items():
        t = pa.concat_tables(pq.read_table(p) for p in paths)
        assert t.equals(synthetic.generate_day(cfg, day))
        first = session_starts(t)
        sid = col(t, "session_id")[np.unique(first)]
        assert (sid == day * cfg.sessions_per_day + np.arange(cfg.sessions_per_day)).all()
        assert (np.diff(col(t, "session_hour")) >= 0).all()  # time order, chunk to chunk
        assert abs(col(t, "label").mean() - cfg.base_ctr) < 0.01
    written = pa.concat_tables(pq.read_table(tmp_path / "a" / f) for f in files)
    assert metrics["rows"] == written.num_rows
    assert metrics["oracle_ne"] == pytest.approx(
        ne(col(written, "label"), synthetic.hidden_logit(cfg, written)), rel=1e-9)
