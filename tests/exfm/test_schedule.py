"""The FM's cadence: its versions (cuts), the days each trains on, the version each day's
logits come from. Planted bugs that turn it red: a day served by a version one day too old
(`c <= day - lag`), the last version left out (`range(T, top, ...)`), every version trained
from day 0 (windows without `start = c`)."""

from __future__ import annotations

import pytest

from lrm.config import ExFMConfig
from lrm.errors import ConfigError
from lrm.exfm.schedule import schedule


def test_versions_their_days_and_the_version_each_day_is_logged_by():
    s = schedule(range(9), ExFMConfig(teacher_days=3, teacher_every=2, teacher_lag=2))
    # the newest a cut may be: 8 - lag + 1 = 7, the version that logs the last day
    assert s.cuts == (3, 5, 7) and s.lag == 2 and s.first_served == 4
    assert s.windows() == [(3, [0, 1, 2]), (5, [3, 4]), (7, [5, 6])]  # each goes on
    # day d: the newest version trained through d - lag or earlier
    assert [s.serving(d) for d in range(9)] == [None] * 4 + [3, 3, 5, 5, 7]
    once = schedule(range(10), ExFMConfig(teacher_days=3, teacher_every=0, teacher_lag=1))
    assert once.cuts == (3,) and once.serving(9) == 3 and once.serving(2) is None


def test_a_schedule_the_data_cannot_hold_is_a_config_error():
    with pytest.raises(ConfigError, match="lacks days"):
        schedule([0, 2, 3, 4, 5], ExFMConfig(teacher_days=3, teacher_lag=1))
    with pytest.raises(ConfigError, match="would first log"):
        schedule(range(4), ExFMConfig(teacher_days=3, teacher_lag=3))
