"""Stage `dedup` through its command line: happy path, params and metrics files, bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from lrm import io
from lrm.data import dedup, parquet
from lrm.data.schema import day_files, read_schema, synthetic_schema
from flows.cli import app
from tests.conftest import REPO
from tests.data.test_dedup import make_impressions, write_dataset


def _run(cwd, *args):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "stages.dedup", *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def raw(tmp_path):
    src = tmp_path / "raw"
    write_dataset(src, {0: make_impressions(30, seed=1), 1: make_impressions(30, seed=2, day=1)},
                  rows_per_file=40)
    return src


def _snapshot(path):
    return sorted((str(p.relative_to(path)), p.read_bytes()) for p in path.rglob("*")
                  if p.is_file())


def test_stage_writes_sessions_and_metrics(tmp_path, raw):
    params = tmp_path / "p.yaml"
    params.write_text("dedup:\n  rows_per_file: 7\n")
    r = _run(tmp_path, "--in", "raw", "--out", "out/sessions", "--params", params,
             "--metrics", tmp_path / "m" / "dedup.json")
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "m" / "dedup.json").read_text())
    assert m["sessions"] == 60 and m["rows"] > 60
    assert m["dedup_ratio"] == pytest.approx(m["rows"] / 60)
    out = tmp_path / "out" / "sessions"
    assert read_schema(out) == (synthetic_schema(), "sessions")
    files = day_files(out)
    assert [pq.read_metadata(f).num_rows for f in files[0]] == [7, 7, 7, 7, 2]
    flat = sum(dedup.flatten_sessions(parquet.read_table(f)).num_rows for fs in files.values()
               for f in fs)
    assert flat == m["rows"]
    assert m["bytes_out"] == sum(f.stat().st_size for fs in files.values() for f in fs)
    assert not (tmp_path / "metrics").exists()  # --metrics was honoured
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["sessions"]  # no temp left


def test_days_made_from_the_same_raw_files_are_kept(tmp_path, raw, monkeypatch):
    """Day by day: a day made from the same raw files is not made again, a changed day is,
    --days limits the run, and a raw day gone is a sessions day gone."""
    monkeypatch.chdir(tmp_path)

    def run(*more):
        r = CliRunner().invoke(app, ["dedup", "--in", "raw", "--out", "s", "--metrics", "m.json",
                                     *more])
        assert r.exit_code == 0, r.output
        return json.loads((tmp_path / "m.json").read_text())

    def inodes():
        return {str(f.relative_to(tmp_path / "s")): f.stat().st_ino
                for f in (tmp_path / "s").rglob("*.parquet")}

    assert run()["written"] == [0, 1]
    first = inodes()
    again = run()
    assert (again["written"], again["skipped"], again["rows"]) == ([], [0, 1], 0)
    assert inodes() == first  # not rewritten
    shutil.rmtree(raw / "day=1")
    write_dataset(raw, {1: make_impressions(12, seed=5, day=1)}, rows_per_file=40)
    assert run()["written"] == [1]  # day 1's raw files changed
    now = inodes()
    assert {k: v for k, v in now.items() if k.startswith("day=0")} == \
        {k: v for k, v in first.items() if k.startswith("day=0")}
    assert run("--days", "0")["skipped"] == [0]
    shutil.rmtree(raw / "day=1")
    assert run()["skipped"] == [0] and not (tmp_path / "s" / "day=1").exists()


def _bad_inputs(tmp_path, raw):
    (tmp_path / "empty").mkdir()
    dedup.dedup_dataset(raw, tmp_path / "sess", dedup.DedupConfig())
    return {
        "missing": ("nope", "does not exist"),
        "no partitions": ("empty", "no day=D"),
        "wrong layout": ("sess", "impressions layout"),
    }


def _earlier_output(out):
    """An output folder an earlier dedup run wrote (so only the input can be at fault)."""
    with io.atomic_dir(out, stage="dedup") as tmp:
        (tmp / "keep.txt").write_text("previous output")
    return _snapshot(out)


def test_stage_bad_input_exits_2_and_leaves_out_untouched(tmp_path, raw):
    (tmp_path / "none.yaml").write_text("{}\n")
    cases = _bad_inputs(tmp_path, raw)
    before = {name: _earlier_output(tmp_path / f"out-{i}") for i, name in enumerate(cases)}
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = {  # these fail before any work, so run them side by side (each its own out)
        name: (msg, subprocess.Popen(
            [sys.executable, "-m", "stages.dedup", "--in", src, "--out", f"out-{i}",
             "--params", str(tmp_path / "none.yaml"), "--metrics", f"m-{i}.json"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for i, (name, (src, msg)) in enumerate(cases.items())
    }
    for i, (name, (msg, p)) in enumerate(procs.items()):
        _, err = p.communicate(timeout=120)
        assert p.returncode == 2, (name, err)
        assert "error:" in err and msg in err and "Traceback" not in err, (name, err)
        assert _snapshot(tmp_path / f"out-{i}") == before[name]
        assert not (tmp_path / f"m-{i}.json").exists()


@pytest.mark.parametrize("stray", ["stray.parquet", "day=1/sub/x.parquet"])
def test_a_stray_parquet_file_is_named_not_ignored(tmp_path, raw, monkeypatch, stray):
    """The issue-45 probe: dedup read around `raw/stray.parquet` and `raw/day=1/sub/x.parquet`
    without a word (their rows silently not in the dataset). One line, exit 2, no output.
    In-process. Red with day_files' checks of either dropped."""
    (raw / stray).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(day_files(raw)[1][0], raw / stray)
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["dedup", "--in", "raw", "--out", "s", "--metrics", "m.json"])
    assert r.exit_code == 2, r.output
    assert f"error: raw/{stray}: a Parquet file " in r.stderr and "is not read" in r.stderr
    assert not (tmp_path / "s").exists()


def test_stage_non_constant_user_field_exits_2_and_leaves_out_untouched(tmp_path, monkeypatch):
    """Found while writing (after the MLflow run started): exit 2, nothing left behind.
    In-process through the same typer command, to spare a second interpreter start."""
    t = make_impressions(10, seed=3)
    rows = t.to_pylist()
    i = next(i for i in range(1, len(rows)) if rows[i]["session_id"] == rows[i - 1]["session_id"])
    rows[i]["user_id"] = 10**6  # a user field that changes inside a session
    write_dataset(tmp_path / "broken", {0: pa.Table.from_pylist(rows, schema=t.schema)},
                  rows_per_file=100)
    out = tmp_path / "out"
    before = _earlier_output(out)
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["dedup", "--in", "broken", "--out", "out",
                                 "--metrics", "m.json"])
    assert r.exit_code == 2, r.output
    assert f"field user_id: session {rows[i]['session_id']} " in r.stderr
    assert "part-00000.parquet" in r.stderr
    assert _snapshot(out) == before and not (tmp_path / "m.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "out"]


def test_lrm_front_door_has_the_stage():
    # wide enough that rich does not cut the option names (a bool param's two forms)
    r = CliRunner().invoke(app, ["dedup", "--help"], env={"COLUMNS": "160"})
    assert r.exit_code == 0 and "--in" in r.output and "--dedup.rows_per_file" in r.output
    assert "--no-dedup.item_table" in r.output
