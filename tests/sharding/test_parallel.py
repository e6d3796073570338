"""parallel.shard's plans: one process keeps every table whole; a plan for other ranks or
another device is refused before DMP."""

from __future__ import annotations

import pytest
import torch

from lrm.config import ModelConfig
from lrm.data.schema import synthetic_schema
from lrm.dist import Dist
from lrm.errors import ConfigError
from lrm.models import build_model
from lrm.sharding import parallel

CPU1 = Dist(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def _model():
    return build_model("student", synthetic_schema({"user_id": 100, "ad_id": 50}),
                       ModelConfig(), device="meta")


def test_one_process_keeps_every_table_whole_on_its_rank():
    plan = parallel.one_device_plan(_model(), CPU1)
    kinds = {(ps.sharding_type, tuple(ps.ranks), ps.compute_kernel)
             for m in plan.plan.values() for ps in m.values()}
    assert kinds == {("table_wise", (0,), "fused")}
    assert sum(len(m) for m in plan.plan.values()) == len(parallel.table_names(_model()))


def test_a_plan_for_other_ranks_or_devices_is_refused():
    plan = parallel.one_device_plan(_model(), CPU1)
    two = Dist(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"))
    parallel.check_plan(plan, two)  # rank 0 exists in both
    ps = next(iter(next(iter(plan.plan.values())).values()))
    ps.ranks = [1]
    with pytest.raises(ConfigError, match="on rank 1; this run has 1 ranks"):
        parallel.check_plan(plan, CPU1)
    gpu = parallel.one_device_plan(_model(), Dist(rank=0, world_size=1, local_rank=0,
                                                  device=torch.device("cuda", 0)))
    with pytest.raises(ConfigError, match="places .* on cuda; this run trains on cpu"):
        parallel.check_plan(gpu, CPU1)
