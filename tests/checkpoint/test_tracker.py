"""torchrec's ModelDeltaTracker with fbgemm's fused row-wise Adagrad on CPU: the rows it
reports are exactly the rows training looked up and changed; eval lookups are left out."""

from __future__ import annotations

import pytest
import torch

from lrm.checkpoint.tables import table_shards
from lrm.checkpoint.tracker import RowTracker
from tests.checkpoint.conftest import FEATURES, TABLES, WEIGHT, batch, build, tables_and_state, \
    train_steps


def _looked_up(steps: range) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {t: set() for t in TABLES}
    for s in steps:
        kjt, _ = batch(s)
        for f, t in FEATURES.items():
            out[t] |= set(kjt[f].values().tolist())
    return out


@pytest.mark.parametrize("layout", ["table", "column"])
def test_tracked_rows_are_the_trained_rows(env, layout):
    dmp, parts = build(env, layout)
    tracker = RowTracker(dmp)
    before = tables_and_state(parts, env)
    train_steps(parts, range(3))
    dmp.eval()  # a held-out evaluation reads rows but changes none
    kjt, _ = batch(99, spread=0.2)
    with torch.no_grad():
        dmp(kjt)
    dmp.train()
    after = tables_and_state(parts, env)
    state = {k: v.state_dict() for k, v in parts.items()}
    touched = tracker.take(table_shards(state["model"], state["optim"]))
    looked = _looked_up(range(3))
    for t in TABLES:
        key = WEIGHT.format(t)
        changed = (before[key] != after[key]).any(1).nonzero().flatten().tolist()
        got = touched[key].tolist()
        assert got == sorted(looked[t]), t  # the training lookups, not the eval one
        assert set(changed) <= set(got) and len(changed) > 0, t
    again = tracker.take(table_shards(state["model"], state["optim"]))
    assert all(v.numel() == 0 for v in again.values())  # taken: forgotten
    tracker.close()
    train_steps(parts, range(3, 4))
    assert "lrm_checkpoint" not in dmp.model_trackers
