"""Plans as JSON and as torchrec ShardingPlans; the plan file a training run reads."""

from __future__ import annotations

import json

import pytest
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

from lrm.config import ModelConfig, StudentModelConfig, TableConfig
from lrm.data.schema import read_schema
from lrm.errors import ConfigError
from lrm.models import build_model
from lrm.sharding import planner
from lrm.sharding.plan import (
    Placement,
    Plan,
    Shard,
    from_torchrec,
    read_file,
    to_torchrec,
    training_plan,
    write_file,
)
from lrm.sharding.stats import TableLoad
from lrm.sharding.topology import COLUMN_WISE, ROW_WISE, TABLE_ROW_WISE, TABLE_WISE
from tests.sharding.conftest import cost_model, random_tables, topology


def _shards(ps) -> list[tuple[int, list[int], list[int]]]:
    return sorted((m.placement.rank(), list(m.shard_offsets), list(m.shard_sizes))
                  for m in ps.sharding_spec.shards)


def test_a_plan_round_trips_through_json():
    topo = topology(8, device="cuda", rph=4)
    loads = random_tables(25, seed=2)
    p = planner.plan(loads, topo, cost_model(topo), time_limit=2)
    doc = json.loads(json.dumps(p.to_json()))
    back = Plan.from_json(doc, topo, cost_model(topo))
    assert {n: (q.kind, q.shards) for n, q in back.placements.items()} == \
        {n: (q.kind, q.shards) for n, q in p.placements.items()}
    assert back.placements["t3"].table == p.placements["t3"].table
    assert back.loads() == pytest.approx(p.loads(), rel=1e-12)
    assert doc["imbalance"] == pytest.approx(p.imbalance, rel=1e-5)
    # without a cost model, the shards' costs come from the file
    assert Plan.from_json(doc, topo).loads() == pytest.approx(p.loads(), rel=1e-5)


def test_a_plan_that_does_not_tile_its_tables_is_refused():
    topo = topology(2)
    t = TableLoad(name="t", module="", rows=100, dim=8, features=("f",), ids=1,
                  unique_ids=1, pooled_rows=1)
    half = Plan(topo, {"t": Placement(t, COLUMN_WISE, [Shard(0, 0, 100, 0, 4)])})
    with pytest.raises(ConfigError, match="cover 400 of 800 cells"):
        half.check()
    off = Plan(topo, {"t": Placement(t, TABLE_WISE, [Shard(2, 0, 100, 0, 8)])})
    with pytest.raises(ConfigError, match="rank 2, outside 0..1"):
        off.check()


def _ebc() -> EmbeddingBagCollection:
    return EmbeddingBagCollection([
        EmbeddingBagConfig(name=n, num_embeddings=rows, embedding_dim=16, feature_names=[n])
        for n, rows in (("tw", 100), ("cw", 100), ("rw", 10), ("twrw", 37))], device="meta")


def test_a_plan_becomes_the_torchrec_plan_with_its_shards():
    topo = topology(4, device="cuda", rph=2)
    loads = {n: TableLoad(name=n, module="", rows=r, dim=16, features=(n,), ids=1,
                          unique_ids=1, pooled_rows=1)
             for n, r in (("tw", 100), ("cw", 100), ("rw", 10), ("twrw", 37))}
    p = Plan(topo, {
        "tw": Placement(loads["tw"], TABLE_WISE, [Shard(3, 0, 100, 0, 16)]),
        "cw": Placement(loads["cw"], COLUMN_WISE, [Shard(2, 0, 100, 0, 8),
                                                    Shard(0, 0, 100, 8, 8)]),
        "rw": Placement(loads["rw"], ROW_WISE, [Shard(r, r0, n, 0, 16) for r, (r0, n) in
                                                enumerate(((0, 3), (3, 3), (6, 3), (9, 1)))]),
        "twrw": Placement(loads["twrw"], TABLE_ROW_WISE, [Shard(2, 0, 19, 0, 16),
                                                          Shard(3, 19, 18, 0, 16)])})
    p.check()
    sp = to_torchrec(p, _ebc(), device="cuda")
    mp = sp.plan[""]
    assert {n: ps.sharding_type for n, ps in mp.items()} == {
        "tw": "table_wise", "cw": "column_wise", "rw": "row_wise", "twrw": "table_row_wise"}
    assert {ps.compute_kernel for ps in mp.values()} == {"fused"}
    assert _shards(mp["tw"]) == [(3, [0, 0], [100, 16])]
    assert _shards(mp["cw"]) == [(0, [0, 8], [100, 8]), (2, [0, 0], [100, 8])]
    assert _shards(mp["rw"]) == [(0, [0, 0], [3, 16]), (1, [3, 0], [3, 16]),
                                 (2, [6, 0], [3, 16]), (3, [9, 0], [1, 16])]
    assert _shards(mp["twrw"]) == [(2, [0, 0], [19, 16]), (3, [19, 0], [18, 16])]
    assert str(mp["tw"].sharding_spec.shards[0].placement) == "rank:3/cuda:1"
    # and back: torchrec's plan read as lrm's is the same plan
    back = from_torchrec(sp, list(loads.values()), topo, cost_model(topo))
    assert {n: (q.kind, sorted(q.shards, key=lambda s: (s.row0, s.col0)))
            for n, q in back.placements.items()} == \
        {n: (q.kind, sorted(q.shards, key=lambda s: (s.row0, s.col0)))
         for n, q in p.placements.items()}


