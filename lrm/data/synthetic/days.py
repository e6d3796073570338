"""A day of the synthetic world simulated: its sessions drawn (who, when, how many ads), their
histories, verticals, impressions and labels, in time order, a chunk of sessions at a time
(`chunks`; see lrm.data.synthetic); and the hidden logit of any impressions table
(`hidden_logit`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from lrm.config import GenerateConfig
from lrm.data.schema import DAY, LABEL, POSITION
from lrm.data.synthetic.hashing import Stream, bucket, hash_ids, seeded_rng, sigmoid
from lrm.data.synthetic.world import HASH_ROWS, HOURS, World

CALIBRATION_ROWS = 1 << 16  # impressions the intercept is calibrated on
# sessions simulated at once (a chunk: ~400k impressions, whose simulation and table peak at
# ~1.3 GB with the default 100-ad histories); a larger day is simulated in chunks (see
# lrm.data.synthetic)
CHUNK_SESSIONS = 50_000


def calibrate(raw: np.ndarray, ctr: float) -> float:
    """The intercept b with mean(sigmoid(raw + b)) == ctr (bisection)."""
    lo, hi = -30.0, 30.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sigmoid(raw + mid).mean() < ctr:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2




@dataclass
class Day:
    """A chunk of a simulated day (all of it when it fits one): sessions [first, first + S)
    of the day, session-level and impression-level columns."""

    day: int
    first: int  # the day's index of the first session
    sessions: dict[str, np.ndarray]  # per session: user-side columns
    imp_off: np.ndarray  # [S + 1] impression offsets of each session
    hist_off: np.ndarray  # [S + 1] offsets into `hist`
    hist: np.ndarray  # flat history ad ids, most recent first
    imps: dict[str, np.ndarray]  # per impression: position, label, item-side, dense
    logit: np.ndarray  # hidden calibrated logit per impression
    intercepts: np.ndarray  # [verticals] each vertical's calibrated intercept
    sess_index: np.ndarray  # [n] session (of the chunk) of each impression

    @property
    def rows(self) -> int:
        return int(self.imp_off[-1])


_DRAWS = np.dtype([("rank", np.int64), ("hours", np.float64), ("activity", np.float64),
                   ("n_imp", np.int64)])  # a session's own draws (as spilled to disk)


def _key(k: int) -> tuple[int, ...]:
    """The seed-sequence suffix of chunk or block k (none for the first: a day of one
    chunk draws as before chunks were)."""
    return (k,) if k else ()


def _session_draws(w: World, day: int, block: int, size: int) -> np.ndarray:
    """The own draws of `size` sessions of `day` (block `block` of them), as drawn."""
    cfg = w.cfg
    rs = seeded_rng(cfg.seed, day, Stream.SESSIONS, *_key(block))
    out = np.empty(size, _DRAWS)
    out["rank"] = rank = w.users.sample(rs, size, day)
    pref = w.user_attributes(w.users.ids(rank, day))["hour_pref"]
    out["hours"] = (pref + 0.5 + rs.normal(0, 2.5, size)) % HOURS  # time of day (hours)
    out["activity"] = np.log(cfg.users * w.users.law.mass(rank)) + rs.normal(0, 0.3, size)
    out["n_imp"] = 1 + rs.poisson(cfg.mean_session_length - 1, size)
    return out


def _simulate(w: World, day: int, draws: np.ndarray, *, chunk: int = 0, first: int = 0,
              intercepts: np.ndarray | None = None) -> Day:
    """Sessions of `day` with these own draws, in their order, as chunk `chunk`: their
    histories, verticals, impressions and labels (the intercepts calibrated on their
    impressions unless given)."""
    cfg = w.cfg
    S = len(draws)
    rank, hours, activity, n_imp = (draws[k] for k in _DRAWS.names)
    uid = w.users.ids(rank, day)
    attrs = w.user_attributes(uid)
    hist_len = attrs["hist_len"]
    sessions = {"user_id": uid, **{c: attrs[c] for c in
                                   ("user_age", "user_gender", "user_geo", "user_device")},
                "session_hour": np.minimum(hours.astype(np.int64), HOURS - 1),  # (-0.0 % 24: 24.0)
                # the surface the session is on: its own stream, so the rest of the day is
                # the same whatever the verticals
                "vertical": seeded_rng(cfg.seed, day, Stream.VERTICAL, *_key(chunk)).choice(
                    len(w.share), S, p=w.share)}

    base, rate = w.stream(uid, rank)
    pos = base + np.floor(rate * (day + hours / HOURS)).astype(np.int64)
    hist, hist_cat, hist_adv = w.history(day, uid, attrs["user_age"], attrs["user_geo"], base,
                                         rate, pos, hist_len)
    hist_off = np.concatenate([[0], np.cumsum(hist_len)])

    ri = seeded_rng(cfg.seed, day, Stream.IMPRESSIONS, *_key(chunk))
    imp_off = np.concatenate([[0], np.cumsum(n_imp)])
    n = int(imp_off[-1])
    seg = np.repeat(np.arange(S), n_imp)
    arank = w.ads.sample(ri, n, day)
    aid = w.ads.ids(arank, day)
    ad = w.ad_attributes(aid)
    log_bid = (w.adv_bid[bucket(hash_ids(ad["advertiser_id"], w.salt["bid"]), HASH_ROWS)]
               + 0.4 * ad["quality"] + ri.normal(0, 0.3, n))
    # Auction: within a session, ads are shown in order of a noisy eCPM score.
    ecpm = log_bid + 0.5 * ad["quality"] + ri.normal(0, 0.5, n)
    order = np.lexsort((-ecpm, seg))
    aid, arank, log_bid = aid[order], arank[order], log_bid[order]
    ad = {k: v[order] for k, v in ad.items()}
    position = np.arange(n) - imp_off[seg]
    imps = {
        POSITION: position.astype(np.int16),
        "ad_id": aid, "advertiser_id": ad["advertiser_id"], "ad_category": ad["ad_category"],
        "ad_format": ad["ad_format"],
        "d_position": np.log1p(position).astype(np.float32),
        "d_user_activity": ((activity[seg] - 3.9) / 3.5).astype(np.float32),
        "d_ad_age": ((np.log1p(w.ads.age_days(arank, day)) - 2.0) / 0.8).astype(np.float32),
        "d_bid": (log_bid / 0.8).astype(np.float32),
    }
    feats = {**{k: v[seg] for k, v in sessions.items()}, **imps,
             **w.history_features(hist_off, hist_cat, hist_adv, seg, ad["ad_category"],
                                  ad["advertiser_id"])}
    raw = w.raw_logit(day, feats)
    if intercepts is None:
        intercepts = _intercepts(w, day, feats, raw)
    logit = raw + intercepts[feats["vertical"]]
    imps[LABEL] = (seeded_rng(cfg.seed, day, Stream.LABELS, *_key(chunk)).random(n)
                   < sigmoid(logit)).astype(np.int8)
    return Day(day=day, first=first, sessions=sessions, imp_off=imp_off, hist_off=hist_off,
                hist=hist, imps=imps, logit=logit, intercepts=intercepts, sess_index=seg)


def _intercepts(w: World, day: int, feats: dict[str, np.ndarray], raw: np.ndarray
                ) -> np.ndarray:
    """Each vertical's intercept: the one that makes the day's mean click probability
    that vertical's base CTR had every impression been shown there. Calibrated on
    CALIBRATION_ROWS rows spread evenly over the day (rows are in time order, and the hour
    moves the click rate), each given that vertical's terms in place of its own."""
    n = len(raw)
    at = np.linspace(0, n - 1, min(n, CALIBRATION_ROWS)).astype(np.int64)
    f = {k: v[at] for k, v in feats.items()}
    uv = (w.user_latent(day, f["user_id"], f["user_age"], f["user_geo"])
          * w.ad_latent(f["ad_id"], f["advertiser_id"], f["ad_category"]))
    now = sum(w.vertical_terms(uv, f, f["vertical"]).values())
    out = np.empty(len(w.share))
    for j, ctr in enumerate(w.vertical_ctr):
        alt = sum(w.vertical_terms(uv, f, np.full(len(at), j)).values())
        # rows on j keep their raw logit exactly (one vertical: the calibration of before)
        out[j] = calibrate(raw[at] + np.where(f["vertical"] == j, 0.0, alt - now), ctr)
    return out


