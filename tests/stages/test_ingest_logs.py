"""Stage `ingest logs` through its front doors (`lrm ingest logs`, `python -m stages.ingest
logs`, as before stages/ingest_logs.py was its own module): flags, a mapping file under them, params; bad input exits 2 with one line naming
the file, row and column and leaves --out exactly as it was; the real MIND sample.

Planted bugs that turn these red (each tried): the mapping file laid over the flags instead
of under them; a bad value's error raised after the day was written (out changed).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app as lrm_app
from lrm.data.schema import day_files, read_schema
from stages import ingest_logs
from tests.conftest import new_store
from tests.data._logs import T0, frame, write

MIND_MAP = {"format": "tsv", "columns": ["impression_id", "user", "time", "history",
                                         "impressions"],
            "user": "user", "time": "time", "time_format": "%m/%d/%Y %I:%M:%S %p",
            "explode": "impressions", "item": "news", "session": "impression_id",
            "history": "history"}


def _log(tmp: Path, bad: dict | None = None) -> Path:
    rows = [{"uid": f"u{i % 3}", "when": T0 + 600 * i, "ad": f"a{i % 4}", "click": i % 2,
             "bid": str(0.5 * i)} for i in range(8)]
    if bad:
        rows[5] = {**rows[5], **bad}
    return write(frame(rows), tmp / "log.csv")


FLAGS = ["--label", "click", "--user", "uid", "--item", "ad", "--time", "when",
         "--session-gap", "30m", "--dense", "bid"]


def _run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(lrm_app, ["ingest", "logs", *args])
    return r.exit_code, r.stdout, r.stderr


def _snapshot(out: Path) -> dict[str, bytes] | None:
    if not out.exists():
        return None
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file()}


def test_flags_ingest_a_log_and_write_the_metrics(tmp_path):
    f = _log(tmp_path)
    rc, _, err = _run(str(f), "--out", str(tmp_path / "out"), "--metrics",
                      str(tmp_path / "m.json"), *FLAGS)
    assert rc == 0, err
    m = json.loads((tmp_path / "m.json").read_text())
    assert (m["rows"], m["days"], m["files"]) == (8, 1, 1)
    assert m["sessions"] == 8  # a user's impressions are 30 minutes apart: one each
    schema, layout = read_schema(tmp_path / "out")
    assert layout == "impressions" and schema.user_key == "uid" and schema.dense == ("bid",)


def test_a_mapping_file_lies_under_the_flags(tmp_path):
    f = _log(tmp_path)
    mapping = tmp_path / "map.yaml"
    mapping.write_text(yaml.safe_dump({"label": "click", "user": "uid", "item": "ad",
                                       "time": "when", "session_gap": "30m",
                                       "categorical": ["bid"]}))
    rc, _, err = _run(str(f), "--out", str(tmp_path / "a"), "--metrics",
                      str(tmp_path / "a.json"), "--map", str(mapping))
    assert rc == 0, err
    assert json.loads((tmp_path / "a.json").read_text())["sessions"] == 8
    rc, _, err = _run(str(f), "--out", str(tmp_path / "b"), "--metrics",
                      str(tmp_path / "b.json"), "--map", str(mapping), "--session-gap", "1h")
    assert rc == 0, err
    assert json.loads((tmp_path / "b.json").read_text())["sessions"] == 3  # the flag's gap
    assert read_schema(tmp_path / "b")[0].item_sparse == ("ad", "bid")  # the file's roles
    mapping.write_text(yaml.safe_dump({"label": "click", "bogus": 1}))
    rc, _, err = _run(str(f), "--out", str(tmp_path / "c"), "--map", str(mapping))
    assert rc == 2 and "unknown mapping keys ['bogus']" in err
    assert not (tmp_path / "c").exists()
    rc, _, err = _run(str(f), "--out", str(tmp_path / "c"), "--map", str(tmp_path / "no.yaml"))
    assert rc == 2 and "no.yaml: mapping file not found" in err and not (tmp_path / "c").exists()


def test_a_bad_value_in_a_mapping_file_names_the_file_and_its_key(tmp_path):
    """A value of the wrong type in `--map FILE` (`time_unit: 5`, a number among the
    categorical columns) is the file's: the error names FILE and the key (it named the flag
    the value never came from, `--ingest.logs.time_unit`); a flag given over it is named as
    the flag. Red with the mapping's keys not recorded as coming from the file."""
    f = _log(tmp_path)
    mapping = tmp_path / "map.yaml"
    base = {"label": "click", "user": "uid", "item": "ad", "time": "when"}
    for bad, key in (({"time_unit": 5}, "time_unit"), ({"categorical": ["bid", 3]},
                                                      "categorical")):
        mapping.write_text(yaml.safe_dump({**base, **bad}))
        rc, _, err = _run(str(f), "--out", str(tmp_path / "o"), "--map", str(mapping))
        assert rc == 2 and err.startswith(f"error: {mapping}: {key} (over "), err
        assert not (tmp_path / "o").exists()
    mapping.write_text(yaml.safe_dump({**base, "time_unit": 5}))
    rc, _, err = _run(str(f), "--out", str(tmp_path / "o"), "--map", str(mapping),
                      "--time-unit", "7")
    assert rc == 2 and err.startswith("error: --ingest.logs.time_unit (over "), err