def test_shards_torchrec_cannot_make_are_refused():
    topo = topology(2)
    t = TableLoad(name="cw", module="", rows=100, dim=16, features=("cw",), ids=1,
                  unique_ids=1, pooled_rows=1)
    uneven = Plan(topo, {"cw": Placement(t, COLUMN_WISE, [Shard(0, 0, 100, 0, 12),
                                                          Shard(1, 0, 100, 12, 4)])})
    ebc = EmbeddingBagCollection([EmbeddingBagConfig(
        name="cw", num_embeddings=100, embedding_dim=16, feature_names=["cw"])], device="meta")
    with pytest.raises(ConfigError, match="torchrec cannot shard it as the plan says"):
        to_torchrec(uneven, ebc, device="cpu")
    other = EmbeddingBagCollection([EmbeddingBagConfig(
        name="cw", num_embeddings=100, embedding_dim=8, feature_names=["cw"])], device="meta")
    with pytest.raises(ConfigError, match="the model's is 100x8"):
        to_torchrec(uneven, other, device="cpu")


def test_the_training_run_reads_its_models_entry_and_checks_the_run(tiny_data, tmp_path,
                                                                    monkeypatch):
    from lrm.sharding import stats as S

    schema, _ = read_schema(tiny_data)
    cfg = ModelConfig(tables=TableConfig(), student=StudentModelConfig(embedding_dim=8))
    model = build_model("student", schema, cfg, device="meta", dense_device="meta")
    st = S.compute(tiny_data, S.table_specs(model), batch_size=256, recd=True, batches=4)
    topo = topology(2)
    p = planner.plan(S.loads(model, st), topo, cost_model(topo))
    path = tmp_path / "plan.json"
    write_file({"student": p}, path, calibration={"source": "tests"}, stats="s", stage="t")
    assert read_file(path)[0] == topo
    with pytest.raises(ConfigError, match="the plan is for 2 ranks; this run has 1"):
        training_plan(path, "student", kind="student", model_cfg=cfg, data=tiny_data,
                      device="cpu")
    monkeypatch.setenv("WORLD_SIZE", "2")
    sp = training_plan(path, "student", kind="student", model_cfg=cfg, data=tiny_data,
                       device="cpu")
    placed = {n: ps.ranks for m in sp.plan.values() for n, ps in m.items()}
    assert placed == {n: [s.rank for s in q.shards] for n, q in p.placements.items()}
    assert set(sp.plan) == {"embeddings.user_ebc", "embeddings.item_ebc"}
    with pytest.raises(ConfigError, match=r"no plan for teacher \(it has \['student'\]\)"):
        training_plan(path, "teacher", kind="student", model_cfg=cfg, data=tiny_data,
                      device="cpu")
    wide = ModelConfig(student=StudentModelConfig(embedding_dim=16))
    with pytest.raises(ConfigError, match="plan again for this model"):
        training_plan(path, "student", kind="student", model_cfg=wide, data=tiny_data,
                      device="cpu")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ConfigError, match="bad.json: not a sharding plan"):
        training_plan(tmp_path / "bad.json", "student", kind="student", model_cfg=cfg,
                      data=tiny_data, device="cpu")


def test_a_gpu_plan_with_row_wise_tables_is_refused_on_cpu(tiny_data, tmp_path, monkeypatch):
    topo = topology(2, device="cuda")
    t = TableLoad(name="t_ad_id", module="embeddings.item_ebc", rows=300, dim=8,
                  features=("ad_id",), ids=1, unique_ids=1, pooled_rows=1)
    p = Plan(topo, {"t_ad_id": Placement(t, ROW_WISE, [Shard(0, 0, 150, 0, 8),
                                                       Shard(1, 150, 150, 0, 8)])})
    p.rescore(cost_model(topo))
    path = tmp_path / "plan.json"
    write_file({"student": p}, path, calibration={}, stats="", stage="t")
    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = ModelConfig(student=StudentModelConfig(embedding_dim=8))
    with pytest.raises(ConfigError, match=r"\['t_ad_id'\] are sharded in ways torchrec "
                                          r"cannot run on cpu ranks"):
        training_plan(path, "student", kind="student", model_cfg=cfg, data=tiny_data,
                      device="cpu")
