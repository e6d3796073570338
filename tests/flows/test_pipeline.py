"""The pipeline flow (`make run`): the DAG's nodes as Prefect tasks (a stage run again to its
own outputs: tests/stages), one MLflow parent run with the params and the headline over every
stage's run, the run recorded for DVC (`dvc repro` after it has nothing to do; the clone has
nothing else new), and a failed stage's one-line reason as the flow run's state message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import yaml
from prefect.testing.utilities import prefect_test_harness

from flows import dag
from flows.pipeline import pipeline, report
from tests.conftest import HARNESS_STARTUP_S
from tests.flows.test_dvc_repro import fresh_clone, tiny_params

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def harness():
    with prefect_test_harness(server_startup_timeout=HARNESS_STARTUP_S):
        yield


def test_the_flow_runs_every_node_as_a_named_task_and_leaves_the_clone_clean(
        harness, tmp_path, monkeypatch):
    repo = fresh_clone(tmp_path)
    tiny_params(repo)
    monkeypatch.chdir(repo)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    state = pipeline(return_state=True)
    assert state.is_completed(), state.message
    out = state.result()
    assert list(out) == [n.name for n in dag.SYNTHETIC.nodes]
    assert out["train_student"]["kind"] == "student" and out["summary"]["exfm_small"]

    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async def names() -> list[str]:
        async with get_client() as client:
            runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
            return sorted(r.name for r in runs)

    import asyncio

    import time

    want = sorted(n.title for n in dag.SYNTHETIC.nodes)
    deadline = time.monotonic() + 60  # the server records task runs as their events arrive
    while True:
        got = asyncio.run(names())
        stages = sorted(n for n in got if " day " not in n)
        if stages == want or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert stages == want
    assert "train student" in got and "dedup day 0" in got  # dedup's days: tasks of their own
    assert "| day 3 | student |" in report()
    # one parent run: the params and the headline (NE, AUC per model), every stage under it
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list",
                              filter_string="tags.`lrm.pipeline` = 'lrm'")
    parents = sorted((r for r in runs if r.info.run_name == "pipeline_lrm"),
                     key=lambda r: r.info.start_time)
    assert len(parents) == 1  # one per pipeline run
    parent = parents[-1]
    assert parent.data.params["train.lr"] == str(yaml.safe_load(
        (repo / "params.yaml").read_text())["train"]["lr"])
    headline = json.loads((repo / "metrics/summary.json").read_text())
    for model, m in headline.items():
        for k, v in m.items():
            assert parent.data.metrics[f"{model}.{k}"] == pytest.approx(v, abs=5e-5), model
    stages = mlflow.search_runs(search_all_experiments=True, output_format="list",
                                filter_string=f"tags.`mlflow.parentRunId` = "
                                              f"'{parent.info.run_id}'")
    assert sorted(r.info.run_name for r in stages) == sorted(
        n.title.replace(" ", "_") for n in dag.SYNTHETIC.nodes)

    # recorded for DVC: `make repro` after `make run` has nothing to do
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    again = subprocess.run([sys.executable, "-m", "dvc", "repro"], cwd=repo, env=env,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "Running stage" not in again.stdout and "up to date" in again.stdout, again.stdout
    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True,
                            text=True, check=True).stdout
    # DVC's record of the run is the one new file (the user commits it); nothing else changed
    assert status == "?? dvc.lock\n", f"`make run` left files changed in the clone:\n{status}"


def test_a_failed_stage_fails_the_flow_with_its_one_line_reason(harness, tmp_path,
                                                                 monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text("generate: {days: 0}\n")
    state = pipeline(params=["bad.yaml"], return_state=True)
    assert state.is_failed()
    assert state.message == "bad.yaml: generate.days: must be >= 1"
    (tmp_path / "ok.yaml").write_text("generate: {days: 1, sessions_per_day: 10}\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "raw").mkdir()
    (tmp_path / "data" / "raw" / "mine.txt").write_text("a user's file")
    state = pipeline(params=["ok.yaml"], return_state=True)  # the stage itself refuses
    assert state.is_failed() and "\n" not in state.message
    assert state.message.startswith("data/raw: not written by lrm generate"), state.message
    assert (tmp_path / "data" / "raw" / "mine.txt").read_text() == "a user's file"