@pytest.mark.parametrize("existed", [False, True])
@pytest.mark.parametrize("bad,column,words", [
    ({"click": "2"}, "click", "0 or 1"), ({"ad": ""}, "ad", "missing id"),
    ({"when": "noon"}, "when", "does not parse"), ({"bid": "inf"}, "bid", "finite")])
def test_bad_input_exits_2_naming_file_row_and_column_and_leaves_out(tmp_path, existed, bad,
                                                                     column, words):
    out = tmp_path / "out"
    if existed:  # an earlier good ingest's output: only the input can be at fault
        assert _run(str(_log(tmp_path)), "--out", str(out), "--metrics",
                    str(tmp_path / "m0.json"), *FLAGS)[0] == 0
    before = _snapshot(out)
    f = _log(tmp_path, bad)
    rc, _, err = _run(str(f), "--out", str(out), "--metrics", str(tmp_path / "m.json"),
                      *FLAGS)
    assert rc == 2, err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"error: {f}, row 6, column {column}: ") and words in line, err
    assert _snapshot(out) == before and not (tmp_path / "m.json").exists()
    assert [p.name for p in tmp_path.iterdir() if "spill" in p.name or ".tmp-" in p.name
            ] == []  # no temporary folder left


def test_python_m_and_params(tmp_path):
    f = _log(tmp_path)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"ingest": {"logs": {
        "files": [str(tmp_path / "*.csv")], "label": "click", "user": "uid", "item": "ad",
        "time": "when", "session_gap": "30m"}}}))
    r = subprocess.run([sys.executable, "-m", "stages.ingest", "logs", "--out", "raw",
                        "--params", str(params), "--metrics", "m.json"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(Path(ingest_logs.__file__).parents[1]),
                            "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                            "MLFLOW_TRACKING_URI": new_store(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "m.json").read_text())["files"] == 1
    assert f.exists() and len(day_files(tmp_path / "raw")) == 1


def test_the_mind_sample(tmp_path, mind_dir):
    mapping = tmp_path / "mind.yaml"
    mapping.write_text(yaml.safe_dump(MIND_MAP))
    rc, _, err = _run(str(mind_dir / "behaviors.tsv"), "--out", str(tmp_path / "raw"),
                      "--metrics", str(tmp_path / "m.json"), "--map", str(mapping))
    assert rc == 0, err
    m = json.loads((tmp_path / "m.json").read_text())
    # SOURCE.md: 5,000 page views, 189,359 shown items, 7,542 clicks, six days
    assert (m["input_rows"], m["rows"], m["sessions"], m["days"]) == (5000, 189_359, 5000, 6)
    assert m["ctr"] == pytest.approx(7542 / 189_359)
    sessions_a_day = [pl.read_parquet(fs).select(pl.col("session_id").n_unique()).item()
                      for fs in day_files(tmp_path / "raw").values()]
    assert sessions_a_day == [439, 490, 1109, 1020, 974, 968]
    assert m["vocab"]["user"] == 4637


def test_a_pattern_reaches_into_folders_and_numbers_order_the_days(tmp_path):
    """`in/**/*.csv` finds the files in every folder below, and with `--days file` day k is
    the k-th file with its numbers read as numbers (day2 before day10, which plain sorting
    puts first). Red with `glob` not recursive, or sorted as text."""
    for n, sub in ((10, "a"), (2, "a"), (3, "b/sub")):
        (tmp_path / "in" / sub).mkdir(parents=True, exist_ok=True)
        rows = [{"uid": "u1", "when": T0 + 60 * i, "ad": f"d{n}", "click": 1, "bid": "1"}
                for i in range(n)]  # file dayN: N rows
        write(frame(rows), tmp_path / "in" / sub / f"day{n}.csv")
    rc, _, err = _run(str(tmp_path / "in" / "**" / "*.csv"), "--out", str(tmp_path / "out"),
                      "--metrics", str(tmp_path / "m.json"), "--days", "file", *FLAGS)
    assert rc == 0, err
    rows = {d: sum(pl.read_parquet(f).height for f in fs)
            for d, fs in day_files(tmp_path / "out").items()}
    assert rows == {0: 2, 1: 10, 2: 3}  # a/day2, a/day10, b/sub/day3


def test_a_terminated_ingest_leaves_nothing_beside_out(tmp_path):
    """SIGTERM while the ingest writes (its temporary output folder, lock and spill exist):
    exit 143 and nothing of it left, as after Ctrl-C. Red with SIGTERM left to Python's
    default (the process dies where it stands: `.out.tmp-*`, `.out.lock` and the spill
    stay)."""
    import os
    import signal
    import time

    from bench.cases.data_logs import _write_log  # a log big enough to take seconds

    f = tmp_path / "in" / "log.csv"
    f.parent.mkdir()
    (tmp_path / "home").mkdir()
    _write_log(f, 1_000_000)
    p = subprocess.Popen(
        [sys.executable, "-m", "stages.ingest", "logs", str(f), "--out", "out",
         "--metrics", "m.json", "--label", "clicked", "--user", "user_id", "--item", "item_id",
         "--time", "ts", "--session-gap", "30m"], cwd=tmp_path, stderr=subprocess.PIPE,
        env={"PYTHONPATH": str(Path(ingest_logs.__file__).parents[1]), "PATH": "/usr/bin:/bin",
             "HOME": str(tmp_path / "home"),
             "MLFLOW_TRACKING_URI": new_store(tmp_path)})
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".out.tmp-*/.lrm-ingest-spill-*")):  # (inside the output)
        assert p.poll() is None and time.monotonic() < deadline, \
            f"no spill folder seen: {p.stderr.read().decode()[-2000:] if p.poll() else ''}"
        time.sleep(0.01)
    os.kill(p.pid, signal.SIGTERM)
    assert p.wait(timeout=120) == 128 + signal.SIGTERM
    assert sorted(q.name for q in tmp_path.iterdir()) == ["home", "in", "mlflow.db"]


