"""Stage `generate`: the CLI writes partitions and metrics; a bad value exits 2, writes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import yaml

from lrm import io
from lrm.config import GenerateConfig
from lrm.data.schema import day_files, read_schema
from stages import generate
from tests.conftest import new_store

PARAMS = {"generate": {"users": 1_000, "ads": 300, "max_history": 20, "seed": 7}}


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (cwd / "params.yaml").write_text(yaml.safe_dump(PARAMS))
    return subprocess.run(
        [sys.executable, "-m", "stages.generate", "--params", "params.yaml", *args],
        cwd=cwd, capture_output=True, text=True, timeout=120,
    )


def test_cli_writes_day_partitions_and_metrics(tmp_path: Path) -> None:
    proc = cli(tmp_path, "--out", "raw", "--days", "2", "--sessions-per-day", "200",
               "--metrics", "m/generate.json")
    assert proc.returncode == 0, proc.stderr
    files = day_files(tmp_path / "raw")
    assert sorted(files) == [0, 1]
    sch, layout = read_schema(tmp_path / "raw")
    assert (sch.name, layout, sch.vocab["user_id"], sch.vocab["user_history"]) == (
        "synthetic", "impressions", 2_000, 600)  # 1,000 users, 300 ads: two id slots each
    metrics = json.loads((tmp_path / "m/generate.json").read_text())
    rows = sum(pq.read_metadata(p).num_rows for f in files.values() for p in f)
    assert metrics["rows"] == rows and metrics["days"] == 2 and metrics["sessions"] == 400
    assert metrics["bytes"] > 0 and 0 < metrics["ctr"] < 0.2
    assert not list(tmp_path.glob(".raw.tmp-*"))


def test_run_replaces_its_own_earlier_output_whole(tmp_path: Path) -> None:
    out = tmp_path / "raw"
    with io.atomic_dir(out, stage="generate") as tmp:  # an earlier run's output
        (tmp / "day=9").mkdir()
        (tmp / "day=9" / "part-00000.parquet").write_text("stale")
    cfg = GenerateConfig(users=500, ads=100, days=1, sessions_per_day=50, max_history=10)
    metrics = generate.run(cfg=cfg, out=out).metrics()
    assert sorted(day_files(out)) == [0]  # the stale day is gone
    assert metrics["rows"] == pq.read_metadata(day_files(out)[0][0]).num_rows


def test_bad_value_exits_2_naming_the_key_and_writes_nothing(tmp_path: Path) -> None:
    proc = cli(tmp_path, "--out", "raw", "--days", "0", "--metrics", "m.json")
    assert proc.returncode == 2
    assert "generate.days" in proc.stderr
    assert not (tmp_path / "raw").exists() and not (tmp_path / "m.json").exists()
    PARAMS["generate"]["bogus"] = 1
    try:
        proc = cli(tmp_path, "--out", "raw")
    finally:
        del PARAMS["generate"]["bogus"]
    assert proc.returncode == 2 and "bogus" in proc.stderr
    assert not (tmp_path / "raw").exists()


def test_out_that_lrm_did_not_write_is_never_replaced(tmp_path: Path) -> None:
    """A user's folder, or a plain file, at --out: exit 2, one line, nothing touched."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    (tmp_path / "afile").write_text("keep me too")
    for out in ("mine", "afile"):
        proc = cli(tmp_path, "--out", out, "--days", "1", "--sessions-per-day", "20")
        assert proc.returncode == 2, proc.stderr
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("error:") and out in last and "--force" in last
        assert "Traceback" not in proc.stderr
    assert (mine / "notes.txt").read_text() == "keep me"
    assert (tmp_path / "afile").read_text() == "keep me too"
    assert not list(tmp_path.glob(".*.tmp-*"))
    # --force is the way to say "replace it"
    proc = cli(tmp_path, "--out", "mine", "--days", "1", "--sessions-per-day", "20", "--force")
    assert proc.returncode == 0, proc.stderr
    assert sorted(day_files(mine)) == [0] and not (mine / "notes.txt").exists()


def test_a_missing_params_file_or_unknown_section_exits_2(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "stages.generate", "--params", "nope.yaml",
                           "--out", "raw"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "nope.yaml" in proc.stderr.splitlines()[-1]
    (tmp_path / "p.yaml").write_text("generate: {days: 1}\ngenerat: {days: 2}\n")
    proc = subprocess.run([sys.executable, "-m", "stages.generate", "--params", "p.yaml",
                           "--out", "raw"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "generat" in last and "p.yaml" in last
    assert "known sections" in last and "'generate'" in last
    assert not (tmp_path / "raw").exists()


def test_runs_by_hand_keep_their_metrics_beside_their_output(tmp_path: Path) -> None:
    """Outside the DAG (another --out than the stage's default), a run writes its metrics
    beside its output, never into the folder it is started from: two runs from one folder
    do not block each other on ./metrics/generate.json, and each may run again."""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(PARAMS))
    data = tmp_path / "data"
    store = new_store(tmp_path)  # made before: two first uses would race

    def start(name: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "stages.generate", "--out", str(data / name), "--days", "1",
             "--sessions-per-day", "100"], cwd=tmp_path, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "MLFLOW_TRACKING_URI": store})

    for _ in range(2):  # the second time over the first's outputs: rc 0 again
        runs = [start("a"), start("b")]
        for p in runs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
    assert not (tmp_path / "metrics").exists()
    for name in ("a", "b"):
        m = json.loads((data / f"{name}.generate.json").read_text())
        assert m["days"] == 1 and m["sessions"] == 100
        assert io.owned_by_lrm(data / f"{name}.generate.json") == "generate"
