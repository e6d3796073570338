"""torchrec's planner and estimator on lrm's tables: same statistics, same types."""

from __future__ import annotations

import pytest

from lrm.sharding import compare, planner
from lrm.sharding.topology import COLUMN_WISE, TABLE_WISE
from tests.sharding.conftest import cost_model, random_tables, topology
from tests.sharding.test_planner import assert_complete


def test_torchrec_sees_lrms_statistics_and_types():
    topo = topology(4)
    loads = random_tables(6, seed=1)
    cons = compare.constraints(loads, topo)
    for t in loads:
        c = cons[t.name]
        assert c.sharding_types == [TABLE_WISE, COLUMN_WISE] and c.compute_kernels == ["fused"]
        assert c.pooling_factors == [pytest.approx(t.ids / t.pooled_rows)]
        assert c.batch_sizes == [round(t.pooled_rows / 4)]  # user tables: sessions a rank


def test_torchrecs_plan_is_read_back_and_both_models_score_every_plan():
    topo = topology(4)
    loads = random_tables(12, seed=4)
    cm = cost_model(topo)
    theirs = compare.torchrec_plan(loads, topo, cm, timeout=30)
    assert_complete(theirs, loads, topo.memory_bytes)
    assert theirs.planner == "torchrec" and theirs.seconds > 0
    ours = planner.plan(loads, topo, cm, time_limit=2)
    for p in (theirs, ours):
        per_rank = compare.torchrec_costs(p)
        assert len(per_rank) == 4 and min(per_rank) > 0
    # lrm's plan is at least as good as torchrec's by lrm's own cost model
    assert ours.max_cost <= theirs.max_cost * (1 + 1e-9)
