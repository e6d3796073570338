"""Shared histories: runs of sliding windows, encoded and decoded, by hand and at random."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from lrm.data import histories
from lrm.errors import DataError

LIST = pa.list_(pa.int64())


def _rows(seed: int) -> list[list[int | None] | None]:
    """Windows sliding over a stream (0-3 new items each), jumps, and junk between."""
    rng = np.random.default_rng(seed)
    stream = rng.integers(0, 5, 300)  # few values: a shift has many false candidates
    rows: list[list[int | None] | None] = []
    p = 50
    for _ in range(int(rng.integers(1, 40))):
        r = rng.random()
        if r < 0.08:
            rows.append(None)
        elif r < 0.12:
            rows.append([])
        elif r < 0.16:
            rows.append([None if rng.random() < 0.4 else int(x) for x in rng.integers(0, 5, 4)])
        else:
            if r < 0.25:
                p = int(rng.integers(20, 280))  # another user
            p = min(p + int(rng.integers(0, 4)), 299)
            n = int(rng.integers(1, 15))
            rows.append([int(x) for x in stream[max(0, p - n):p][::-1]])
    return rows


def test_a_sliding_run_by_hand():
    rows = [[5, 4, 3, 2, 1], [6, 5, 4, 3, 2], [8, 7, 6, 5, 4], [8, 7, 6, 5, 4], [9, 8, 7],
            [1, 2]]  # the last does not slide on: a new run
    e = histories.encode(pa.array(rows, LIST))
    assert e.items.to_pylist() == [[9, 8, 7, 6, 5, 4, 3, 2, 1], None, None, None, None, [1, 2]]
    assert e.offset.tolist() == [4, 3, 1, 1, 0, 0]
    assert e.length.tolist() == [5, 5, 5, 5, 3, 2]
    assert (e.values_stored, e.values_carried) == (11, 25)
    assert histories.shifts(pa.array(rows, LIST)).tolist() == [-1, 1, 2, 0, 1, -1]


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("group", [None, 3])
def test_decode_undoes_encode(seed, group):
    rows = _rows(seed)
    e = histories.encode(pa.array(rows, LIST), group)
    runs = histories.decode(e.items, pa.array(e.offset), pa.array(e.length))
    assert runs.expand().to_pylist() == rows
    stored = e.items.is_valid().to_numpy(zero_copy_only=False)
    for i, row in enumerate(rows):
        if row is None:  # a null history: its own run, nothing stored
            assert e.offset[i] == -1 and not stored[i]
        elif group and i % group == 0:  # a row group reads on its own
            assert stored[i]
    assert e.values_stored <= e.values_carried


def test_the_first_layout_has_a_list_per_row():
    rows = _rows(3)
    runs = histories.decode(pa.array(rows, LIST), None, None)
    assert runs.expand().to_pylist() == rows
    assert runs.head.tolist() == list(range(len(rows)))


def test_windows_that_point_nowhere_name_the_row():
    e = histories.encode(pa.array([[3, 2, 1], [4, 3, 2]], LIST))
    with pytest.raises(DataError) as err:  # starts inside a run
        histories.decode(e.items.slice(1), pa.array(e.offset[1:]), pa.array(e.length[1:]),
                         source="f.parquet", field="h", first_row=7)
    assert (str(err.value.file), err.value.field) == ("f.parquet", "h")
    assert "row 7:" in str(err.value)
    with pytest.raises(DataError, match="row 1:"):  # reaches past the run's items
        histories.decode(e.items, pa.array(e.offset), pa.array([3, 5]))