def _time_ordered(draws: np.ndarray) -> np.ndarray:
    return draws[np.argsort(draws["hours"], kind="stable")]


def _calibration(w: World, day: int, blocks: int, draws: np.ndarray) -> np.ndarray:
    """The intercepts of a day of several chunks: calibrated on the impressions of the first
    sessions of its first block (drawn i.i.d. over the day), with their own impression
    draws (those of chunk `blocks`, one past the last)."""
    enough = int(np.searchsorted(np.cumsum(draws["n_imp"]), CALIBRATION_ROWS)) + 1
    return _simulate(w, day, draws[:enough], chunk=blocks).intercepts


def chunks(w: World, day: int) -> Iterator[Day]:
    """Day `day` in time order, a chunk of at most about CHUNK_SESSIONS sessions at a time
    (see lrm.data.synthetic)."""
    S = w.cfg.sessions_per_day
    k = -(-S // CHUNK_SESSIONS)
    if k == 1:
        yield _simulate(w, day, _time_ordered(_session_draws(w, day, 0, S)))
        return
    sizes = [min(CHUNK_SESSIONS, S - b * CHUNK_SESSIONS) for b in range(k)]
    with tempfile.TemporaryDirectory(prefix="lrm-generate-") as tmp:
        slices = [Path(tmp) / f"slice-{j}" for j in range(k)]
        edges = intercepts = None
        for b, size in enumerate(sizes):
            draws = _session_draws(w, day, b, size)
            if edges is None:  # time slices of about equal counts
                edges = np.quantile(draws["hours"], np.arange(1, k) / k)
                intercepts = _calibration(w, day, k, draws)
            cut = np.searchsorted(edges, draws["hours"], side="right")
            for j in range(k):
                with open(slices[j], "ab") as f:
                    draws[cut == j].tofile(f)
        first = 0
        for j, path in enumerate(slices):
            draws = _time_ordered(np.fromfile(path, _DRAWS))
            path.unlink()
            if len(draws):
                yield _simulate(w, day, draws, chunk=j, first=first,
                                intercepts=intercepts)
            first += len(draws)


def _day_intercepts(w: World, day: int) -> np.ndarray:
    """The calibrated intercepts (one a vertical) of day `day`'s click model (as `chunks`
    finds them)."""
    S = w.cfg.sessions_per_day
    if S <= CHUNK_SESSIONS:
        return next(chunks(w, day)).intercepts
    k = -(-S // CHUNK_SESSIONS)
    return _calibration(w, day, k, _session_draws(w, day, 0, CHUNK_SESSIONS))


def _table_features(w: World, table: pa.Table) -> dict[str, np.ndarray]:
    """The click model's inputs for the rows of an impressions table."""
    f = {c: table.column(c).to_numpy() for c in (*w.schema.user_sparse, POSITION,
                                                 *w.schema.item_sparse, *w.schema.dense)}
    hist = table.column("user_history").combine_chunks()
    hist_off = hist.offsets.to_numpy().astype(np.int64)
    h0 = int(hist_off[0])  # a sliced column's offsets need not start at 0
    hist_off -= h0
    values = w.ad_attributes(hist.values.to_numpy()[h0:h0 + hist_off[-1]])
    f.update(w.history_features(hist_off, values["ad_category"], values["advertiser_id"],
                                np.arange(table.num_rows), f["ad_category"],
                                f["advertiser_id"]))
    return f


def hidden_logit(cfg: GenerateConfig, table: pa.Table, day: int | None = None) -> np.ndarray:
    """The ground-truth click logit of each impression row of `table`.

    Uses the click model of each row's own `day` (or of `day` for every row), with that
    day's calibrated intercept (found by simulating the day). sigmoid of it is the true
    click probability; its NE on the labels is the best any model can do.
    """
    w = World(cfg)
    days = table.column(DAY).to_numpy()
    if day is not None:
        days = np.full(len(days), day, days.dtype)
    f = _table_features(w, table)
    out = np.empty(table.num_rows)
    for d in np.unique(days):
        m = days == d
        raw = w.raw_logit(int(d), {k: v[m] for k, v in f.items()})
        out[m] = raw + _day_intercepts(w, int(d))[f["vertical"][m]]
    return out
