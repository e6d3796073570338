"""Data profiles the benchmarks share (one place, so data.storage and train.dedup agree, and
every benchmark's --smoke world is the same small one)."""

from __future__ import annotations

from typing import Any

from bench.common import smoke
from lrm.config import GenerateConfig

HEAVY_MAX_HISTORY = 1024  # ~840 ads on average (0.8 x max_history)
SMOKE_SESSIONS = 400  # a smoke day's sessions (~3,200 impressions)


def tiny(days: int = 2, sessions: int = SMOKE_SESSIONS, **kw: Any) -> GenerateConfig:
    """The --smoke world: the default world's structure (its verticals, churn, drift) over
    few users and ads, `sessions` a day: seconds to generate, dedup and train on."""
    return GenerateConfig(**{"users": 5_000, "ads": 1_000, "advertisers": 100,
                             "categories": 20, "days": days, "sessions_per_day": sessions,
                             **kw})


def history_heavy(quick: bool, days: int = 1, sessions: int = 0) -> GenerateConfig:
    """RecD's setting: long user histories (up to HEAVY_MAX_HISTORY ads; production models
    carry sequences of hundreds to thousands), so the user side dominates an impression's
    features. A day of 8,000 sessions (2,500 with --quick, 200 with --smoke; at least
    `sessions`). Users scale with sessions (the default world's 5 users per session a day),
    so a user has as many sessions a day as at the default size and a day can be small
    enough for a benchmark."""
    sessions = max(sessions, 200 if smoke() else 2_500 if quick else 8_000)
    return GenerateConfig(users=5 * sessions, sessions_per_day=sessions, days=days,
                          max_history=HEAVY_MAX_HISTORY)
