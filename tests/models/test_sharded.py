"""Both models under DistributedModelParallel: 2 CPU ranks (gloo), tables sharded table-wise.

A sharded EBC returns its keys in shard order and every rank has its own B and U; the
sharded models must still equal the unsharded ones with the same weights.
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lrm.config import ModelConfig, TableConfig
from lrm.data.schema import synthetic_schema
from lrm.models import build_model
from lrm.models.tables import embedding_tables

pytestmark = pytest.mark.slow


def _worker(rank: int, world: int, port: int) -> None:
    from conftest import VOCAB, make_batches
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.types import ShardingType

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        schema = synthetic_schema(VOCAB)
        cfg = ModelConfig(tables=TableConfig(shared={"user_history": "ad_id"}))
        for kind in ("teacher", "student"):
            torch.manual_seed(0)
            ref = build_model(kind, schema, cfg)
            model = build_model(kind, schema, cfg, device="meta")
            names = [t.name for t in embedding_tables(schema, cfg.tables, 1)]
            tw = ParameterConstraints(sharding_types=[ShardingType.TABLE_WISE.value])
            planner = EmbeddingShardingPlanner(
                topology=Topology(world_size=world, compute_device="cpu"),
                constraints={n: tw for n in names})
            sharders = [EmbeddingBagCollectionSharder()]
            plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
            dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan,
                                           sharders=sharders)
            dmp.load_state_dict(ref.state_dict())
            plain, dedup = make_batches(schema, sessions=4 + 3 * rank, seed=rank)
            out = dmp(dedup)
            torch.testing.assert_close(out, ref(dedup), rtol=0, atol=1e-6)
            torch.testing.assert_close(dmp(plain), out, rtol=0, atol=1e-6)
            out.sum().backward()
    finally:
        dist.destroy_process_group()


def test_sharded_equals_unsharded():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(2, port), nprocs=2)
