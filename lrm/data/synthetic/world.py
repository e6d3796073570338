"""The synthetic world's click model (`World`): everything about it that does not depend on
a day's draws (its tables, biases and crosses, each vertical's own term, the drift of
interests day by day, the ads a day's histories are drawn from), and the logit of an
impression given its features. See lrm.data.synthetic for the model it draws.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from lrm.config import GenerateConfig
from lrm.data.schema import POSITION, FeatureSchema, synthetic_schema
from lrm.data.synthetic.hashing import (
    GOLDEN, U64, Stream, bucket, categorical, hash_ids, salt_of, seeded_rng, to_unit,
    unit_rows,
)
from lrm.data.synthetic.population import PowerLaw, Population, id_space

AGE_P = (0.08, 0.2, 0.24, 0.2, 0.14, 0.09, 0.05)  # user_age buckets
GENDER_P = (0.05, 0.48, 0.47)  # user_gender; 0 is "unknown"
DEVICE_P = (0.55, 0.3, 0.1, 0.05)  # user_device
FORMAT_P = (0.5, 0.25, 0.15, 0.1)  # ad_format (a function of the ad)
GEOS, HOURS = 64, 24
HASH_ROWS, HASH_TABLES = 4096, 2  # hashed latent tables: rows each, tables per id
CROSS_ROWS = 1 << 16  # hashed (user_geo, advertiser_id) cross table
MLP_UNITS = 8  # hidden units of the nonlinear term
RECENT = 20  # leading history items that count as recent (retargeting)
POOL = 1 << 16  # ads drawn per day to sample histories from
HISTORY_TEMPERATURE = 6.0  # how sharply histories follow the user's category interests
HISTORY_BURST = 4  # consecutive history items of one category
HISTORY_STEP = 2.0  # new history items between two sessions of a user, on average
HISTORY_DAYS = 7  # the longest time a history spans (days)
HISTORY_BASE = 1 << 24  # stream positions start here (so p - L is never negative)
_CACHED_DAYS = 16  # drifted tables and pools kept (a history reaches back HISTORY_DAYS + 1)
REFERENCE_PAIRS = 4096  # (user, ad) pairs a vertical's own term is scaled on


def vocab(cfg: GenerateConfig) -> dict[str, int]:
    """The id-space size of every sparse feature."""
    users, ads = id_space(cfg.users, cfg.churn), id_space(cfg.ads, cfg.churn)
    return {
        "user_id": users, "user_age": len(AGE_P), "user_gender": len(GENDER_P),
        "user_geo": GEOS, "user_device": len(DEVICE_P), "session_hour": HOURS,
        "user_history": ads, "ad_id": ads, "advertiser_id": cfg.advertisers,
        "ad_category": cfg.categories, "ad_format": len(FORMAT_P),
        "vertical": len(cfg.verticals),
    }


def schema(cfg: GenerateConfig) -> FeatureSchema:
    return synthetic_schema(vocab(cfg), tuple(v.name for v in cfg.verticals))



@dataclass(frozen=True)
class _OwnTerm:
    """A vertical's own part of the click function: a tanh network of the user x ad latent
    product with weights of its own (what this surface rewards in a match) plus category
    biases of its own, each part standardized on reference pairs, summed, scaled to `std`."""

    w: np.ndarray  # [MLP_UNITS, k] float32
    c: np.ndarray  # [MLP_UNITS]
    a: np.ndarray  # [MLP_UNITS]
    cat: np.ndarray  # [categories]
    std: float
    center: tuple[float, float] = (0.0, 0.0)  # of the two parts on the reference pairs
    spread: tuple[float, float] = (1.0, 1.0)

    @classmethod
    def make(cls, seed: int, vertical: int, std: float, categories: int, uv: np.ndarray,
             cat: np.ndarray) -> _OwnTerm:
        """Vertical `vertical`'s term (its own random stream: adding a vertical changes no
        other's), standardized on the reference pairs (uv, cat)."""
        rng = seeded_rng(seed, Stream.VERTICAL, vertical)
        k = uv.shape[1]
        term = cls(w=(rng.standard_normal((MLP_UNITS, k)) * 2.0 * math.sqrt(k)).astype(np.float32),
                   c=rng.normal(0, 0.5, MLP_UNITS), a=rng.normal(0, 1.0, MLP_UNITS),
                   cat=rng.normal(0, 1.0, categories), std=std)
        parts = term._parts(uv, cat)
        # a part constant on the pairs (a world of one user or one ad) is only centred
        return dataclasses.replace(term, center=tuple(float(p.mean()) for p in parts),
                                   spread=tuple(float(p.std()) if p.std() > 1e-6 else 1.0
                                                for p in parts))

    def _parts(self, uv: np.ndarray, cat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        hidden = np.tanh(uv @ self.w.T + self.c.astype(np.float32)).astype(np.float64)
        return hidden @ self.a, self.cat[cat]

    def __call__(self, uv: np.ndarray, cat: np.ndarray) -> np.ndarray:
        z = [(p - m) / s for p, m, s in zip(self._parts(uv, cat), self.center, self.spread)]
        return self.std * (z[0] + z[1]) / math.sqrt(2.0)


class World:
    """Everything of the synthetic world that does not depend on the day's draws."""

    def __init__(self, cfg: GenerateConfig) -> None:
        self.cfg = cfg
        self.schema = schema(cfg)
        k, C = cfg.latent_dim, cfg.categories
        rng = seeded_rng(cfg.seed, Stream.WORLD)
        self.salt = {n: salt_of(cfg.seed, n) for n in (
            "user_pop", "ad_pop", "age", "gender", "geo", "device", "hour", "hist_len",
            "light", "user_bias", "advertiser", "category", "own_category", "format",
            "ad_bias", "adv_bias", "bid", "geo_adv", "user_row0", "user_row1", "ad_row0",
            "ad_row1", "adv_row", "user_sign", "ad_sign", "stream", "burst", "item")}
        self.users = Population.make(PowerLaw(cfg.users, cfg.zipf_users), cfg.churn, rng,
                                      self.salt["user_pop"])
        self.ads = Population.make(PowerLaw(cfg.ads, cfg.zipf_ads), cfg.churn, rng,
                                    self.salt["ad_pop"])

        def unit(*shape: int) -> np.ndarray:
            return unit_rows(rng.standard_normal(shape)).astype(np.float32)

        # User-side latent tables (these drift): hashed individual rows, then age, then geo.
        self.user_tab0 = unit(HASH_TABLES * HASH_ROWS + len(AGE_P) + GEOS, k)
        self.ad_tab = unit(HASH_TABLES * HASH_ROWS, k)
        self.adv_tab = unit(HASH_ROWS, k)
        self.cat_tab = unit(C, k)
        # Biases and crosses (logit units).
        self.user_bias = rng.normal(0, 0.35, HASH_ROWS)
        self.device_bias = np.array([0.0, 0.15, -0.2, 0.1])
        self.format_bias = np.array([0.0, 0.25, 0.1, -0.3])
        self.format_pos = np.array([0.25, 0.45, 0.3, 0.15])  # position slope per format
        self.ad_quality = rng.normal(0, 1.0, HASH_ROWS)  # standardized; logit = 0.35 * q
        self.adv_bias = rng.normal(0, 0.3, HASH_ROWS)
        self.adv_bid = rng.normal(0, 0.6, HASH_ROWS)
        self.cat_bias0 = rng.normal(0, 0.3, C)
        self.age_cat = rng.normal(0, 0.3, (len(AGE_P), C))
        self.hour_cat = rng.normal(0, 0.15, (HOURS, C))
        self.hour_bias = 0.15 * np.sin(2 * np.pi * (np.arange(HOURS) - 14) / HOURS)
        self.geo_adv = rng.normal(0, 0.3, CROSS_ROWS)
        self.mlp_w = rng.standard_normal((MLP_UNITS, k)).astype(np.float32) * 2.0 * math.sqrt(k)
        self.mlp_c = rng.normal(0, 0.5, MLP_UNITS)
        self.mlp_a = rng.normal(0, 0.55 / math.sqrt(MLP_UNITS * 0.6), MLP_UNITS)
        self.dot_scale = 0.6 * math.sqrt(k)  # the dot product's std ~ 1/sqrt(k)
        self._drifted: dict[int, tuple[np.ndarray, np.ndarray]] = {0: (self.user_tab0,
                                                                       self.cat_bias0)}
        self._pools: dict[int, tuple[np.ndarray, ...]] = {}
        # Verticals: the traffic split, and what each changes in the click model.
        vs = cfg.verticals
        self.share = np.array([v.share for v in vs]) / sum(v.share for v in vs)
        self.vertical_ctr = [cfg.base_ctr if v.base_ctr is None else v.base_ctr for v in vs]
        self.vertical_position = np.array([v.position for v in vs])
        ref = self._reference_pairs() if any(v.own > 0 for v in vs) else None
        self.own = [_OwnTerm.make(cfg.seed, j, v.own, C, *ref) if ref and v.own > 0 else None
                    for j, v in enumerate(vs)]

    # ---- drift
    def drifted(self, day: int) -> tuple[np.ndarray, np.ndarray]:
        """(user-side latent tables, category biases) on `day`, stepping from the last cached."""
        if day in self._drifted:
            return self._drifted[day]
        last = max(d for d in self._drifted if d <= day)
        tab, cat = self._drifted[last]
        rho = min(self.cfg.drift, 1.0)
        for d in range(last + 1, day + 1):
            if self.cfg.drift > 0:
                rng = seeded_rng(self.cfg.seed, Stream.DRIFT, d)
                noise = rng.standard_normal(tab.shape).astype(np.float32)
                tab = unit_rows(tab + self.cfg.drift / math.sqrt(tab.shape[1]) * noise)
                cat = cat * math.sqrt(1 - rho**2) + rho * 0.3 * rng.standard_normal(cat.shape)
            self._drifted[d] = (tab, cat)
        # Keep day 0 and the latest few days: days are mostly asked for in order, and a
        # day's histories reach back a week.
        keep = sorted(self._drifted)[-_CACHED_DAYS:]
        self._drifted = {d: self._drifted[d] for d in {0, *keep}}
        return tab, cat

    # ---- users
    def user_attributes(self, uid: np.ndarray) -> dict[str, np.ndarray]:
        s, mh = self.salt, self.cfg.max_history
        u = to_unit(hash_ids(uid, s["hist_len"]))
        light = to_unit(hash_ids(uid, s["light"])) < 0.1  # 10% of users have short histories
        hist_len = np.where(light, 1 + np.floor(u * mh), mh - np.floor(0.5 * mh * u * u))
        return {
            "user_age": categorical(hash_ids(uid, s["age"]), AGE_P),
            "user_gender": categorical(hash_ids(uid, s["gender"]), GENDER_P),
            "user_geo": np.floor(GEOS * to_unit(hash_ids(uid, s["geo"])) ** 2).astype(np.int64),
            "user_device": categorical(hash_ids(uid, s["device"]), DEVICE_P),
            "hour_pref": bucket(hash_ids(uid, s["hour"]), HOURS),
            "hist_len": np.clip(hist_len, 1, mh).astype(np.int64),
        }

    def user_latent(self, day: int, uid: np.ndarray, age: np.ndarray,
                    geo: np.ndarray) -> np.ndarray:
        tab, _ = self.drifted(day)
        ind = np.zeros((len(uid), tab.shape[1]), np.float32)
        signs = hash_ids(uid, self.salt["user_sign"])
        for j in range(HASH_TABLES):
            row = j * HASH_ROWS + bucket(hash_ids(uid, self.salt[f"user_row{j}"]), HASH_ROWS)
            sign = ((signs >> U64(j)) & U64(1)).astype(np.float32) * 2 - 1
            ind += sign[:, None] * tab[row]
        base = HASH_TABLES * HASH_ROWS
        vec = (0.5 * tab[base + age] + 0.4 * tab[base + len(AGE_P) + geo]
               + 0.75 / math.sqrt(HASH_TABLES) * ind)
        return unit_rows(vec)

    # ---- ads
    def ad_attributes(self, aid: np.ndarray) -> dict[str, np.ndarray]:
        s, cfg = self.salt, self.cfg
        adv = bucket(hash_ids(aid, s["advertiser"]), cfg.advertisers)
        own = to_unit(hash_ids(aid, s["own_category"])) < 0.2  # most ads: the advertiser's category
        cat = np.where(own, bucket(hash_ids(aid, s["category"]), cfg.categories),
                       bucket(hash_ids(adv, s["category"]), cfg.categories))
        return {"advertiser_id": adv, "ad_category": cat,
                "ad_format": categorical(hash_ids(aid, s["format"]), FORMAT_P),
                "quality": self.ad_quality[bucket(hash_ids(aid, s["ad_bias"]), HASH_ROWS)]}

    def ad_latent(self, aid: np.ndarray, adv: np.ndarray, cat: np.ndarray) -> np.ndarray:
        ind = np.zeros((len(aid), self.cfg.latent_dim), np.float32)
        signs = hash_ids(aid, self.salt["ad_sign"])
        for j in range(HASH_TABLES):
            row = j * HASH_ROWS + bucket(hash_ids(aid, self.salt[f"ad_row{j}"]), HASH_ROWS)
            sign = ((signs >> U64(j)) & U64(1)).astype(np.float32) * 2 - 1
            ind += sign[:, None] * self.ad_tab[row]
        vec = (0.6 * self.cat_tab[cat]
               + 0.4 * self.adv_tab[bucket(hash_ids(adv, self.salt["adv_row"]), HASH_ROWS)]
               + 0.7 / math.sqrt(HASH_TABLES) * ind)
        return unit_rows(vec)

    # ---- histories
    def pool(self, day: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Popular ads of the day grouped by category: (ids, advertisers, start, count)."""
        if day not in self._pools:
            rng = seeded_rng(self.cfg.seed, day, Stream.POOL)
            aid = self.ads.ids(self.ads.sample(rng, POOL, day), day)
            attrs = self.ad_attributes(aid)
            order = np.argsort(attrs["ad_category"], kind="stable")
            count = np.bincount(attrs["ad_category"], minlength=self.cfg.categories)
            start = np.concatenate([[0], np.cumsum(count)[:-1]])
            if len(self._pools) >= _CACHED_DAYS:
                self._pools.pop(min(self._pools))
            self._pools[day] = (aid[order], attrs["advertiser_id"][order], start, count)
        return self._pools[day]

    def stream(self, uid: np.ndarray, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(base, rate) of each user's history stream: p(T) = base + floor(rate * T)."""
        cfg = self.cfg
        base = HISTORY_BASE + bucket(hash_ids(uid, self.salt["stream"]), HISTORY_BASE)
        sessions_a_day = cfg.sessions_per_day * self.users.law.mass(rank)
        floor = (cfg.max_history + HISTORY_BURST) / HISTORY_DAYS
        return base, np.maximum(HISTORY_STEP * sessions_a_day, floor)

    def history(self, day: int, uid: np.ndarray, age: np.ndarray, geo: np.ndarray,
                base: np.ndarray, rate: np.ndarray, pos: np.ndarray, lengths: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Flat history (ad ids, categories, advertisers) of sessions at stream positions `pos`.

        Session i sees stream items pos-1, pos-2, ..., pos-lengths (most recent first). Item
        k of a user is a pure function of (user, k): bursts of HISTORY_BURST items (k //
        HISTORY_BURST) share a category drawn from softmax(T * u . category vectors) over the
        categories in the pool of the day the burst was browsed, with u the user's latent
        on that day; each item is a pool ad of that category (so popular ads recur).
        """
        C, S = self.cfg.categories, len(lengths)
        seg = np.repeat(np.arange(S), lengths)
        starts = np.cumsum(lengths) - lengths
        item = np.repeat(pos - 1 + starts, lengths) - np.arange(len(seg))
        burst = item // HISTORY_BURST
        # one row per (session, burst) it touches: items of a burst are consecutive
        first = np.empty(len(seg), bool)
        first[:1] = True
        np.not_equal(burst[1:], burst[:-1], out=first[1:])
        first[starts[lengths > 0]] = True
        b_row = np.cumsum(first) - 1
        b_seg, b_id = seg[first], burst[first]
        b_day = np.floor((b_id * HISTORY_BURST - base[b_seg]) / rate[b_seg]).astype(np.int64)
        b_day = np.clip(b_day, 0, day)
        user_key = hash_ids(uid[b_seg], self.salt["burst"])  # a pure function of (user, burst)
        draw = to_unit(hash_ids(user_key + b_id.astype(np.uint64) * GOLDEN, self.salt["burst"]))
        # the pools of the days the bursts were browsed on, side by side
        days = np.unique(b_day)
        pools = [self.pool(int(d)) for d in days]
        pool_ids = np.concatenate([p[0] for p in pools])
        pool_adv = np.concatenate([p[1] for p in pools])
        pool_at = np.cumsum([0] + [len(p[0]) for p in pools])[:-1]
        start = np.stack([p[2] + at for p, at in zip(pools, pool_at)])  # [days, C]
        count = np.stack([p[3] for p in pools])
        b_dix = np.searchsorted(days, b_day)
        # the category distribution depends on (user, day) only: one cdf row per such pair
        pair = uid[b_seg] * len(days) + b_dix
        _, at, p_row = np.unique(pair, return_index=True, return_inverse=True)
        p_seg, p_dix = b_seg[at], b_dix[at]
        cdf = np.empty((len(at), C))
        for j, d in enumerate(days):
            r = np.flatnonzero(p_dix == j)
            u = self.user_latent(int(d), uid[p_seg[r]], age[p_seg[r]], geo[p_seg[r]])
            a = HISTORY_TEMPERATURE * (u @ self.cat_tab.T).astype(np.float64)
            a[:, count[j] == 0] = -np.inf
            cdf[r] = np.cumsum(np.exp(a - a.max(axis=1, keepdims=True)), axis=1)
        cdf /= cdf[:, -1:]
        cdf += np.arange(len(at))[:, None]  # rows side by side on one increasing axis
        flat = np.searchsorted(cdf.ravel(), p_row + draw, side="right")
        b_cat = np.minimum(flat - p_row * C, C - 1)
        cats, dix = b_cat[b_row], b_dix[b_row]
        pick_u = to_unit(hash_ids(hash_ids(uid[seg], self.salt["item"]) + item.astype(np.uint64),
                             self.salt["item"]))
        pick = start[dix, cats] + np.floor(pick_u * count[dix, cats]).astype(np.int64)
        return pool_ids[pick], cats, pool_adv[pick]

    def _reference_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """(u * v, ad category) of REFERENCE_PAIRS popular (user, ad) pairs on day 0: the
        population a vertical's own term is scaled on."""
        rng = seeded_rng(self.cfg.seed, Stream.VERTICAL)
        uid = self.users.ids(self.users.sample(rng, REFERENCE_PAIRS, 0), 0)
        aid = self.ads.ids(self.ads.sample(rng, REFERENCE_PAIRS, 0), 0)
        user, ad = self.user_attributes(uid), self.ad_attributes(aid)
        u = self.user_latent(0, uid, user["user_age"], user["user_geo"])
        v = self.ad_latent(aid, ad["advertiser_id"], ad["ad_category"])
        return u * v, ad["ad_category"]

    def vertical_terms(self, uv: np.ndarray, f: dict[str, np.ndarray],
                       vertical: np.ndarray) -> dict[str, np.ndarray]:
        """The logit's terms that depend on the session's vertical: the position effect
        (its multiple of the per-format slopes) and the vertical's own term."""
        slope = self.vertical_position[vertical] * self.format_pos[f["ad_format"]]
        own = np.zeros(len(vertical))
        for j, term in enumerate(self.own):
            m = vertical == j
            if term is not None and m.any():
                own[m] = term(uv[m], f["ad_category"][m])
        return {"position": -slope * np.log1p(f[POSITION].astype(np.float64)), "vertical": own}

    # ---- the click model
    def logit_terms(self, day: int, f: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The raw logit's terms (no intercept) for impressions with feature arrays `f`.

        `f` holds the table's per-impression columns plus `hist_share` (share of the
        history in the ad's category) and `recent_adv` (advertiser among recent history).
        """
        s = self.salt
        u = self.user_latent(day, f["user_id"], f["user_age"], f["user_geo"])
        v = self.ad_latent(f["ad_id"], f["advertiser_id"], f["ad_category"])
        uv = u * v
        _, cat_bias = self.drifted(day)
        cat, adv, fmt = f["ad_category"], f["advertiser_id"], f["ad_format"]
        hidden = np.tanh(uv @ self.mlp_w.T + self.mlp_c.astype(np.float32))
        geo_adv = bucket(hash_ids(f["user_geo"] * 1_000_000_007 + adv, s["geo_adv"]), CROSS_ROWS)
        by_vertical = self.vertical_terms(uv, f, f["vertical"])
        return {
            "dot": self.dot_scale * uv.sum(axis=1, dtype=np.float64),
            "nonlinear": hidden.astype(np.float64) @ self.mlp_a,
            "user": self.user_bias[bucket(hash_ids(f["user_id"], s["user_bias"]), HASH_ROWS)]
            + self.device_bias[f["user_device"]] + self.hour_bias[f["session_hour"]],
            "ad": 0.35 * self.ad_attributes(f["ad_id"])["quality"] + cat_bias[cat]
            + self.adv_bias[bucket(hash_ids(adv, s["adv_bias"]), HASH_ROWS)]
            + self.format_bias[fmt],
            "crosses": self.age_cat[f["user_age"], cat] + self.geo_adv[geo_adv]
            + self.hour_cat[f["session_hour"], cat],
            "history": 5.0 * f["hist_share"] + 0.5 * f["recent_adv"],
            "position": by_vertical["position"],
            "context": 0.1 * f["d_bid"] - 0.2 * f["d_ad_age"] - 0.1 * f["d_user_activity"],
            "vertical": by_vertical["vertical"],
        }

    def raw_logit(self, day: int, f: dict[str, np.ndarray]) -> np.ndarray:
        return np.sum(list(self.logit_terms(day, f).values()), axis=0)

    def history_features(self, hist_off: np.ndarray, hist_cat: np.ndarray,
                         hist_adv: np.ndarray, seg: np.ndarray, cat: np.ndarray,
                         adv: np.ndarray) -> dict[str, np.ndarray]:
        """Per impression (of history segment `seg`): hist_share and recent_adv."""
        lengths = np.diff(hist_off)
        hseg = np.repeat(np.arange(len(lengths)), lengths)
        same_cat = _count_matches(hseg, hist_cat, seg, cat, self.cfg.categories)
        hit = np.zeros(len(seg), bool)
        k = np.arange(RECENT)
        for i0 in range(0, len(seg), 1 << 16):  # compare with the RECENT first items
            s, a = seg[i0:i0 + (1 << 16)], adv[i0:i0 + (1 << 16), None]
            idx = np.minimum(hist_off[s, None] + k, max(len(hist_adv) - 1, 0))
            valid = k < lengths[s, None]
            hit[i0:i0 + len(s)] = ((hist_adv[idx] == a) & valid).any(axis=1)
        return {"hist_share": same_cat / np.maximum(lengths[seg], 1),
                "recent_adv": hit.astype(np.float64)}


def _count_matches(item_seg: np.ndarray, item_key: np.ndarray, seg: np.ndarray,
                   key: np.ndarray, n_keys: int) -> np.ndarray:
    """For each query (seg, key): how many items of segment `seg` have key `key`.

    `item_seg` and `seg` are non-decreasing (rows of a session are contiguous).
    """
    out = np.zeros(len(seg), np.int64)
    if len(item_seg) == 0 or len(seg) == 0:
        return out
    if n_keys > 1 << 16:  # sparse: sort the (segment, key) pairs
        uniq, counts = np.unique(item_seg * n_keys + item_key, return_counts=True)
        q = seg * n_keys + key
        i = np.minimum(np.searchsorted(uniq, q), len(uniq) - 1)
        return np.where(uniq[i] == q, counts[i], 0)
    step = max(1, (1 << 22) // n_keys)  # segments per dense bincount
    for s0 in range(int(seg[0]), int(seg[-1]) + 1, step):
        a, b = np.searchsorted(item_seg, [s0, s0 + step])
        qa, qb = np.searchsorted(seg, [s0, s0 + step])
        counts = np.bincount((item_seg[a:b] - s0) * n_keys + item_key[a:b],
                             minlength=step * n_keys)
        out[qa:qb] = counts[(seg[qa:qb] - s0) * n_keys + key[qa:qb]]
    return out
