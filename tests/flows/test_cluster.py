"""Ingest (Criteo and any click log) and dedup on a Dask cluster of worker processes, through
the flows' own stage tasks and prefect-dask's DaskTaskRunner: what a user runs with
`python -m flows.pipeline --cluster local:N` or a Dask scheduler's address.

The cluster (distributed.LocalCluster, two one-thread worker processes on 127.0.0.1, the
arguments flows.cluster gives it) is started in another folder than the flow's, as a
cluster's workers are: the stages' relative paths must still mean the flow's folders. Its
output is byte for byte what one process writes running the same stages in turn. A worker
killed in the middle of writing a day (SIGKILL from inside the unit, after its file is written
and before it is renamed into place) loses nothing: the run completes (Dask reruns the unit on
a live worker) with the same bytes, or fails naming the day, and a rerun completes.

Planted bugs that turn this red (each tried): the unit task not run in the flow's folder (the
workers read `data/...` in their own: "No such file"); the units submitted to no task runner
(run in the flow's process: no unit on a worker); Criteo's line offsets computed only where
the units run in the flow's process (each worker's files numbered from 0: not one process's
rows); dedup's day not cleared before it is written again (the killed try's temporary file
left in the day's folder).
"""

from __future__ import annotations

import os
import signal
from contextlib import chdir
from pathlib import Path

import pytest
import yaml
from prefect import flow
from prefect.testing.utilities import prefect_test_harness

from flows import cluster as fcluster
from flows.tasks import node, stage_task
from stagekit import execute, load_params
from tests.conftest import HARNESS_STARTUP_S
from tests.data._logs import T0, frame, write
from tests.data.test_criteo import random_lines
from tests.data.test_criteo import write as write_tsv

pytestmark = pytest.mark.slow
distributed = pytest.importorskip(
    "distributed", reason=f"the cluster extra is not installed ({fcluster.EXTRA}; `make test` "
                          "installs it with the dev extra)")
from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin  # noqa: E402
STAGES = [("lrm-logs", "ingest"), ("lrm-logs", "dedup"),
          ("lrm-criteo", "ingest"), ("lrm-criteo", "dedup")]
MARKERS = (".lrm-output.json", ".lrm-written.json")  # name the time they were written


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory):
    if not fcluster.available():
        pytest.skip(f"prefect-dask is not installed ({fcluster.EXTRA}; `make test` installs "
                    "it with the dev extra)")
    from distributed import Client, LocalCluster

    elsewhere = tmp_path_factory.mktemp("workers-start-here")
    with chdir(elsewhere), LocalCluster(**fcluster.local_cluster(2)) as c, Client(c) as client:
        yield c, client


@pytest.fixture(scope="module")
def harness():
    with prefect_test_harness(server_startup_timeout=HARNESS_STARTUP_S):
        yield


class Ran(SchedulerPlugin):
    """A scheduler plugin (the scheduler runs in this process): which worker ran each task."""

    name = "lrm-test-ran"

    def __init__(self) -> None:
        self.workers: dict[str, str] = {}

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        if finish == "memory" and kwargs.get("worker"):
            self.workers[str(key)] = kwargs["worker"]


class KillWhileWriting(WorkerPlugin):
    """A worker plugin: the worker process that is about to rename a written file of
    `day=DAY` of the sessions into place kills itself (SIGKILL), once (`once`: a file)."""

    name = "lrm-test-kill"

    def __init__(self, day: int, once: str) -> None:
        self.day, self.once = day, once

    def setup(self, worker) -> None:
        import lrm.io

        real = lrm.io.os.replace
        day, once = f"day={self.day}", self.once

        class Os:  # lrm.io's `os`, but for its replace
            def __getattr__(self, name):
                return getattr(os, name)

            @staticmethod
            def replace(src, dst):
                if "sessions" in str(dst) and day in str(dst) and str(dst).endswith(".parquet"):
                    try:
                        os.close(os.open(once, os.O_CREAT | os.O_EXCL))
                    except FileExistsError:
                        return real(src, dst)
                    os.kill(os.getpid(), signal.SIGKILL)
                return real(src, dst)

        lrm.io.os = Os()


