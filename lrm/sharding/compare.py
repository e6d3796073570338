"""torchrec's planner and estimator on lrm's tables, topology and statistics.

`torchrec_plan` runs torchrec's EmbeddingShardingPlanner (enumerate -> estimate ->
partition, its default proposers) with the same sharding types lrm may use, the fused
kernel, and the statistics as its constraints (pooling factor and rows per rank of every
feature: RecD's user tables see sessions, not impressions), and reads its plan back as an
lrm Plan. `torchrec_costs` scores any plan (lrm's, the greedy one, torchrec's) with
torchrec's EmbeddingPerfEstimator, so every plan can be judged by both cost models.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from torch import nn

from lrm.sharding.cost import CostModel
from lrm.sharding.plan import KERNEL, Plan, from_torchrec
from lrm.sharding.stats import TableLoad
from lrm.sharding.topology import Topology


def tables_module(loads: Sequence[TableLoad]) -> nn.Module:
    """A module (tables on the meta device) holding `loads` at their module paths."""
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    by_path: dict[str, list[TableLoad]] = {}
    for t in loads:
        by_path.setdefault(t.module, []).append(t)

    def ebc(ts: list[TableLoad]) -> EmbeddingBagCollection:
        return EmbeddingBagCollection([EmbeddingBagConfig(
            name=t.name, num_embeddings=t.rows, embedding_dim=t.dim,
            feature_names=list(t.features)) for t in ts], device="meta")

    if list(by_path) == [""]:
        return ebc(by_path[""])
    root = nn.Module()
    for path, ts in by_path.items():
        *parents, last = path.split(".")
        m = root
        for p in parents:
            if not hasattr(m, p):
                m.add_module(p, nn.Module())
            m = getattr(m, p)
        m.add_module(last, ebc(ts))
    return root


def constraints(loads: Sequence[TableLoad], topo: Topology) -> dict[str, Any]:
    """torchrec's ParameterConstraints from lrm's loads: pooling factors and rows per rank of
    each feature, lrm's sharding types for this device, the fused kernel."""
    from torchrec.distributed.planner import ParameterConstraints

    W = topo.world_size
    out = {}
    for t in loads:
        n = len(t.features)
        pooling = t.ids / max(t.pooled_rows, 1e-9)
        rows_per_rank = max(1, round(t.pooled_rows / n / W))
        out[t.name] = ParameterConstraints(
            sharding_types=list(topo.sharding_types()), compute_kernels=[KERNEL],
            pooling_factors=[pooling] * n, batch_sizes=[rows_per_rank] * n)
    return out


def _quiet() -> None:
    for name in ("torchrec", "torchrec.distributed.planner"):
        logging.getLogger(name).setLevel(logging.ERROR)


def torchrec_plan(loads: Sequence[TableLoad], topo: Topology, model: CostModel, *,
                  module: nn.Module | None = None, timeout: int | None = None) -> Plan:
    """torchrec's planner's plan for these tables (costed by lrm's model; `seconds` set)."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.storage_reservations import (
        FixedPercentageStorageReservation,
    )

    _quiet()
    module = module if module is not None else tables_module(loads)
    batch = max(1, round(max(t.pooled_rows / len(t.features) for t in loads) / topo.world_size))
    start = time.perf_counter()
    planner = EmbeddingShardingPlanner(
        topology=topo.torchrec(), batch_size=batch, constraints=constraints(loads, topo),
        # the topology's memory already leaves out lrm's reserve for the dense part
        storage_reservation=FixedPercentageStorageReservation(0.0), debug=False,
        timeout_seconds=timeout)
    sharding_plan = planner.plan(module, [EmbeddingBagCollectionSharder()])
    seconds = time.perf_counter() - start
    plan = from_torchrec(sharding_plan, loads, topo, model)
    plan.seconds = seconds
    return plan


def torchrec_costs(plan: Plan, *, module: nn.Module | None = None) -> list[float]:
    """Seconds per step of every rank of `plan`, by torchrec's EmbeddingPerfEstimator."""
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator
    from torchrec.distributed.planner.types import Shard, ShardingOption
    from torchrec.distributed.planner.enumerators import get_partition_by_type
    from torchrec.distributed.planner.utils import build_sharder_data_map, sharder_name

    _quiet()
    topo = plan.topology
    loads = [p.table for p in plan.placements.values()]
    module = module if module is not None else tables_module(loads)
    ebcs = {path: m for path, m in module.named_modules()
            if isinstance(m, EmbeddingBagCollection)}
    cons = constraints(loads, topo)
    options = []
    for name, p in plan.placements.items():
        t = p.table
        ebc = ebcs[t.module]
        options.append(ShardingOption(
            name=name, tensor=ebc.embedding_bags[name].weight, module=(t.module, ebc),
            input_lengths=list(cons[name].pooling_factors),
            batch_size=cons[name].batch_sizes[0], sharding_type=p.kind,
            partition_by=get_partition_by_type(p.kind), compute_kernel=KERNEL,
            shards=[Shard(size=[s.rows, s.cols], offset=[s.row0, s.col0], rank=s.rank)
                    for s in p.shards], feature_names=list(t.features)))
    sharders = build_sharder_data_map(
        {sharder_name(EmbeddingBagCollection): EmbeddingBagCollectionSharder()})
    EmbeddingPerfEstimator(topo.torchrec(), constraints=cons).estimate(options, sharders)
    per_rank = [0.0] * topo.world_size
    for o in options:
        for s in o.shards:
            per_rank[s.rank] += s.perf.total / 1e3  # torchrec's perf is in milliseconds
    return per_rank
