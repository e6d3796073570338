"""SIGKILL a stream day (issue 29, point 4): a day killed after its teacher was retrained and
judged better, or anywhere else, moves no champion and writes no record; the run that then
completes the day closes the killed attempts' MLflow runs as KILLED and only then moves
each champion, once, from the day before's to the day's model.

Day 1 (T = 1: day 0 is the first teacher's) runs whole and sets the champions; day 2 (a new
teacher every day, every model of the day planted to win: tests/faults/_stream_day.py) is
killed 3 times (kill_loop): the first once the teacher is judged better (aimed at the
day's student models folder, which appears then), the second anywhere, the last once the
student is judged better too and its register stage is over (the day writing its report,
slowed for the aim). Then it runs to its end. About a minute: each attempt is forked from
the suite's forkserver and uses the test's one Prefect server.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from collections.abc import Callable

import pytest
from mlflow import MlflowClient
from mlflow.entities import Run
from prefect.settings import PREFECT_API_URL
from prefect.testing.utilities import prefect_test_harness

from lrm import registry, tracking
from tests.conftest import HARNESS_STARTUP_S, new_store
from tests.faults.kills import forkserver, kill_loop
from tests.flows.test_streaming import STUDENT, TEACHER, _write_params

pytestmark = pytest.mark.slow

DAY, KILLS, SEED = 2, 3, 5
MODELS = (TEACHER, STUDENT)


@pytest.fixture(scope="module")
def harness():
    with prefect_test_harness(server_startup_timeout=HARNESS_STARTUP_S):
        yield


def _champions() -> dict[str, str | None]:
    return {name: registry.alias_version(name, registry.CHAMPION) for name in MODELS}


def _judged_better(name: str, champion: str | None) -> bool:
    """Whether a version of `name` other than its champion is tagged promoted (judged, and
    waiting for its day to end)."""
    versions = registry.client().search_model_versions(f"name = '{name}'")
    return any(str(v.version) != champion and v.tags.get("lrm.decision") == "promoted"
               for v in versions)


def _runs() -> list[Run]:
    """Every MLflow run of the store, as a user listing them would see them."""
    c = MlflowClient()
    return c.search_runs([e.experiment_id for e in c.search_experiments()], max_results=1000)


def _wait(until: Callable[[], bool], p: mp.process.BaseProcess, timeout: float = 120) -> None:
    """Poll `until` while the day runs (a day that ends first fails kill_loop's check)."""
    deadline = time.monotonic() + timeout
    while p.is_alive() and time.monotonic() < deadline and not until():
        time.sleep(0.05)


def _finish(p: mp.process.BaseProcess, what: str) -> None:
    p.join(timeout=300)
    if p.exitcode is None:
        p.kill()
        p.join()
    assert p.exitcode == 0, f"{what}: exit {p.exitcode}"


def test_a_killed_stream_day_moves_no_champion_and_its_runs_end_killed(harness, tmp_path,
                                                                       monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # CPU runs (see test_kills.py)
    uri = new_store(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    ctx = forkserver()
    from tests.faults import _stream_day

    stream = tmp_path / "stream"
    record = stream / "days" / f"day={DAY}.json"
    params = _write_params(tmp_path, exfm={"teacher_every": 1})  # a new teacher every day
    spec = {"root": str(tmp_path), "params": str(params), "mlflow": uri,
            "prefect_api": PREFECT_API_URL.value(), "tmp": str(tmp_path)}
    started: list[mp.process.BaseProcess] = []

    def start(report_s: float = 10.0) -> mp.process.BaseProcess:
        """An attempt at the next day (one to be killed: its report takes 10 s longer, the
        window of the last kill: only that attempt gets there, killed at once when `before`
        sees its register run end; 2 s was missed once with the machine at load 14-17,
        `_runs()` slower than the window, and the day's promotions were made)."""
        p = ctx.Process(target=_stream_day.run, args=({**spec, "report_s": report_s},),
                        daemon=True)
        p.start()
        started.append(p)
        return p

    _finish(start(report_s=0), "day 1")
    champions = _champions()
    assert champions == {TEACHER: "1", STUDENT: "1"}

    left_running: set[str] = set()  # the killed attempts' runs: closed by a later start
    pending: list[set[str]] = []  # after each kill: the models judged better, not promoted

    def before(i: int) -> None:
        if i == KILLS - 1:  # the last kill: the student's register stage over, the day's
            pid = str(started[-1].pid)  # report being written (report_s)
            _wait(lambda: any(r.info.run_name == "register_small"
                              and r.info.status == "FINISHED"
                              and r.data.tags.get(tracking.PID_TAG) == pid for r in _runs()),
                  started[-1])

    def check(i: int) -> None:
        assert _champions() == champions, f"kill {i}: a champion moved before the day ended"
        assert not record.exists(), f"kill {i}: the killed day's record was written"
        pid = str(started[-1].pid)
        left_running.update(r.info.run_id for r in _runs() if r.info.status == "RUNNING"
                            and r.data.tags.get(tracking.PID_TAG) == pid)
        pending.append({n for n in MODELS if _judged_better(n, champions[n])})

    # the first kill aims at the students' folder; the last is aimed by `before` (an attempt
    # after kills writes no new entry there: its finished steps stay, and it would run out)
    stats = kill_loop(start, kills=KILLS, seed=SEED, before=before, check=check,
                      writes_in=stream / "models" / "students" / f"day={DAY}",
                      aim_at=lambda i: i == 0)
    assert stats["aimed"] >= 1 and pending[0] == {TEACHER}, (stats, pending)
    assert pending[-1] == set(MODELS), pending  # both promotions were waiting
    assert left_running  # a killed day's runs, RUNNING until the next start

    _finish(start(report_s=0), f"day {DAY} after {KILLS} kills")
    day = json.loads(record.read_text())
    assert day["day"] == DAY
    runs = {r.info.run_id: r for r in _runs()}
    # what the MLflow UI shows: the killed attempts' runs KILLED, none left RUNNING
    assert {runs[i].info.status for i in left_running} == {"KILLED"}
    assert not [r.info.run_name for r in runs.values() if r.info.status == "RUNNING"]
    days = [r.info.status for r in runs.values() if r.info.run_name == f"stream_day_{DAY}"]
    assert sorted(days) == ["FINISHED"] + ["KILLED"] * (len(days) - 1), days
    # each champion moved once, when the day completed: from the day before's to the day's
    decisions = {TEACHER: day["teacher"]["decision"],
                 STUDENT: day["students"]["small"]["decision"]}
    after = _champions()
    for name, d in decisions.items():
        assert d["promoted"] and d["champion_version"] == champions[name], (name, d)
        assert after[name] == d["version"] != champions[name], (name, after, d)
        versions = registry.client().search_model_versions(f"name = '{name}'")
        assert sorted(str(v.version) for v in versions) == ["1", "2"]  # one a day, kills or not
    print(f"{stats['kills']} kills ({stats['aimed']} aimed; pending after each: {pending}), "
          f"{len(left_running)} runs closed as KILLED")
