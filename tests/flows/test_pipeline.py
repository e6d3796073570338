"""The pipeline flow (`make run`): the DAG's nodes as Prefect tasks, a clean clone after it,
and a failed stage's one-line reason as the flow run's state message."""

from __future__ import annotations

import subprocess

import pytest
from prefect.testing.utilities import prefect_test_harness

from flows import dag
from flows.pipeline import pipeline, report
from tests.flows.test_dvc_repro import fresh_clone, tiny_params

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def harness():
    with prefect_test_harness():
        yield


def test_the_flow_runs_every_node_as_a_named_task_and_leaves_the_clone_clean(
        harness, tmp_path, monkeypatch):
    repo = fresh_clone(tmp_path)
    tiny_params(repo)
    monkeypatch.chdir(repo)
    state = pipeline(return_state=True)
    assert state.is_completed(), state.message
    out = state.result()
    assert list(out) == [n.name for n in dag.SYNTHETIC.nodes]
    assert out["train_student"]["kind"] == "student" and out["summary"]["exfm_day2"]

    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async def names() -> list[str]:
        async with get_client() as client:
            runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
            return sorted(r.name for r in runs)

    import asyncio

    got = asyncio.run(names())
    assert sorted(n for n in got if " day " not in n) == sorted(
        n.title for n in dag.SYNTHETIC.nodes)
    assert "train student" in got and "dedup day 0" in got  # dedup's days: tasks of their own
    assert "| baseline_day2 | student |" in report()
    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True,
                            text=True, check=True).stdout
    assert status == "", f"`make run` left files changed in the clone:\n{status}"


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
