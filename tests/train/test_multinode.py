"""Training on two hosts, as a user starts it: `python -m lrm.launch --nnodes 2
--nproc-per-node 1 --rdzv-endpoint 127.0.0.1:PORT -m stages.train ... --plan PLAN` twice
(torch's elastic agent, c10d rendezvous, gloo), the student on the shard plan for 2 ranks.

* The run writes checkpoints from both ranks (each rank's rows and manifest part), and while
  it runs nothing of either node listens beyond the address given (the store on
  127.0.0.1:PORT, gloo on the loopback).
* Stopped at step 10 (a 2-host run of 10 steps), it resumes on one host and one rank and
  reaches step 20 with the held-out NE of the uninterrupted 2-host run (within 1e-3: float
  reassociation across 1 and 2 ranks moves NE by ~1e-5; a resume that lost the tables'
  rows or the dense weights is ~1e-2 away, see the planted bugs).
* A node killed (SIGKILL of its launcher and its rank: a host lost) makes the other exit
  non-zero within the bound (--node-timeout plus its stop), naming the lost node's pid.

Planted bugs that turn this red (each tried): the store handed no bound socket (it listens on
every interface); the lost-node watch off (the survivor exits on the closed connection
without naming the lost node); the resume restoring no embedding rows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from flows.dag import STAGES
from stagekit import execute, load_params
from tests.conftest import REPO, kill_tree
from tests.flows.test_deployments import _free_port

pytestmark = pytest.mark.slow
PARAMS = {"train": {"batch_size": 512, "steps": 20, "threads": 1, "log_every": 2,
                    "amp": False, "device": "cpu"},
          "checkpoint": {"every": 10},
          "loader": {"prefetch": 2, "num_workers": 1},
          "model": {"student": {"embedding_dim": 8, "bottom_mlp": [16], "top_mlp": [32, 16]}},
          "sharding": {"topology": {"world_size": 2}, "stats_batches": 4, "time_limit": 1.0}}
NE_TOL = 1e-3


@pytest.fixture(scope="module")
def setup(datasets, tmp_path_factory):
    """The params files (20 and 10 steps) and the 2-rank shard plan (`lrm shard-plan`)."""
    root = tmp_path_factory.mktemp("multinode")
    for name, steps in (("p20.yaml", 20), ("p10.yaml", 10), ("long.yaml", 100_000)):
        doc = json.loads(json.dumps(PARAMS))
        doc["train"]["steps"] = steps
        (root / name).write_text(yaml.safe_dump(doc))
    execute(STAGES["shard_plan"], {"data": datasets["sessions"], "out": root / "plan2.json",
                                   "stats": root / "stats.json",
                                   "calibration": REPO / "lrm/sharding/calibration",
                                   "metrics": None}, load_params([root / "p20.yaml"]))
    return root


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def _nodes(setup: Path, data: Path, tmp: Path, params: str, out: str, ck: str, port: int,
           timeout: float = 20) -> list[subprocess.Popen]:
    """Two launchers, one per 'host', each in a process group of its own."""
    cmd = [sys.executable, "-m", "lrm.launch", "--nnodes", "2", "--nproc-per-node", "1",
           "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", out,
           "--node-timeout", str(timeout), "-m", "stages.train", "--params",
           str(setup / params), "--model", "student", "--data", str(data),
           "--out", str(tmp / out), "--checkpoints", str(tmp / ck),
           "--plan", str(setup / "plan2.json"), "--metrics", str(tmp / f"{out}.json")]
    return [subprocess.Popen(cmd, env=_env(), cwd=tmp, stdout=open(tmp / f"{out}-{i}.log", "w"),
                             stderr=subprocess.STDOUT, start_new_session=True)
            for i in range(2)]


def _finish(nodes: list[subprocess.Popen], tmp: Path, out: str, timeout: float = 600) -> None:
    for i, p in enumerate(nodes):
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            for q in nodes:
                kill_tree(q.pid)
            raise
        assert p.returncode == 0, (tmp / f"{out}-{i}.log").read_text()[-4000:]


def _listeners(pids: list[int]) -> list[tuple[str, int]]:
    """Every listening TCP address of these processes and their children."""
    found = []
    for pid in pids:
        try:
            procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for p in procs:
            try:
                found += [(c.laddr.ip, c.laddr.port) for c in p.net_connections("tcp")
                          if c.status == psutil.CONN_LISTEN]
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
    return found


def _ne(path: Path) -> float:
    return json.loads(path.read_text())["eval"]["ne"]


def test_two_hosts_train_checkpoint_from_both_and_resume_on_one(setup, datasets, tmp_path):
    port = _free_port()
    nodes = _nodes(setup, datasets["sessions"], tmp_path, "p20.yaml", "full", "ck-full", port)
    seen: set[tuple[str, int]] = set()
    while any(p.poll() is None for p in nodes):  # sample the listeners while it runs
        seen.update(_listeners([p.pid for p in nodes]))
        time.sleep(0.5)
    _finish(nodes, tmp_path, "full")
    assert ("127.0.0.1", port) in seen, seen  # the store, where it was told
    assert {ip for ip, _ in seen} == {"127.0.0.1"}, seen  # and nothing beyond the loopback
    steps = sorted(p.name for p in (tmp_path / "ck-full").iterdir() if "step-" in p.name)
    assert [s.split("step-")[1] for s in steps] == ["10", "20"], steps
    for s in steps:  # both ranks wrote their part of each checkpoint
        names = {f.name for f in (tmp_path / "ck-full" / s).iterdir()}
        assert {"rows-0.pt", "rows-1.pt", "part-0.json", "part-1.json"} <= names, names
    full = json.loads((tmp_path / "full.json").read_text())
    assert full["world_size"] == 2 and full["steps"] == 20, full

    # stopped at step 10 on two hosts, resumed on one host, one rank
    nodes = _nodes(setup, datasets["sessions"], tmp_path, "p10.yaml", "half", "ck", _free_port())
    _finish(nodes, tmp_path, "half")
    r = subprocess.run([sys.executable, "-m", "stages.train", "--params",
                        str(setup / "p20.yaml"), "--model", "student", "--data",
                        str(datasets["sessions"]), "--out", str(tmp_path / "resumed"),
                        "--checkpoints", str(tmp_path / "ck"), "--resume", "--metrics",
                        str(tmp_path / "resumed.json")],
                       env=_env(), cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    resumed = json.loads((tmp_path / "resumed.json").read_text())
    assert resumed["world_size"] == 1 and resumed["resumed_from"] == 10, resumed
    assert abs(_ne(tmp_path / "resumed.json") - _ne(tmp_path / "full.json")) <= NE_TOL, \
        (_ne(tmp_path / "resumed.json"), _ne(tmp_path / "full.json"))


def test_a_lost_node_fails_the_other_in_bounded_time_naming_it(setup, datasets, tmp_path):
    port = _free_port()
    nodes = _nodes(setup, datasets["sessions"], tmp_path, "long.yaml", "long", "ck-long", port,
                   timeout=10)
    try:
        deadline = time.monotonic() + 300  # both ranks training: a checkpoint written
        while not any((tmp_path / "ck-long").glob("*step-*/rows-1.pt")):
            assert time.monotonic() < deadline and all(p.poll() is None for p in nodes), \
                (tmp_path / "long-0.log").read_text()[-3000:]
            time.sleep(0.5)
        host = next(p for p in nodes if ("127.0.0.1", port) in _listeners([p.pid]))
        lost = next(p for p in nodes if p is not host)
        kill_tree(lost.pid)  # the other node's host gone: its launcher and its rank
        t0 = time.monotonic()
        host.wait(120)
        took = time.monotonic() - t0
    finally:
        for p in nodes:
            kill_tree(p.pid)
    said = (tmp_path / f"long-{nodes.index(host)}.log").read_text()
    assert host.returncode not in (0, None), said[-3000:]
    assert f"pid {lost.pid}" in said and "lost node" in said, said[-3000:]
    print(f"the survivor exited {host.returncode} {took:.1f} s after the other was killed")
