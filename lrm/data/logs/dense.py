"""Dense features of a log: each scaled once from what the whole ingest saw.

A column whose values are heavy-tailed (a skewness above `HEAVY_SKEW`: counts, prices,
dwell times) is log-scaled, ``sign(x) log(1 + |x|)`` (``log(1 + x)`` where it is never
negative, DLRM's transform of Criteo's counts); then every column is standardized with the
mean and standard deviation of what it became, so the bottom MLP sees inputs of one scale
whatever the log's units. A missing value reads 0 (the mean). The choice, the mean and the
standard deviation are recorded per column (the dataset's ``_ingest/state.json``, the Arrow
field metadata of every impressions file, and the ingest metrics) and a later ingest that
continues the dataset (the stream's days) reuses them.

The moments are merged chunk by chunk (Chan et al.'s pairwise update of the second and third
central moments), so the decision needs one pass and no copy of the column. Values too large
(or too small) for their cubes to be summed in float64 are first divided by a power of two
near the largest magnitude seen (exact: only the exponent changes), so any finite column has
finite moments; the ordinary range is summed as it is, bit for bit as ever.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import polars as pl

from lrm.errors import DataError

HEAVY_SKEW = 2.0  # |skewness| above this: log-scaled
# Largest magnitudes within 2**-PLAIN_EXP..2**PLAIN_EXP are summed unscaled: n * (2x)**3
# stays far inside float64 for any plausible row count, and far above its underflow.
PLAIN_EXP = 100
# (x - mean) / std is computed halved where |mean| + std * sqrt(n) (a bound on |x - mean|)
# could reach float64's largest value, which x - mean would overflow to infinity.
HALVE_ABOVE = 2.0 ** 1020


def scale_exp(biggest: float) -> int:
    """The power of two a chunk whose largest magnitude is `biggest` is divided by: 0 in the
    ordinary range (nothing changes), else the exponent that brings it into [0.5, 1)."""
    if biggest == 0 or 2.0 ** -PLAIN_EXP <= biggest <= 2.0 ** PLAIN_EXP:
        return 0
    return math.frexp(biggest)[1]


def unscale(v: float, k: int) -> float:
    """v * 2**k; infinity where that overflows (math.ldexp raises instead)."""
    try:
        return math.ldexp(v, k)
    except OverflowError:
        return math.copysign(math.inf, v)


@dataclass
class Moments:
    """Count, mean, and the second and third central moment sums of a column, all of the
    values divided by 2**k (k = 0 in the ordinary range); the least and greatest value."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0
    m3: float = 0.0
    lo: float = math.inf
    hi: float = -math.inf
    k: int = 0

    @classmethod
    def of(cls, x: np.ndarray) -> Moments:
        if x.size == 0:
            return cls()
        lo, hi = float(x.min()), float(x.max())
        k = scale_exp(max(-lo, hi))
        u = np.ldexp(x, -k) if k else x
        mean = float(u.mean())
        d = u - mean
        d2 = d * d  # (then d**3 in its place: one temporary, not three; the same sums)
        m2 = float(d2.sum())
        d2 *= d
        return cls(int(x.size), mean, m2, float(d2.sum()), lo, hi, k)

    def at(self, k: int) -> Moments:
        """The same moments with the values divided by 2**k (k >= self.k: what is lost is
        below float64's resolution of the larger values)."""
        if k == self.k:
            return self
        s = self.k - k
        return replace(self, mean=math.ldexp(self.mean, s), m2=math.ldexp(self.m2, 2 * s),
                       m3=math.ldexp(self.m3, 3 * s), k=k)

    def merge(self, o: Moments) -> Moments:
        if o.n == 0:
            return self
        if self.n == 0:
            return o
        k = max(self.k, o.k)
        a, b = self.at(k), o.at(k)
        n = a.n + b.n
        delta = b.mean - a.mean
        mean = a.mean + delta * b.n / n
        m2 = a.m2 + b.m2 + delta * delta * a.n * b.n / n
        m3 = (a.m3 + b.m3 + delta ** 3 * a.n * b.n * (a.n - b.n) / n ** 2
              + 3 * delta * (a.n * b.m2 - b.n * a.m2) / n)
        return Moments(n, mean, m2, m3, min(a.lo, b.lo), max(a.hi, b.hi), k)

    @property
    def constant(self) -> bool:
        """Every value the same: its mean is that value, not a rounding of their sum."""
        return self.n > 0 and self.lo == self.hi

    @property
    def center(self) -> float:
        """The mean, in the values' units (within [lo, hi], where rounding left it)."""
        if self.n == 0:
            return 0.0
        if self.constant:
            return self.lo
        if self.k == 0:
            return self.mean
        return min(max(unscale(self.mean, self.k), self.lo), self.hi)

    @property
    def std(self) -> float:
        if self.n == 0 or self.constant:
            return 0.0
        return unscale(math.sqrt(self.m2 / self.n), self.k)

    @property
    def skew(self) -> float:
        if self.n == 0 or self.m2 <= 0 or self.constant:
            return 0.0
        spread = (self.m2 / self.n) ** 1.5
        return (self.m3 / self.n) / spread if spread > 0 else 0.0