def test_a_file_given_twice_is_refused(tmp_path):
    """A folder and a file in it (or a glob and a name): the rows would be read twice, which
    nothing downstream could tell. Exit 2 naming it, nothing written."""
    (tmp_path / "in").mkdir()
    f = _log(tmp_path / "in")
    rc, _, err = _run(str(tmp_path / "in"), str(f), "--out", str(tmp_path / "out"), *FLAGS)
    assert rc == 2 and f"{f}: given twice" in err, err
    assert not (tmp_path / "out").exists()


def test_exports_as_tools_write_them_go_in_as_their_clean_copies(tmp_path):
    """Through `lrm ingest logs`: a CSV from a Windows tool (a byte order mark, CRLF, its
    last line ended twice) beside a Parquet file of pandas `category` columns reads as the
    plain files do; the same CSV in bzip2 exits 2 naming the file, --out never made."""
    import bz2

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"uid": f"u{i % 3}", "when": T0 + 600 * i, "ad": f"a{i % 4}", "click": i % 2,
             "bid": str(0.5 * i)} for i in range(8)]
    clean = tmp_path / "clean"
    clean.mkdir()
    a = write(frame(rows[:4]), clean / "a.csv")
    b = write(frame(rows[4:]), clean / "b.parquet")
    tool = tmp_path / "tool"
    tool.mkdir()
    (tool / "a.csv").write_bytes(b"\xef\xbb\xbf" + a.read_bytes().replace(b"\n", b"\r\n")
                                 + b"\r\n")
    t = pq.read_table(b)
    for col in ("uid", "ad"):
        t = t.set_column(t.schema.get_field_index(col), col, t[col].dictionary_encode())
    pq.write_table(t, tool / "b.parquet")
    outs = {}
    for name, folder in (("clean", clean), ("tool", tool)):
        rc, _, err = _run(str(folder / "a.csv"), str(folder / "b.parquet"), "--out",
                          str(tmp_path / f"out-{name}"), "--metrics",
                          str(tmp_path / f"{name}.json"), *FLAGS)
        assert rc == 0, err
        outs[name] = pl.concat([pl.read_parquet(f) for fs in day_files(
            tmp_path / f"out-{name}").values() for f in fs])
    assert outs["tool"].equals(outs["clean"]) and outs["tool"].height == 8
    (tool / "c.csv").write_bytes(bz2.compress(a.read_bytes()))
    rc, _, err = _run(str(tool / "c.csv"), "--out", str(tmp_path / "out-bz"), *FLAGS)
    assert rc == 2 and "c.csv: bzip2-compressed: lrm reads gzip only" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out-bz").exists()
