"""lrm.fanout's default mapper: units one after the other, or a few at a time on threads of
this process (`map_units(threads=)`), their results in item order either way.

Planted bugs that turn these red (each tried): the threads ignored (units in turn: the
barrier breaks), the results in the order the units finish, an error swallowed (its unit's
result None).
"""

from __future__ import annotations

import threading
import time

import pytest

from lrm import fanout


def test_units_on_threads_run_together_and_come_back_in_item_order():
    both = threading.Barrier(2, timeout=10)  # breaks unless two units run at once

    def unit(x: int) -> int:
        if x < 2:
            both.wait()
        time.sleep(0.05 * (5 - x))  # the later units finish first
        return x * x

    assert fanout.map_units("test", unit, range(5), threads=2) == [0, 1, 4, 9, 16]
    assert fanout.map_units("test", lambda x: x + 1, [1, 2]) == [2, 3]  # in turn


def test_a_units_error_is_raised_from_the_threads():
    def unit(x: int) -> int:
        if x == 1:
            raise ValueError("unit 1")
        return x

    with pytest.raises(ValueError, match="unit 1"):
        fanout.map_units("test", unit, range(4), threads=2)
