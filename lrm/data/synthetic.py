"""Synthetic session-level ads-click logs with a hidden, learnable click model.

A day is `cfg.sessions_per_day` sessions, written in the order they happen (time of day)
as an impression log would be. A session is one user (Zipf-popular) at a time of day near
the user's preferred hour, on one vertical, seeing 1 + Poisson(mean_session_length - 1)
ads (Zipf-popular) in positions 0..n-1, ordered by a noisy auction score; its rows are
contiguous and share the user-side columns, including `user_history` (recent ad ids, most
recent first, ~0.8 * max_history long on average) and `vertical`.

Verticals (`cfg.verticals`) are the surfaces of one ads system (a feed, search results, a
video tab) over the same users and ads: a session lands on vertical j with probability
share_j (drawn from a stream of its own, so the rest of the day is the same whatever the
verticals). A vertical has its own base CTR (its own intercept), its own multiple of the
position effect, and a part of the click function of its own (`own`, below); everything
else is shared, so every vertical's data teaches the structure the others use. One
vertical with the defaults (share 1, position 1, own 0) is the single-surface world,
column for column (checked against the generator before verticals: the same bytes).

Histories evolve slowly. Every user has an endless stream of ads she browsed; item k of it
is a pure function of (user, k). A session at time T (in days) sees the user's L most
recent items, stream items [p(T) - L, p(T)), with p(T) = base + floor(rate * T): a sliding
window. L is the user's (constant); rate is HISTORY_STEP x her expected sessions a day (so
a session finds ~2 new items since the last one), at least (max_history + 4) / HISTORY_DAYS
(so a history spans at most about a week). A user's sessions of a day (and of consecutive
days) therefore share most of their history, each shifted by what she browsed in between.

Everything about an id is a pure function of the id and the seed, derived by hashing: user
attributes, an ad's advertiser, category and format, and the latent interest vectors (sums
of signed rows of a few small hashed tables: the hashing trick). So `users` and `ads` may
be as large as 1e9 without a single per-id array.

Popularity and churn: a popularity rank is drawn from a truncated power law by inverse CDF
and mapped to an id by an affine permutation of the id space. Each rank has a hashed phase
phi; its occupant is replaced whenever `day * churn + phi` crosses an integer, so a fraction
`churn` of the ranks gets a new id every day and the old id leaves. With churn the id space
is twice the live ids (`id_space`): a rank alternates between two slots, so an arrival is
an id nobody held for 1/churn days, no two live ids are equal, and an ad's age (the time
since its occupant arrived) is a function of its id. An arrival's traffic ramps up: a draw
of its rank is kept with probability min(1, (age + 0.5) / RAMP_DAYS), else drawn again.

The click model, the hidden truth a model should learn, is a logit that sums
  a user x ad latent dot product: u = normalize(age, geo and individual parts),
      v = normalize(category, advertiser and individual parts);
  a nonlinear term sum_m a_m tanh(W_m (u * v) + c_m) that no dot product captures;
  crosses (user_age, ad_category), hashed (user_geo, advertiser_id), (hour, category);
  biases of the user, device, hour, ad (its quality), advertiser, category, format;
  history: 5 x the share of the history in the ad's category, and +0.5 when the
      advertiser is among the RECENT first history items (retargeting);
  position (slope per format, times the vertical's `position`), bid (weak, also
      correlated with quality), ad age (freshness), user activity;
  the vertical's own term: a tanh network of u * v with weights of its own plus category
      biases of its own (what this surface rewards), std `own` on reference pairs;
plus the vertical's intercept, calibrated by bisection so that the day's mean click
probability, had every impression been shown on that vertical, is its base CTR (so
identical verticals are one world). At the defaults the logit's std is ~1.2-1.4 per
vertical and its own NE ~0.83, the floor for any model (generate reports it per
vertical). Histories come in bursts of a category drawn from softmax(u . category vectors)
on the day the burst was browsed, so they reveal (slightly stale) interests; the items are
ads of that day's pool. Drift: each day the user-side tables step
T <- normalize(T + drift * noise) and the category biases take an AR(1) step, so a
user's interests (and a user x ad pair's probability) move while ids and attributes stay.

Dense features are roughly standardized: d_position = log1p(position), d_user_activity
(log popularity of the user, noisy), d_ad_age (log1p of days), d_bid (log bid).

Determinism: the world's tables come from SeedSequence([seed, _WORLD]) (vertical j's own
term from [seed, _VERTICAL, j]), day d's draws from SeedSequence([seed, d, stream]) (and
[seed, d, stream, k] for a chunk or block k > 0): the same config gives byte-identical tables.

A day of more than CHUNK_SESSIONS sessions is simulated in chunks, so memory is bounded by
a chunk whatever the day's size (`_chunks`): the sessions' own draws (user, time, length)
are made in blocks and spilled to disk by time slice (slices cut at the first block's
quantiles of time), then each slice, sorted by time, is simulated whole (histories,
verticals, impressions, labels). The click model's intercepts are then calibrated on the
impressions of the first block's first sessions, a sample of the whole day. A day of at most
CHUNK_SESSIONS sessions is one chunk, drawn and calibrated exactly as before chunks were.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from lrm import io
from lrm.config import GenerateConfig
from lrm.data.schema import (
    DAY, LABEL, POSITION, SESSION, FeatureSchema, part_path, synthetic_schema,
)
from lrm.progress import Reporter

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
CALIBRATION_ROWS = 1 << 16  # impressions the intercept is calibrated on
HISTORY_TEMPERATURE = 6.0  # how sharply histories follow the user's category interests
HISTORY_BURST = 4  # consecutive history items of one category
HISTORY_STEP = 2.0  # new history items between two sessions of a user, on average
HISTORY_DAYS = 7  # the longest time a history spans (days)
HISTORY_BASE = 1 << 24  # stream positions start here (so p - L is never negative)
RAMP_DAYS = 3.0  # an arriving user or ad reaches its rank's full traffic over its first days
_CACHED_DAYS = 16  # drifted tables and pools kept (a history reaches back HISTORY_DAYS + 1)
REFERENCE_PAIRS = 4096  # (user, ad) pairs a vertical's own term is scaled on
# sessions simulated at once (a chunk: ~400k impressions, whose simulation and table peak at
# ~1.3 GB with the default 100-ad histories); a larger day is simulated in chunks (see the
# module docstring)
CHUNK_SESSIONS = 50_000
_WORLD, _SESSIONS, _HISTORY, _IMPRESSIONS, _LABELS, _POOL, _DRIFT, _VERTICAL = range(8)
_MAX_LIST_VALUES = 2**31 - 1  # list<int64> offsets are int32


def id_space(live: int, churn: float) -> int:
    """The id space of `live` ids: with churn, two slots per id, so arrivals get new ids
    (_Population)."""
    return 2 * live if churn > 0 else live


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


# ---------------------------------------------------------------------------- hashing

_U64 = np.uint64
_GOLDEN = _U64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on a uint64 array (wraps modulo 2**64)."""
    x = x ^ (x >> _U64(30))
    x *= _U64(0xBF58476D1CE4E5B9)
    x ^= x >> _U64(27)
    x *= _U64(0x94D049BB133111EB)
    return x ^ (x >> _U64(31))


