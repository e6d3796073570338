"""Data profiles the benchmarks share (one place, so data.storage and train.dedup agree)."""

from __future__ import annotations

from lrm.config import GenerateConfig

HEAVY_MAX_HISTORY = 1024  # ~840 ads on average (0.8 x max_history)


def history_heavy(quick: bool, days: int = 1, sessions: int = 0) -> GenerateConfig:
    """RecD's setting: long user histories (up to HEAVY_MAX_HISTORY ads; production models
    carry sequences of hundreds to thousands), so the user side dominates an impression's
    features. A day of 8,000 sessions (2,500 with --quick; at least `sessions`). Users scale
    with sessions (the default world's 5 users per session a day), so a user has as many
    sessions a day as at the default size and a day can be small enough for a benchmark."""
    sessions = max(sessions, 2_500 if quick else 8_000)
    return GenerateConfig(users=5 * sessions, sessions_per_day=sessions, days=days,
                          max_history=HEAVY_MAX_HISTORY)
