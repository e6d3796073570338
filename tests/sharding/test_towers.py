"""DMT towers: co-occurring features grouped per host, loads balanced, placement kept."""

from __future__ import annotations

from lrm.sharding import planner, towers
from lrm.sharding.stats import TableLoad
from tests.sharding.conftest import cost_model, topology


def _tables():
    return [TableLoad(name=f"t_{f}", module="", rows=20_000, dim=32, features=(f,),
                      ids=8192, unique_ids=4000, pooled_rows=4096)
            for f in ("a1", "a2", "a3", "b1", "b2", "b3")]


def _cooc(loads):
    feats = [t.features[0] for t in loads]
    return {f: {g: (0.9 if f[0] == g[0] else 0.05) for g in feats} for f in feats}


def test_cooccurring_features_share_a_tower_and_the_towers_balance():
    topo = topology(4, device="cuda", rph=2)
    loads = _tables()
    hosts, report = towers.group(loads, topo, cost_model(topo), _cooc(loads))
    by_host = {h: sorted(n for n, x in hosts.items() if x == h) for h in range(2)}
    assert sorted(by_host.values()) == [["t_a1", "t_a2", "t_a3"], ["t_b1", "t_b2", "t_b3"]]
    assert {r["host"] for r in report} == {0, 1}
    assert all(r["cooccurrence"] > 0.8 for r in report)


def test_with_towers_every_shard_stays_on_its_towers_host():
    topo = topology(4, device="cuda", rph=2)
    loads = _tables()
    p = planner.plan_model(loads, topo, cost_model(topo), towers=True,
                           cooccurrence=_cooc(loads), time_limit=2)
    assert p.towers is not None and len(p.towers) == 2
    host_of = {n: r["host"] for r in p.towers for n in r["tables"]}
    for name, pl in p.placements.items():
        assert {topo.host_of(s.rank) for s in pl.shards} == {host_of[name]}
    one_host = topology(4, device="cuda")
    q = planner.plan_model(loads, one_host, cost_model(one_host), towers=True, time_limit=1)
    assert q.towers is None and "one host" in q.notes[0]
