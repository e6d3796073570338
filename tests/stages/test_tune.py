"""Stage `tune` through its command line: the params file it writes is what `lrm train
--params` trains with, every trial is an MLflow run nested under the tuning run, and a bad
search space or data path is exit 2 with one line and nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import mlflow
import pytest
import yaml

from tests.conftest import REPO, new_store

pytestmark = pytest.mark.slow

PARAMS = {
    "train": {"batch_size": 512, "fit_steps": 0, "log_every": 4, "lr": 0.04,
              "embedding_lr": 0.15, "threads": 1},
    "model": {"student": {"embedding_dim": 8, "bottom_mlp": [16], "top_mlp": [32, 16]}},
    "loader": {"prefetch": 2, "num_workers": 1},
    "checkpoint": {"every": 0},
    # a fast search: two rates and the dim, none of whose ranges holds the params' own
    # value, so every value in the file is the search's (none is the params' by chance)
    "tune": {"space": {"lr": [1e-3, 3e-2], "embedding_lr": [0.01, 0.1], "epochs": [],
                       "embedding_dim": [4, 12], "width": []}},
}


def _env(tmp_path):
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
            "MLFLOW_TRACKING_URI": new_store(tmp_path),
            "MLFLOW_EXPERIMENT_NAME": "test-tune"}


def _run(tmp_path, module, *args):
    params = tmp_path / "params.yaml"
    if not params.exists():
        params.write_text(yaml.safe_dump(PARAMS))
    return subprocess.run([sys.executable, "-m", module, *args], cwd=tmp_path,
                          env=_env(tmp_path), capture_output=True, text=True, timeout=600)


def test_tuned_params_file_trains_and_trials_are_child_runs(datasets, tmp_path):
    """Planted bugs that turn this red (each tried): a trial's params not logged on its run
    (lrm.tracking.child_run); the tuned dim left out of the params file."""
    data = str(datasets["sessions"])
    r = _run(tmp_path, "stages.tune", "--model", "student", "--data", data,
             "--out", "tuned.yaml", "--trials", "2")
    assert r.returncode == 0, r.stderr[-4000:]
    tuned = yaml.safe_load((tmp_path / "tuned.yaml").read_text())
    m = json.loads((tmp_path / "tuned.tune_student.json").read_text())  # beside --out
    assert m["trials"] == 2 and m["valid_days"] == [1] and m["eval_day"] == 2
    best = min(m["per_trial"], key=lambda t: t["ne"])
    assert m["best_trial"] == best["number"]
    assert tuned["train"] == {"lr": best["params"]["lr"],
                              "embedding_lr": best["params"]["embedding_lr"]}
    assert tuned["model"]["student"] == {"embedding_dim": best["params"]["embedding_dim"]}

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    runs = mlflow.search_runs(experiment_names=["test-tune"], output_format="list")
    parent = [x for x in runs if x.info.run_name == "tune_student"]
    assert len(parent) == 1
    trials = [x for x in runs if x.data.tags.get("mlflow.parentRunId") == parent[0].info.run_id]
    assert sorted(x.info.run_name for x in trials) == ["trial_0", "trial_1"]
    by_name = {x.info.run_name: x for x in trials}
    for t in m["per_trial"]:
        run = by_name[f"trial_{t['number']}"]
        assert run.data.metrics["valid_ne"] == pytest.approx(t["ne"])
        assert float(run.data.params["lr"]) == pytest.approx(t["params"]["lr"])

    # lrm train takes the file: the tuned dim and rates, over the params it was tuned on
    r = _run(tmp_path, "stages.train", "--model", "student", "--data", data, "--out", "m",
             "--params", "params.yaml", "--params", "tuned.yaml")
    assert r.returncode == 0, r.stderr[-4000:]
    card = json.loads((tmp_path / "m" / "model.json").read_text())
    assert card["model"]["student"]["embedding_dim"] == best["params"]["embedding_dim"]
    run = next(x for x in mlflow.search_runs(experiment_names=["test-tune"],
                                             output_format="list")
               if x.info.run_name == "train_student")
    assert float(run.data.params["train.lr"]) == pytest.approx(best["params"]["lr"])
    assert float(run.data.params["train.embedding_lr"]) == pytest.approx(
        best["params"]["embedding_lr"])


@pytest.mark.parametrize("args, says", [
    (["--tune.space.lr", "[0.1, 0.01]"], "tune.space.lr: needs"),
    (["--trials", "0"], "give a budget"),
])
def test_bad_search_space_is_exit_2_and_writes_nothing(datasets, tmp_path, args, says):
    r = _run(tmp_path, "stages.tune", "--model", "student", "--data",
             str(datasets["sessions"]), "--out", "tuned.yaml", *args)
    assert r.returncode == 2, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and says in lines[-1], lines[-3:]
    assert not (tmp_path / "tuned.yaml").exists()


def test_bad_data_path_is_exit_2_and_writes_nothing(tmp_path):
    r = _run(tmp_path, "stages.tune", "--model", "teacher", "--data", "nowhere",
             "--out", "tuned.yaml")
    assert r.returncode == 2, r.stderr[-3000:]
    assert "nowhere" in r.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "tuned.yaml").exists()


def test_a_pipeline_node_with_the_search_off_writes_a_file_that_changes_nothing(tmp_path):
    """The logs pipeline's tune nodes (--if-enabled) with tune.in_pipeline false: no search
    (the data is not even read), and the file they write, laid over the params, leaves every
    value as it was. Planted bug that turns this red (tried): --if-enabled ignored."""
    from lrm.config import ParamsConfig
    from stagekit import load_params
    from stages import tune

    p = ParamsConfig()
    out = tmp_path / "tune_student.yaml"
    result = tune.run(kind="student", train=p.train, teacher_train=p.teacher.train,
                      split=p.split, loader=p.loader, tables=p.model.tables,
                      model=p.model.student, cfg=p.tune, data=tmp_path / "nowhere", out=out,
                      if_enabled=True)
    assert result.metrics() == {"kind": "student", "searched": False}
    assert load_params([REPO / "params.yaml", out]) == load_params([REPO / "params.yaml"])
