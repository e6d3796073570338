"""When the foundation model trains, and which of its versions logs each day's logits.

ExFM's foundation model (FM, the teacher) is retrained on its own cadence, slower than the
vertical models' (VMs) daily updates, and its logits for a day come from the version that
was serving then: one trained on days that end `lag` days before it. So the FM lags, and
the students' auxiliary head and adapter exist for that gap.

    version c (a "cut")   trained on days [0, c) of every vertical (day by day: each version
                          goes on from the one before, lrm.train.days)
    cuts                  T, T + every, T + 2 every, ... (exfm.teacher_days, teacher_every)
    day d's logits        from the newest version c with c <= d - lag + 1, i.e. trained
                          through day d - lag or earlier (exfm.teacher_lag); none before the
                          first version serves (day T + lag - 1)

Only versions that log some day of the data are trained: the last cut is at most
last_day - lag + 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lrm.config import ExFMConfig
from lrm.errors import ConfigError


@dataclass(frozen=True)
class Schedule:
    cuts: tuple[int, ...]  # the FM's versions, by the day they end before (ascending)
    lag: int

    def serving(self, day: int) -> int | None:
        """The version whose logits day `day` carries (None: no version served yet)."""
        served = [c for c in self.cuts if c <= day - self.lag + 1]
        return served[-1] if served else None

    @property
    def first_served(self) -> int:
        """The first day a version's logits reach: the students' distillation starts."""
        return self.cuts[0] + self.lag - 1

    def windows(self) -> list[tuple[int, list[int]]]:
        """(cut, the days it trains on beyond the version before it), in order."""
        out, start = [], 0
        for c in self.cuts:
            out.append((c, list(range(start, c))))
            start = c
        return out


def joined(sched: Schedule, small: Callable[[list[int]], str | None]
           ) -> tuple[Schedule, list[str]]:
    """`sched` with every version whose days since the version before are too small to train
    on (`small`: why, in words; None: they are not) left out, its days joined to the next
    version's (a partial first day of an export with T = 1, a short day between versions);
    and a line for each. No version left: a ConfigError."""
    kept: list[int] = []
    lines = []
    start = 0
    for c in sched.cuts:
        window = list(range(start, c))
        why = small(window)
        if why is not None:
            lines.append(f"exfm: the foundation model's version until day {c} is left out: "
                         f"its days {window} hold {why}; they join the next version's")
            continue
        kept.append(c)
        start = c
    if not kept:
        raise ConfigError(f"exfm: the days before {sched.cuts[-1]} are too small to train the "
                          f"foundation model on ({lines[-1].split(' hold ')[-1]}); give the "
                          f"data more days or rows")
    return Schedule(tuple(kept), sched.lag), lines


def schedule(days: Sequence[int], cfg: ExFMConfig) -> Schedule:
    """The FM's versions for a dataset of `days` (module docstring)."""
    days = sorted(days)
    if not days:
        raise ConfigError("exfm: the data has no days")
    T, last = cfg.teacher_days, days[-1]
    if T + cfg.teacher_lag - 1 > last:
        raise ConfigError(f"exfm: the teacher's first version (days [0, {T})) would first log "
                          f"day {T + cfg.teacher_lag - 1} (exfm.teacher_lag {cfg.teacher_lag}); "
                          f"the data's last day is {last}: lower exfm.teacher_days or "
                          f"teacher_lag, or give the data more days")
    missing = sorted(set(range(T)) - set(days))
    if missing:
        raise ConfigError(f"exfm: the teacher trains on days [0, {T}); the data lacks days "
                          f"{missing}")
    top = last - cfg.teacher_lag + 1
    cuts = list(range(T, top + 1, cfg.teacher_every)) if cfg.teacher_every else [T]
    return Schedule(tuple(cuts), cfg.teacher_lag)


__all__ = ["Schedule", "joined", "schedule"]
