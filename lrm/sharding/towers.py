"""DMT towers: the tables grouped into one tower per host, so each tower's lookups and
partial results stay on its host's fast links.

DMT (Disaggregated Multi-Tower) groups features that co-occur into towers, puts each
tower on one host, and keeps its lookups inside the host; only the towers' outputs cross
hosts. Here a tower is a placement constraint: every shard of a tower's tables goes to
the ranks of its host (table-wise, column-wise or table-row-wise there; never row-wise
over every rank), so split tables combine their partial results over intra-host links.
lrm's models have no tower modules that would compress a tower's output before it
crosses hosts, so the pooled embeddings themselves still cross: the saving the cost
model credits is the split tables' traffic, which the plan reports.

Grouping: tables by cost, largest first, each to the tower (host) it co-occurs with most
(the mean share of impressions where its features and the tower's have ids together,
from the statistics), among the towers it keeps within `slack` of an even load and whose
host has memory for it; when none qualifies, to the least loaded tower.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lrm.sharding.cost import CostModel
from lrm.sharding.stats import TableLoad
from lrm.sharding.topology import Topology


def group(loads: Sequence[TableLoad], topo: Topology, model: CostModel,
          cooccurrence: Mapping[str, Mapping[str, float]],
          slack: float = 0.05) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """(table -> host, one report per tower) for `topo`'s hosts."""
    H = topo.hosts
    whole = {t.name: model.shard(t, "table_wise", 0, t.rows, t.dim) for t in loads}
    cost = {k: c.total for k, c in whole.items()}
    size = {k: c.bytes for k, c in whole.items()}
    target = sum(cost.values()) / H * (1 + slack)
    room = topo.memory_bytes * topo.ranks_per_host
    load, mem = [0.0] * H, [0] * H
    members: list[list[TableLoad]] = [[] for _ in range(H)]

    def affinity(t: TableLoad, h: int) -> float:
        pairs = [cooccurrence.get(f, {}).get(g, 0.0) for f in t.features
                 for m in members[h] for g in m.features]
        return sum(pairs) / len(pairs) if pairs else 0.0

    hosts: dict[str, int] = {}
    for t in sorted(loads, key=lambda x: -cost[x.name]):
        ok = [h for h in range(H) if load[h] + cost[t.name] <= target
              and mem[h] + size[t.name] <= room]
        h = max(ok, key=lambda h: (affinity(t, h), -load[h])) if ok else \
            min(range(H), key=lambda h: load[h])
        hosts[t.name] = h
        load[h] += cost[t.name]
        mem[h] += size[t.name]
        members[h].append(t)
    report = []
    for h in range(H):
        feats = [f for t in members[h] for f in t.features]
        pairs = [cooccurrence.get(f, {}).get(g, 0.0) for i, f in enumerate(feats)
                 for g in feats[i + 1:]]
        report.append({"host": h, "tables": [t.name for t in members[h]],
                       "features": feats, "table_wise_cost_ms": round(load[h] * 1e3, 6),
                       "cooccurrence": round(sum(pairs) / len(pairs), 6) if pairs else None})
    return hosts, report