def _inputs(folder: Path) -> Path:
    """A click log of three days in two files, two Criteo TSV files (a day each), params."""
    rows = [{"user": f"u{i % 7}", "ts": T0 + 2800 * i, "item": f"i{i % 11}",
             "clicked": i % 3 == 0} for i in range(90)]
    (folder / "data/logs/in").mkdir(parents=True)
    write(frame(rows[:50]), folder / "data/logs/in/a.csv")
    write(frame(rows[50:]), folder / "data/logs/in/b.parquet")
    (folder / "data/criteo/tsv").mkdir(parents=True)
    write_tsv(folder / "data/criteo/tsv/day0.tsv", random_lines(40, seed=1))
    write_tsv(folder / "data/criteo/tsv/day1.tsv", random_lines(30, seed=2))
    params = folder / "params.yaml"
    params.write_text(yaml.safe_dump({"ingest": {"logs": {
        "label": "clicked", "user": "user", "item": "item", "time": "ts",
        "session_gap": "30m"}}}))
    return params


def _outputs(folder: Path) -> dict[str, bytes]:
    """Every file the stages wrote (markers aside: they hold the time), by path."""
    out = {}
    for kind in ("logs", "criteo"):
        for sub in ("raw", "sessions"):
            for f in sorted((folder / "data" / kind / sub).rglob("*")):
                if f.is_file() and f.name not in MARKERS:
                    out[str(f.relative_to(folder))] = f.read_bytes()
    return out


def _sequential(folder: Path) -> dict[str, bytes]:
    """The same stages in one process, one unit after another (no flow)."""
    params = _inputs(folder)
    with chdir(folder):
        for pipe, name in STAGES:
            n = node(pipe, name)
            execute(n.stage, n.args, load_params([params]))
    return _outputs(folder)


def _on_cluster(folder: Path, address: str):
    params = folder / "params.yaml" if folder.exists() else _inputs(folder)
    from prefect_dask import DaskTaskRunner

    @flow(task_runner=DaskTaskRunner(address=address))
    def data_stages(params: list[str]) -> dict:
        return {f"{p} {n}": stage_task(p, n, f"{p} {n}", params) for p, n in STAGES}

    with chdir(folder):
        return data_stages([params.name], return_state=True)


def test_units_run_on_the_workers_and_write_what_one_process_writes(dask_cluster, harness,
                                                                    tmp_path):
    c, client = dask_cluster
    want = _sequential(tmp_path / "one-process")
    ran = Ran()
    c.scheduler.add_plugin(ran, name=Ran.name)
    try:
        state = _on_cluster(tmp_path / "cluster", c.scheduler_address)
    finally:
        c.scheduler.remove_plugin(name=Ran.name)
    assert state.is_completed(), state.message
    # every unit ran on a worker: 2 + 3 + 3 (logs: files, days, dedup days), 1 + 2 + 2
    # (criteo: the first file's lines, the files, dedup days)
    units = [k for k in ran.workers if k.startswith("unit_task")]
    assert len(units) == 13, sorted(ran.workers)
    assert set(ran.workers.values()) <= set(c.scheduler.workers), ran.workers
    got = _outputs(tmp_path / "cluster")
    assert sorted(got) == sorted(want)
    assert [p for p in want if got[p] != want[p]] == []


def test_a_worker_killed_while_writing_a_day_loses_nothing(dask_cluster, harness, tmp_path):
    c, client = dask_cluster
    want = _sequential(tmp_path / "one-process")
    once = tmp_path / "killed-once"
    client.register_plugin(KillWhileWriting(1, str(once)))
    try:
        state = _on_cluster(tmp_path / "cluster", c.scheduler_address)
    finally:
        client.unregister_worker_plugin(KillWhileWriting.name)
    assert once.exists(), "no worker was killed"
    if not state.is_completed():  # the other way to lose nothing: fail naming it, rerun
        assert "dedup day 1" in state.message, state.message
        state = _on_cluster(tmp_path / "cluster", c.scheduler_address)
        assert state.is_completed(), state.message
    got = _outputs(tmp_path / "cluster")
    assert sorted(got) == sorted(want)
    assert [p for p in want if got[p] != want[p]] == []