def signed_log(x: pl.Expr | np.ndarray) -> Any:
    if isinstance(x, np.ndarray):  # (in one array: sign * log1p(|x|), the same values)
        r = np.abs(x)
        np.log1p(r, out=r)
        r *= np.sign(x)
        return r
    return x.sign() * x.abs().log1p()


@dataclass
class Stats:
    """A dense column's moments, as read and log-scaled."""

    raw: Moments
    log: Moments
    name: str = ""  # the column's, for an error

    @classmethod
    def of(cls, x: pl.Series) -> Stats:
        v = x.drop_nulls().to_numpy().astype(np.float64, copy=False)
        # (the parsed frame names a dense column "d:<column>")
        return cls(Moments.of(v), Moments.of(signed_log(v)), x.name.removeprefix("d:"))

    def merge(self, o: Stats) -> Stats:
        return Stats(self.raw.merge(o.raw), self.log.merge(o.log), self.name or o.name)

    def decide(self) -> dict[str, Any]:
        """{transform: none | log1p | signed_log1p, mean, std, skew} of the column."""
        heavy = abs(self.raw.skew) > HEAVY_SKEW
        m = self.log if heavy else self.raw
        kind = ("log1p" if self.raw.lo >= 0 else "signed_log1p") if heavy else "none"
        how = {"transform": kind, "mean": m.center, "std": m.std if m.std > 0 else 1.0,
               "skew": round(self.raw.skew, 3), "values": self.raw.n}
        check_finite(how, self.name)
        return how


def check_finite(how: dict[str, Any], column: str) -> None:
    """A scaling that is not finite would write NaN (and state.json would not be JSON)."""
    bad = [k for k in ("mean", "std", "skew") if not math.isfinite(how[k])]
    if bad:
        raise DataError("the input files", None, column,
                        f"cannot scale the dense column: its {' and '.join(bad)} is not "
                        f"finite ({', '.join(f'{k} {how[k]}' for k in bad)})")


def may_overflow(how: dict[str, Any]) -> bool:
    """Whether x - mean can overflow float64 for a value x of the data `how` came from
    (|x - mean| <= std * sqrt(n))."""
    n = max(int(how.get("values", 1)), 1)
    return abs(how["mean"]) + how["std"] * math.sqrt(n) >= HALVE_ABOVE


def scaled(x: pl.Expr, how: dict[str, Any]) -> pl.Expr:
    """The column as the model reads it: transformed, standardized, missing as 0."""
    v = signed_log(x) if how["transform"] != "none" else x
    mean, std = how["mean"], how["std"]
    if may_overflow(how):  # halved (exact) so that v - mean stays finite
        z = (v * 0.5 - mean * 0.5) / (std * 0.5)
    else:
        z = (v - mean) / std
    return z.fill_null(0.0).cast(pl.Float32)