def _salt(seed: int, name: str) -> np.uint64:
    key = np.array([(seed * 1_000_003 + zlib.crc32(name.encode())) % 2**64], dtype=np.uint64)
    return _U64(_mix(key * _GOLDEN)[0])


def _hash(x: np.ndarray, salt: np.uint64) -> np.ndarray:
    """A 64-bit hash per element of a non-negative integer array."""
    return _mix(np.atleast_1d(np.asarray(x)).astype(np.uint64) * _GOLDEN + salt)


def _unit(h: np.ndarray) -> np.ndarray:
    """Hash -> float64 uniform in [0, 1)."""
    return (h >> _U64(11)).astype(np.float64) * 2.0**-53


def _bucket(h: np.ndarray, n: int) -> np.ndarray:
    return (h % _U64(n)).astype(np.int64)


def _categorical(h: np.ndarray, probs: tuple[float, ...]) -> np.ndarray:
    cdf = np.cumsum(probs)
    return np.minimum(np.searchsorted(cdf / cdf[-1], _unit(h), side="right"), len(probs) - 1)


def _rng(seed: int, *key: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed % 2**64, *key])))


def _unit_rows(a: np.ndarray) -> np.ndarray:
    return a / np.maximum(np.linalg.norm(a, axis=-1, keepdims=True), 1e-12)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


