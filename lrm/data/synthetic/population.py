"""Who comes: users and ads by popularity rank (a truncated power law) and churn (a rank's
occupant is replaced now and then by a new id, whose traffic ramps up), with no per-id state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lrm.data.synthetic.hashing import hash_ids, to_unit

RAMP_DAYS = 3.0  # an arriving user or ad reaches its rank's full traffic over its first days


def id_space(live: int, churn: float) -> int:
    """The id space of `live` ids: with churn, two slots per id, so arrivals get new ids
    (Population)."""
    return 2 * live if churn > 0 else live


@dataclass(frozen=True)
class PowerLaw:
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
class Population:
    """Popularity rank -> id on a day, with churn; O(1) per lookup, no per-id state.

    Rank r has phase phi(r) in [0, 1); its generation on day d is floor(d * churn + phi).
    With churn, the id space holds two slots per rank and a rank's generations alternate
    between them (slot r + n * (gen % 2)), so no two live ids are equal and a newcomer's id
    is one nobody held for the last 1/churn days: an arrival is a new id to a model, as in
    a real log, and an id's age is a function of the id. Slot -> id is the affine
    permutation (mul * slot + add) mod space.
    """

    law: PowerLaw  # popularity of the ranks 0..n-1 (n live ids)
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
    def make(cls, law: PowerLaw, churn: float, rng: np.random.Generator, salt: np.uint64
             ) -> Population:
        space = id_space(law.n, churn)
        mul = 1
        if space > 2:
            while True:
                mul = int(rng.integers(max(2, space // 3), space))
                if math.gcd(mul, space) == 1:
                    break
        return cls(law=law, churn=churn, mul=mul, add=int(rng.integers(0, space)), salt=salt)

    def _phase(self, rank: np.ndarray) -> np.ndarray:
        return to_unit(hash_ids(rank, self.salt))

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

