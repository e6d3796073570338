"""lrm's sharding (lrm.sharding.parallel) on 2 CPU ranks (gloo): the default plan and an
explicit table-wise one give models equal to the unsharded one, start from the same tables
whatever the plan, and unshard back to the same state dict.

A sharded EBC returns its keys in shard order and every rank has its own B and U; the
sharded models must still equal the unsharded ones with the same weights.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lrm.config import ModelConfig, TableConfig
from lrm.data.schema import synthetic_schema
from lrm.models import build_model

pytestmark = pytest.mark.slow


def _worker(rank: int, world: int, port: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
    from conftest import VOCAB, make_batches
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.types import ShardingType

    from lrm.dist import Dist
    from lrm.sharding import parallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    env = Dist(rank=rank, world_size=world, local_rank=rank, device=torch.device("cpu"))
    try:
        schema = synthetic_schema(VOCAB)
        cfg = ModelConfig(tables=TableConfig(shared={"user_history": "ad_id"}))
        for kind in ("teacher", "student"):
            torch.manual_seed(0)
            ref = build_model(kind, schema, cfg)
            names = parallel.table_names(build_model(kind, schema, cfg, device="meta"))

            def plan_of(kind_: ShardingType, min_partition: int | None = None):
                c = {n: ParameterConstraints(sharding_types=[kind_.value],
                                             compute_kernels=["fused"],
                                             min_partition=min_partition) for n in names}
                return EmbeddingShardingPlanner(
                    topology=Topology(world_size=world, compute_device="cpu"), constraints=c,
                ).collective_plan(build_model(kind, schema, cfg, device="meta"),
                                  parallel.sharders(0.05), dist.GroupMember.WORLD)

            plans = (None, plan_of(ShardingType.TABLE_WISE),  # lrm's default, explicit ones
                     plan_of(ShardingType.COLUMN_WISE, min_partition=4))
            fresh = []
            for plan in plans:
                torch.manual_seed(0)
                dmp = parallel.shard(build_model(kind, schema, cfg, device="meta"), env,
                                     embedding_lr=0.05, seed=7, plan=plan)
                fresh.append(parallel.full_state_dict(dmp, env))  # the plan-free init
                dmp.load_state_dict(ref.state_dict())
                full = parallel.full_state_dict(dmp, env)
                if rank == 0:  # unsharding gives back exactly what was loaded
                    for k, v in ref.state_dict().items():
                        torch.testing.assert_close(full[k], v, rtol=0, atol=0)
                plain, dedup = make_batches(schema, sessions=4 + 3 * rank, seed=rank)
                out = dmp(dedup)
                torch.testing.assert_close(out, ref(dedup), rtol=0, atol=1e-6)
                torch.testing.assert_close(dmp(plain), out, rtol=0, atol=1e-6)
                out.sum().backward()
            if rank == 0:
                tables = [k for k in fresh[0] if "embedding_bags" in k]
                assert tables
                for k in tables:  # the same tables whatever the plan
                    for other in fresh[1:]:
                        torch.testing.assert_close(fresh[0][k], other[k], rtol=0, atol=0)
    finally:
        dist.destroy_process_group()


def test_sharded_equals_unsharded_under_lrms_plans():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(2, port), nprocs=2)
