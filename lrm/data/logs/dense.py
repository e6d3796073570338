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
central moments), so the decision needs one pass and no copy of the column.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

HEAVY_SKEW = 2.0  # |skewness| above this: log-scaled


@dataclass
class Moments:
    """Count, mean, and the second and third central moment sums of a column."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0
    m3: float = 0.0
    lo: float = math.inf

    @classmethod
    def of(cls, x: np.ndarray) -> Moments:
        if x.size == 0:
            return cls()
        mean = float(x.mean())
        d = x - mean
        return cls(int(x.size), mean, float((d * d).sum()), float((d * d * d).sum()),
                   float(x.min()))

    def merge(self, o: Moments) -> Moments:
        if o.n == 0:
            return self
        if self.n == 0:
            return o
        n = self.n + o.n
        delta = o.mean - self.mean
        mean = self.mean + delta * o.n / n
        m2 = self.m2 + o.m2 + delta * delta * self.n * o.n / n
        m3 = (self.m3 + o.m3 + delta ** 3 * self.n * o.n * (self.n - o.n) / n ** 2
              + 3 * delta * (self.n * o.m2 - o.n * self.m2) / n)
        return Moments(n, mean, m2, m3, min(self.lo, o.lo))

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.n) if self.n else 0.0

    @property
    def skew(self) -> float:
        if self.n == 0 or self.m2 <= 0:
            return 0.0
        return (self.m3 / self.n) / (self.m2 / self.n) ** 1.5


def signed_log(x: pl.Expr | np.ndarray) -> Any:
    if isinstance(x, np.ndarray):
        return np.sign(x) * np.log1p(np.abs(x))
    return x.sign() * x.abs().log1p()


@dataclass
class Stats:
    """A dense column's moments, as read and log-scaled."""

    raw: Moments
    log: Moments

    @classmethod
    def of(cls, x: pl.Series) -> Stats:
        v = x.drop_nulls().to_numpy().astype(np.float64)
        return cls(Moments.of(v), Moments.of(signed_log(v)))

    def merge(self, o: Stats) -> Stats:
        return Stats(self.raw.merge(o.raw), self.log.merge(o.log))

    def decide(self) -> dict[str, Any]:
        """{transform: none | log1p | signed_log1p, mean, std, skew} of the column."""
        heavy = abs(self.raw.skew) > HEAVY_SKEW
        m = self.log if heavy else self.raw
        kind = ("log1p" if self.raw.lo >= 0 else "signed_log1p") if heavy else "none"
        return {"transform": kind, "mean": m.mean, "std": m.std if m.std > 0 else 1.0,
                "skew": round(self.raw.skew, 3), "values": self.raw.n}


def scaled(x: pl.Expr, how: dict[str, Any]) -> pl.Expr:
    """The column as the model reads it: transformed, standardized, missing as 0."""
    v = signed_log(x) if how["transform"] != "none" else x
    return ((v - how["mean"]) / how["std"]).fill_null(0.0).cast(pl.Float32)
