"""Stage shard_plan: the plans and the statistics beside the data; `lrm shard-plan` on the
command line; a topology that cannot hold the tables exits 2; train reads the plan."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from flows.cli import app as lrm_app
from lrm.sharding.cost import CALIBRATIONS
from stages import shard_plan, train
from stagekit import execute, load_params
from tests.sharding.test_planner import assert_complete

KEYS = {"teacher", "student", "students.small", "students.tiny"}


def _params(**over):
    base = {"train.batch_size": 256, "sharding.stats_batches": 4,
            "sharding.topology.world_size": 2, "sharding.time_limit": 1.0}
    return load_params([], {**base, **over})


def test_plans_every_model_and_writes_the_statistics_beside_the_data(tiny_data, tmp_path,
                                                                     capsys):
    from lrm.sharding.plan import Plan, read_file
    from lrm.sharding.stats import Stats

    out = tmp_path / "plans" / "sharding.json"
    m = execute(shard_plan.STAGE, {"data": tiny_data, "calibration": CALIBRATIONS,
                                   "out": out, "metrics": tmp_path / "m.json"},
                _params()).metrics()
    stats = tiny_data.parent / "sessions.stats.json"  # the derived default: beside the data
    st = Stats.read(stats)
    assert st.batch_size == 256 and st.batches == 4 and st.recd
    topo, models = read_file(out)
    assert set(models) == KEYS and topo.world_size == 2 and topo.device == "cpu"
    doc = json.loads(out.read_text())
    assert doc["stats"] == str(stats) and doc["calibration"]["source"].startswith("measured")
    for key in KEYS:
        p = Plan.from_json(models[key], topo)
        assert_complete(p, [q.table for q in p.placements.values()], topo.memory_bytes)
        assert {q.table.dim for q in p.placements.values()} == \
            {{"teacher": 32, "students.tiny": 8}.get(key, 16)}
        assert m["models"][key]["imbalance"] == pytest.approx(p.imbalance, rel=1e-4)
        assert m["models"][key]["max_ms"] <= m["models"][key]["greedy_max_ms"] + 1e-9
    user = Plan.from_json(models["student"], topo).placements["t_user_id"].table
    assert not user.uniform_batch and user.pooled_rows < 256  # sessions, not impressions
    printed = capsys.readouterr().out
    assert "students.tiny: max" in printed and "t_user_id" in printed


def test_the_cli_takes_world_size_and_exits_2_when_memory_is_missing(tiny_data, tmp_path,
                                                                     monkeypatch):
    monkeypatch.chdir(tmp_path)  # no params.yaml: the built-in defaults
    out = tmp_path / "p.json"
    base = ["shard-plan", "--data", str(tiny_data), "--calibration", str(CALIBRATIONS),
            "--out", str(out), "--stats", str(tmp_path / "s.json"), "--stats-batches", "2",
            "--train.batch_size", "256"]
    r = CliRunner().invoke(lrm_app, [*base, "--world-size", "2", "--host-gb", "0.00002"])
    assert r.exit_code == 2, r.output
    err = r.stderr.strip().splitlines()[-1]
    assert err.startswith("error: teacher: the topology cannot hold the tables: "), err
    assert "rank" in err and "column_wise shard" in err and "GiB missing" in err
    assert not out.exists()  # nothing half-written
    r = CliRunner().invoke(lrm_app, [*base, "--world-size", "3", "--planner", "greedy"])
    assert r.exit_code == 0, r.output + r.stderr
    assert json.loads(out.read_text())["topology"]["world_size"] == 3
    assert json.loads(out.read_text())["planner"] == "greedy"


@pytest.mark.slow
def test_train_runs_with_the_plan_and_refuses_a_plan_for_other_ranks(tiny_data, tmp_path):
    from lrm.errors import ConfigError

    plans = tmp_path / "plan1.json"
    execute(shard_plan.STAGE, {"data": tiny_data, "calibration": CALIBRATIONS, "out": plans,
                               "stats": tmp_path / "s1.json", "metrics": tmp_path / "m1.json"},
            _params(**{"sharding.topology.world_size": 1, "model.student.embedding_dim": 8}))
    over = {"train.steps": 2, "train.batch_size": 256, "train.threads": 1,
            "loader.prefetch": 0, "model.student.embedding_dim": 8}
    m = execute(train.STAGE, {"kind": "student", "data": tiny_data, "plan": plans,
                              "out": tmp_path / "model", "checkpoints": tmp_path / "ck",
                              "metrics": tmp_path / "t.json", "plot": None},
                load_params([], over))
    assert m.metrics()["steps"] == 2
    two = tmp_path / "plan2.json"
    execute(shard_plan.STAGE, {"data": tiny_data, "calibration": CALIBRATIONS, "out": two,
                               "stats": tmp_path / "s2.json", "metrics": tmp_path / "m2.json"},
            _params(**{"model.student.embedding_dim": 8}))
    with pytest.raises(ConfigError, match="the plan is for 2 ranks; this run has 1"):
        execute(train.STAGE, {"kind": "student", "data": tiny_data, "plan": two,
                              "out": tmp_path / "model2", "checkpoints": tmp_path / "ck2",
                              "metrics": tmp_path / "t2.json", "plot": None}, load_params([], over))


def test_the_shipped_calibration_is_found_from_any_folder_and_another_cpus_is_said(
        tiny_data, tmp_path, monkeypatch):
    """The issue-45 probe: `lrm shard-plan` run from any folder but the checkout failed ("no
    cost-model calibration for cpu": looked up relative to the working folder). The shipped
    one is found through the package; one measured on another CPU model says so in the plan
    and how to calibrate this one. Red with the default path relative again, or the note
    dropped."""
    monkeypatch.chdir(tmp_path)  # a user's own project folder: no lrm/ in it
    args = {"data": tiny_data, "out": tmp_path / "plans.json", "stats": tmp_path / "s.json"}
    execute(shard_plan.STAGE, args, _params())
    shipped = json.loads((tmp_path / "plans.json").read_text())["calibration"]
    assert shipped["source"] == json.loads((CALIBRATIONS / "cpu.json").read_text())["source"]
    other = tmp_path / "cal"
    other.mkdir()
    doc = json.loads((CALIBRATIONS / "cpu.json").read_text())
    doc["source"] = "measured: Some Other CPU 9000, 2 cores, 1 thread, torch 2.13.0+cpu"
    (other / "cpu.json").write_text(json.dumps(doc))
    m = execute(shard_plan.STAGE, {**args, "calibration": other}, _params())
    note = json.loads((tmp_path / "plans.json").read_text())["calibration"]["note"]
    assert note.startswith("the cost model's cpu calibration was measured on Some Other CPU "
                           "9000, not this CPU") and m.metrics()["calibration_note"] == note
    assert "python -m lrm.sharding.calibrate --out calibration/cpu.json" in note
