"""The rows a checkpoint's delta holds, read off fbgemm's fused row-wise Adagrad on CPU:
exactly the rows training looked up and changed; eval lookups are left out; shards' row
offsets and column shards of one table."""

from __future__ import annotations

import pytest
import torch

from lrm.checkpoint.tables import TableShard, table_shards
from lrm.checkpoint.tracker import RowTracker
from tests.checkpoint.conftest import TABLES, WEIGHT, batch, build, looked_up, \
    tables_and_state, train_steps


def _tables(parts):
    state = {k: v.state_dict() for k, v in parts.items()}
    return table_shards(state["model"], state["optim"])


@pytest.mark.parametrize("layout", ["table", "column"])
def test_tracked_rows_are_the_trained_rows(env, layout):
    dmp, parts = build(env, layout)
    tracker = RowTracker()
    assert tracker.take(_tables(parts)) is None  # nothing to compare with: every row
    train_steps(parts, range(2))
    before = tables_and_state(parts, env)
    tracker.reset(_tables(parts))  # e.g. after a restore: rows changed from here on
    train_steps(parts, range(2, 5))
    dmp.eval()  # a held-out evaluation reads rows but changes none
    kjt, _ = batch(99, spread=0.2)
    with torch.no_grad():
        dmp(kjt)
    dmp.train()
    after = tables_and_state(parts, env)
    touched = tracker.take(_tables(parts))
    assert touched is not None
    looked = looked_up(range(2, 5))
    for t in TABLES:
        key = WEIGHT.format(t)
        changed = (before[key] != after[key]).any(1).nonzero().flatten().tolist()
        # the training lookups (not the eval one), and exactly the rows whose weights moved
        assert touched[key].tolist() == sorted(looked[t]) == changed, t
    again = tracker.take(_tables(parts))
    assert again is not None and all(v.numel() == 0 for v in again.values())  # taken


def test_rows_are_global_and_column_shards_are_one_set():
    """Shards of rows [10, 14) of a table: the ids are global rows; two column shards of the
    same rows report the union; a table without a row-wise state reports every row."""
    def shard(c0: int, state: torch.Tensor | None) -> TableShard:
        return TableShard("t", 20, 4, torch.zeros(4, 2), 10, c0,
                          {} if state is None else {"t.momentum1": state})

    left, right = torch.zeros(4), torch.zeros(4)
    tables = {"t": [shard(0, left), shard(2, right)], "plain": [shard(0, None)]}
    tracker = RowTracker()
    tracker.take(tables)
    left[1] += 1.0
    right[3] += 1.0
    got = tracker.take(tables)
    assert got is not None
    assert got["t"].tolist() == [11, 13]
    assert got["plain"].tolist() == [10, 11, 12, 13]
    tables["t"].append(TableShard("t", 20, 4, torch.zeros(4, 2), 16, 0,
                                  {"t.momentum1": torch.zeros(4)}))
    assert tracker.take(tables) is None  # a shard it has not seen: every row