# ------------------------------------------------------------------ popularity and churn

@dataclass(frozen=True)
class _PowerLaw:
    """Ranks 0..n-1 with P(rank) ~ (rank + 1)^-s: a continuous power law on [1, n + 1)."""

    n: int
    s: float

    def _cdf(self, x: np.ndarray) -> np.ndarray:
        t, top = 1.0 - self.s, math.log(self.n + 1)
        if abs(t) < 1e-9:
            return np.log(x) / top
        return np.expm1(t * np.log(x)) / math.expm1(t * top)

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        u = rng.random(size)
        t, top = 1.0 - self.s, math.log(self.n + 1)
        if abs(t) < 1e-9:
            x = np.exp(u * top)
        else:
            x = np.exp(np.log1p(u * math.expm1(t * top)) / t)
        return np.clip(np.floor(x).astype(np.int64) - 1, 0, self.n - 1)

    def mass(self, rank: np.ndarray) -> np.ndarray:
        r = rank.astype(np.float64)
        return self._cdf(r + 2.0) - self._cdf(r + 1.0)


@dataclass(frozen=True)
class _Population:
    """Popularity rank -> id on a day, with churn; O(1) per lookup, no per-id state.

    Rank r has phase phi(r) in [0, 1); its generation on day d is floor(d * churn + phi).
    With churn, the id space holds two slots per rank and a rank's generations alternate
    between them (slot r + n * (gen % 2)), so no two live ids are equal and a newcomer's id
    is one nobody held for the last 1/churn days: an arrival is a new id to a model, as in
    a real log, and an id's age is a function of the id. Slot -> id is the affine
    permutation (mul * slot + add) mod space.
    """

    law: _PowerLaw  # popularity of the ranks 0..n-1 (n live ids)
    churn: float
    mul: int
    add: int
    salt: np.uint64

    @property
    def n(self) -> int:
        return self.law.n

    @property
    def space(self) -> int:
        return id_space(self.n, self.churn)

    @classmethod
    def make(cls, law: _PowerLaw, churn: float, rng: np.random.Generator, salt: np.uint64
             ) -> _Population:
        space = id_space(law.n, churn)
        mul = 1
        if space > 2:
            while True:
                mul = int(rng.integers(max(2, space // 3), space))
                if math.gcd(mul, space) == 1:
                    break
        return cls(law=law, churn=churn, mul=mul, add=int(rng.integers(0, space)), salt=salt)

    def _phase(self, rank: np.ndarray) -> np.ndarray:
        return _unit(_hash(rank, self.salt))

    def ids(self, rank: np.ndarray, day: int) -> np.ndarray:
        gen = np.floor(day * self.churn + self._phase(rank)).astype(np.int64)  # 0 if no churn
        return (self.mul * (rank + self.n * (gen % 2)) + self.add) % self.space

    def age_days(self, rank: np.ndarray, day: int) -> np.ndarray:
        """Days since the rank's current occupant arrived (ids alive at day 0: up to 1/churn)."""
        phase = self._phase(rank)
        if self.churn == 0:
            return day + 30.0 * phase
        t = day * self.churn + phase
        return (t - np.floor(t)) / self.churn

    def exposure(self, rank: np.ndarray, day: int) -> np.ndarray:
        """The share of its rank's traffic the occupant gets on `day`: an arrival ramps up
        over RAMP_DAYS (an ad system explores a new ad before it serves it in full; a new
        user comes back more often as she settles in): 1/6 to 1/2 on the day it arrives."""
        return np.minimum(1.0, (self.age_days(rank, day) + 0.5) / RAMP_DAYS)

    def sample(self, rng: np.random.Generator, size: int, day: int) -> np.ndarray:
        """`size` popularity ranks of `day`: drawn from the law, a draw kept with its
        occupant's exposure (else drawn again), so arrivals get less traffic. Without
        churn nothing arrives: the law's draws as they come (no extra draws from `rng`)."""
        rank = self.law.sample(rng, size)
        if self.churn == 0:
            return rank
        redo = np.flatnonzero(rng.random(size) >= self.exposure(rank, day))
        while len(redo):  # exposure >= 0.5 / RAMP_DAYS: a few rounds
            rank[redo] = self.law.sample(rng, len(redo))
            redo = redo[rng.random(len(redo)) >= self.exposure(rank[redo], day)]
        return rank


# ------------------------------------------------------------------------------ world

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
        rng = _rng(seed, _VERTICAL, vertical)
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


class _World:
    """Everything of the synthetic world that does not depend on the day's draws."""

    def __init__(self, cfg: GenerateConfig) -> None:
        self.cfg = cfg
        self.schema = schema(cfg)
        k, C = cfg.latent_dim, cfg.categories
        rng = _rng(cfg.seed, _WORLD)
        self.salt = {n: _salt(cfg.seed, n) for n in (
            "user_pop", "ad_pop", "age", "gender", "geo", "device", "hour", "hist_len",
            "light", "user_bias", "advertiser", "category", "own_category", "format",
            "ad_bias", "adv_bias", "bid", "geo_adv", "user_row0", "user_row1", "ad_row0",
            "ad_row1", "adv_row", "user_sign", "ad_sign", "stream", "burst", "item")}
        self.users = _Population.make(_PowerLaw(cfg.users, cfg.zipf_users), cfg.churn, rng,
                                      self.salt["user_pop"])
        self.ads = _Population.make(_PowerLaw(cfg.ads, cfg.zipf_ads), cfg.churn, rng,
                                    self.salt["ad_pop"])

        def unit(*shape: int) -> np.ndarray:
            return _unit_rows(rng.standard_normal(shape)).astype(np.float32)

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
                rng = _rng(self.cfg.seed, _DRIFT, d)
                noise = rng.standard_normal(tab.shape).astype(np.float32)
                tab = _unit_rows(tab + self.cfg.drift / math.sqrt(tab.shape[1]) * noise)
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
        u = _unit(_hash(uid, s["hist_len"]))
        light = _unit(_hash(uid, s["light"])) < 0.1  # 10% of users have short histories
        hist_len = np.where(light, 1 + np.floor(u * mh), mh - np.floor(0.5 * mh * u * u))
        return {
            "user_age": _categorical(_hash(uid, s["age"]), AGE_P),
            "user_gender": _categorical(_hash(uid, s["gender"]), GENDER_P),
            "user_geo": np.floor(GEOS * _unit(_hash(uid, s["geo"])) ** 2).astype(np.int64),
            "user_device": _categorical(_hash(uid, s["device"]), DEVICE_P),
            "hour_pref": _bucket(_hash(uid, s["hour"]), HOURS),
            "hist_len": np.clip(hist_len, 1, mh).astype(np.int64),
        }

    def user_latent(self, day: int, uid: np.ndarray, age: np.ndarray,
                    geo: np.ndarray) -> np.ndarray:
        tab, _ = self.drifted(day)
        ind = np.zeros((len(uid), tab.shape[1]), np.float32)
        signs = _hash(uid, self.salt["user_sign"])
        for j in range(HASH_TABLES):
            row = j * HASH_ROWS + _bucket(_hash(uid, self.salt[f"user_row{j}"]), HASH_ROWS)
            sign = ((signs >> _U64(j)) & _U64(1)).astype(np.float32) * 2 - 1
            ind += sign[:, None] * tab[row]
        base = HASH_TABLES * HASH_ROWS
        vec = (0.5 * tab[base + age] + 0.4 * tab[base + len(AGE_P) + geo]
               + 0.75 / math.sqrt(HASH_TABLES) * ind)
        return _unit_rows(vec)

    # ---- ads
    def ad_attributes(self, aid: np.ndarray) -> dict[str, np.ndarray]:
        s, cfg = self.salt, self.cfg
        adv = _bucket(_hash(aid, s["advertiser"]), cfg.advertisers)
        own = _unit(_hash(aid, s["own_category"])) < 0.2  # most ads: the advertiser's category
        cat = np.where(own, _bucket(_hash(aid, s["category"]), cfg.categories),
                       _bucket(_hash(adv, s["category"]), cfg.categories))
        return {"advertiser_id": adv, "ad_category": cat,
                "ad_format": _categorical(_hash(aid, s["format"]), FORMAT_P),
                "quality": self.ad_quality[_bucket(_hash(aid, s["ad_bias"]), HASH_ROWS)]}

    def ad_latent(self, aid: np.ndarray, adv: np.ndarray, cat: np.ndarray) -> np.ndarray:
        ind = np.zeros((len(aid), self.cfg.latent_dim), np.float32)
        signs = _hash(aid, self.salt["ad_sign"])
        for j in range(HASH_TABLES):
            row = j * HASH_ROWS + _bucket(_hash(aid, self.salt[f"ad_row{j}"]), HASH_ROWS)
            sign = ((signs >> _U64(j)) & _U64(1)).astype(np.float32) * 2 - 1
            ind += sign[:, None] * self.ad_tab[row]
        vec = (0.6 * self.cat_tab[cat]
               + 0.4 * self.adv_tab[_bucket(_hash(adv, self.salt["adv_row"]), HASH_ROWS)]
               + 0.7 / math.sqrt(HASH_TABLES) * ind)
        return _unit_rows(vec)

    # ---- histories
    def pool(self, day: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Popular ads of the day grouped by category: (ids, advertisers, start, count)."""
        if day not in self._pools:
            rng = _rng(self.cfg.seed, day, _POOL)
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
        base = HISTORY_BASE + _bucket(_hash(uid, self.salt["stream"]), HISTORY_BASE)
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
        user_key = _hash(uid[b_seg], self.salt["burst"])  # a pure function of (user, burst)
        draw = _unit(_hash(user_key + b_id.astype(np.uint64) * _GOLDEN, self.salt["burst"]))
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
        pick_u = _unit(_hash(_hash(uid[seg], self.salt["item"]) + item.astype(np.uint64),
                             self.salt["item"]))
        pick = start[dix, cats] + np.floor(pick_u * count[dix, cats]).astype(np.int64)
        return pool_ids[pick], cats, pool_adv[pick]

    def _reference_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """(u * v, ad category) of REFERENCE_PAIRS popular (user, ad) pairs on day 0: the
        population a vertical's own term is scaled on."""
        rng = _rng(self.cfg.seed, _VERTICAL)
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
        geo_adv = _bucket(_hash(f["user_geo"] * 1_000_000_007 + adv, s["geo_adv"]), CROSS_ROWS)
        by_vertical = self.vertical_terms(uv, f, f["vertical"])
        return {
            "dot": self.dot_scale * uv.sum(axis=1, dtype=np.float64),
            "nonlinear": hidden.astype(np.float64) @ self.mlp_a,
            "user": self.user_bias[_bucket(_hash(f["user_id"], s["user_bias"]), HASH_ROWS)]
            + self.device_bias[f["user_device"]] + self.hour_bias[f["session_hour"]],
            "ad": 0.35 * self.ad_attributes(f["ad_id"])["quality"] + cat_bias[cat]
            + self.adv_bias[_bucket(_hash(adv, s["adv_bias"]), HASH_ROWS)]
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


def _calibrate(raw: np.ndarray, ctr: float) -> float:
    """The intercept b with mean(sigmoid(raw + b)) == ctr (bisection)."""
    lo, hi = -30.0, 30.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if _sigmoid(raw + mid).mean() < ctr:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


# ------------------------------------------------------------------------------- days

@dataclass
class _Day:
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


def _session_draws(w: _World, day: int, block: int, size: int) -> np.ndarray:
    """The own draws of `size` sessions of `day` (block `block` of them), as drawn."""
    cfg = w.cfg
    rs = _rng(cfg.seed, day, _SESSIONS, *_key(block))
    out = np.empty(size, _DRAWS)
    out["rank"] = rank = w.users.sample(rs, size, day)
    pref = w.user_attributes(w.users.ids(rank, day))["hour_pref"]
    out["hours"] = (pref + 0.5 + rs.normal(0, 2.5, size)) % HOURS  # time of day (hours)
    out["activity"] = np.log(cfg.users * w.users.law.mass(rank)) + rs.normal(0, 0.3, size)
    out["n_imp"] = 1 + rs.poisson(cfg.mean_session_length - 1, size)
    return out


def _simulate(w: _World, day: int, draws: np.ndarray, *, chunk: int = 0, first: int = 0,
              intercepts: np.ndarray | None = None) -> _Day:
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
                "vertical": _rng(cfg.seed, day, _VERTICAL, *_key(chunk)).choice(
                    len(w.share), S, p=w.share)}

    base, rate = w.stream(uid, rank)
    pos = base + np.floor(rate * (day + hours / HOURS)).astype(np.int64)
    hist, hist_cat, hist_adv = w.history(day, uid, attrs["user_age"], attrs["user_geo"], base,
                                         rate, pos, hist_len)
    hist_off = np.concatenate([[0], np.cumsum(hist_len)])

    ri = _rng(cfg.seed, day, _IMPRESSIONS, *_key(chunk))
    imp_off = np.concatenate([[0], np.cumsum(n_imp)])
    n = int(imp_off[-1])
    seg = np.repeat(np.arange(S), n_imp)
    arank = w.ads.sample(ri, n, day)
    aid = w.ads.ids(arank, day)
    ad = w.ad_attributes(aid)
    log_bid = (w.adv_bid[_bucket(_hash(ad["advertiser_id"], w.salt["bid"]), HASH_ROWS)]
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
    imps[LABEL] = (_rng(cfg.seed, day, _LABELS, *_key(chunk)).random(n)
                   < _sigmoid(logit)).astype(np.int8)
    return _Day(day=day, first=first, sessions=sessions, imp_off=imp_off, hist_off=hist_off,
                hist=hist, imps=imps, logit=logit, intercepts=intercepts, sess_index=seg)


def _intercepts(w: _World, day: int, feats: dict[str, np.ndarray], raw: np.ndarray
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
        out[j] = _calibrate(raw[at] + np.where(f["vertical"] == j, 0.0, alt - now), ctr)
    return out


def _time_ordered(draws: np.ndarray) -> np.ndarray:
    return draws[np.argsort(draws["hours"], kind="stable")]


def _calibration(w: _World, day: int, blocks: int, draws: np.ndarray) -> np.ndarray:
    """The intercepts of a day of several chunks: calibrated on the impressions of the first
    sessions of its first block (drawn i.i.d. over the day), with their own impression
    draws (those of chunk `blocks`, one past the last)."""
    enough = int(np.searchsorted(np.cumsum(draws["n_imp"]), CALIBRATION_ROWS)) + 1
    return _simulate(w, day, draws[:enough], chunk=blocks).intercepts


def _chunks(w: _World, day: int) -> Iterator[_Day]:
    """Day `day` in time order, a chunk of at most about CHUNK_SESSIONS sessions at a time
    (see the module docstring)."""
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


def _table(w: _World, d: _Day, s0: int, s1: int) -> pa.Table:
    """Impression rows of sessions [s0, s1) as a table of the exact impressions schema."""
    sch = w.schema.arrow("impressions")
    i0, i1 = int(d.imp_off[s0]), int(d.imp_off[s1])
    seg = d.sess_index[i0:i1]
    h0, h1 = int(d.hist_off[s0]), int(d.hist_off[s1])
    per_session = pa.ListArray.from_arrays(
        pa.array((d.hist_off[s0:s1 + 1] - h0).astype(np.int32)), pa.array(d.hist[h0:h1]))
    cols: dict[str, Any] = {
        DAY: np.full(i1 - i0, d.day, np.int32),
        SESSION: d.day * w.cfg.sessions_per_day + d.first + seg,
        **{c: d.sessions[c][seg] for c in w.schema.user_sparse},
        "user_history": per_session.take(pa.array(seg - s0)),
        **{c: d.imps[c][i0:i1] for c in (POSITION, LABEL, *w.schema.item_sparse,
                                         *w.schema.dense)},
    }
    arrays = [c if isinstance(c := cols[f.name], pa.Array) else pa.array(c, type=f.type)
              for f in sch]
    return pa.Table.from_arrays(arrays, schema=sch)


def _parts(imp_off: np.ndarray, rows_per_file: int) -> list[tuple[int, int]]:
    """Session ranges [s0, s1) of at most rows_per_file rows (one session may exceed it)."""
    out, s0, S = [], 0, len(imp_off) - 1
    while s0 < S:
        s1 = int(np.searchsorted(imp_off, imp_off[s0] + rows_per_file, side="right")) - 1
        s1 = min(max(s1, s0 + 1), S)
        out.append((s0, s1))
        s0 = s1
    return out


def generate_day(cfg: GenerateConfig, day: int) -> pa.Table:
    """Day `day` (any day >= 0, not only < cfg.days) as one impressions table."""
    w = _World(cfg)
    return pa.concat_tables([_table(w, d, 0, len(d.imp_off) - 1) for d in _chunks(w, day)])


def _day_intercepts(w: _World, day: int) -> np.ndarray:
    """The calibrated intercepts (one a vertical) of day `day`'s click model (as `_chunks`
    finds them)."""
    S = w.cfg.sessions_per_day
    if S <= CHUNK_SESSIONS:
        return next(_chunks(w, day)).intercepts
    k = -(-S // CHUNK_SESSIONS)
    return _calibration(w, day, k, _session_draws(w, day, 0, CHUNK_SESSIONS))


def _table_features(w: _World, table: pa.Table) -> dict[str, np.ndarray]:
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
    w = _World(cfg)
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


def generate(cfg: GenerateConfig, out: Path) -> dict[str, Any]:
    """Write days 0..cfg.days-1 to out/day=D/part-NNNNN.parquet; return the run's metrics.

    A day is written a chunk at a time (no part file spans two chunks), and the metrics are
    sums and sets of ids, so memory stays that of a chunk whatever the day's size."""
    from lrm.metrics import log_losses, ne_from_sums  # torch: only when metrics are made
    import torch

    w = _World(cfg)
    rows_per_file = max(1, min(cfg.rows_per_file, _MAX_LIST_VALUES // cfg.max_history))
    rows = sessions = files = hist_items = clicks = nbytes = 0
    loss = 0.0
    users = ads = np.zeros(0, np.int64)
    ctr_day = {}
    per_vertical = np.zeros((len(cfg.verticals), 3))  # rows, clicks, log loss of the truth
    with Reporter("generate", total=cfg.days, unit="day") as rep:
        for day in range(cfg.days):
            day_rows = day_clicks = part = 0
            for d in _chunks(w, day):
                for s0, s1 in _parts(d.imp_off, rows_per_file):
                    nbytes += io.write_parquet(_table(w, d, s0, s1), part_path(out, day, part))
                    part += 1
                y = d.imps[LABEL]
                day_rows += d.rows
                day_clicks += int(y.sum())
                sessions += len(d.imp_off) - 1
                hist_items += len(d.hist)
                users = np.union1d(users, d.sessions["user_id"])
                ads = np.union1d(ads, d.imps["ad_id"])
                losses = log_losses(torch.from_numpy(d.logit), torch.from_numpy(y)).numpy()
                loss += float(losses.sum())
                v = d.sessions["vertical"][d.sess_index]
                for j in range(len(cfg.verticals)):
                    on = v == j
                    per_vertical[j] += (on.sum(), y[on].sum(), losses[on].sum())
            files += part
            rows += day_rows
            clicks += day_clicks
            ctr_day[str(day)] = round(day_clicks / day_rows, 6)
            rep.update(1, rows=rows, ctr=day_clicks / day_rows)
    return {
        "rows": rows, "sessions": sessions, "days": cfg.days, "files": files, "bytes": nbytes,
        "mean_session_length": rows / sessions,
        "mean_history_length": hist_items / sessions,
        "ctr": clicks / rows, "ctr_per_day": ctr_day,
        "users_active": len(users), "ads_active": len(ads),
        # the NE of the true click logits (lrm.metrics): the best any model can do
        "oracle_ne": ne_from_sums(loss, clicks, rows),
        "verticals": _vertical_metrics(cfg, per_vertical),
    }


def _vertical_metrics(cfg: GenerateConfig, sums: np.ndarray) -> dict[str, dict[str, Any]]:
    """Per vertical (by name): its rows, click rate and oracle NE (None without both
    labels), from its [rows, clicks, log loss] sums."""
    from lrm.metrics import ne_from_sums

    out = {}
    for vc, (n, c, loss) in zip(cfg.verticals, sums, strict=True):
        out[vc.name] = {"rows": int(n), "ctr": float(c / n) if n else 0.0,
                        "oracle_ne": ne_from_sums(float(loss), int(c), int(n))
                        if 0 < c < n else None}
    return out
