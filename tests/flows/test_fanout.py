"""Days are independent units: in a flow, `ingest logs` reads each file and writes each day
as a task of its own, and `dedup` dedups each day as one, on the flow's task runner, with
the same output as one process that runs them in turn.

Planted bugs that turn this red (each tried): the stage task not handing its units to the
flow (no `fanout.using`), the days of ingest mapped as one unit.
"""

from __future__ import annotations

import asyncio
import time

import polars as pl
import pytest
import yaml
from prefect import flow, get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.testing.utilities import prefect_test_harness

from flows.tasks import stage_task
from lrm.data.schema import day_files
from tests.conftest import HARNESS_STARTUP_S
from tests.data._logs import T0, frame, write


@pytest.fixture(scope="module")
def harness():
    with prefect_test_harness(server_startup_timeout=HARNESS_STARTUP_S):
        yield


def _log(folder):
    rows = [{"user": f"u{i % 7}", "ts": T0 + 2800 * i, "item": f"i{i % 11}", "clicked": i % 3 == 0}
            for i in range(90)]  # three days
    folder.mkdir(parents=True)
    write(frame(rows[:50]), folder / "a.csv")
    write(frame(rows[50:]), folder / "b.parquet")


@flow(task_runner=ThreadPoolTaskRunner(max_workers=3))
def ingest_and_dedup(params: list[str]) -> dict:
    return {name: stage_task("lrm-logs", name, name, params) for name in ("ingest", "dedup")}


def _task_names(flow_run_id) -> list[str]:
    async def go() -> list[str]:
        async with get_client() as client:
            runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[flow_run_id])))
            return sorted(r.name for r in runs)
    return asyncio.run(go())


def test_each_file_and_each_day_is_a_task_and_the_output_is_the_same(harness, tmp_path,
                                                                     monkeypatch):
    monkeypatch.chdir(tmp_path)
    _log(tmp_path / "data" / "logs" / "in")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"ingest": {"logs": {
        "label": "clicked", "user": "user", "item": "item", "time": "ts",
        "session_gap": "30m"}}}))
    state = ingest_and_dedup(["params.yaml"], return_state=True)
    assert state.is_completed(), state.message
    out = state.result()
    assert out["ingest"]["days"] == 3 and out["dedup"]["days"] == 3
    want = sorted(["ingest", "dedup", "ingest file a.csv", "ingest file b.parquet",
                   *(f"{k} day {d}" for k in ("ingest", "dedup") for d in range(3))])
    deadline = time.monotonic() + 60  # the server records task runs as their events arrive
    while (names := _task_names(state.state_details.flow_run_id)) != want \
            and time.monotonic() < deadline:
        time.sleep(1)
    assert names == want
    # the same rows as one process running the units in turn
    from lrm.config import LogsConfig
    from lrm.data.logs.ingest import ingest

    ingest(sorted((tmp_path / "data/logs/in").iterdir()), tmp_path / "seq",
           LogsConfig(label="clicked", user="user", item="item", time="ts",
                      session_gap="30m"))
    for d, fs in day_files(tmp_path / "seq").items():
        assert pl.read_parquet(fs).equals(pl.read_parquet(day_files(
            tmp_path / "data/logs/raw")[d]))
