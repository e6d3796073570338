"""Stage `ingest criteo` through both front doors: `python -m stages.ingest` and `lrm ingest`.

Bad input must exit 2 with the file, line and field on stderr and leave --out exactly as it
was. Every bad case runs in-process through the same typer app (the same command function,
stage() and atomic_dir) with --out both absent and present; four of them also run as real
subprocesses, one per (entry point, --out state), since each subprocess pays 2-5 s for
MLflow's import and store.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from lrm import io
from stages import ingest
from stagekit.cli import app
from tests.data.test_criteo import line, random_lines

ENTRY = {
    "module": [sys.executable, "-m", "stages.ingest", "criteo"],
    "lrm": [str(Path(sys.executable).parent / "lrm"), "ingest", "criteo"],
}


def _bad_input(d: Path, case: str) -> tuple[Path, int | None, str | None]:
    """Write the input of a bad case; return (file, line, field) the error must name."""
    f = d / f"{case}.tsv"
    good = [line(), line("1")]
    rows = {
        "fewer_fields": ("\t".join(line().split("\t")[:39]), "fields"),
        "more_fields": (line() + "\t1", "fields"),
        "non_integer": (line(ints={5: "1e3"}), "I5"),
        "bad_hex": (line(cats={3: "xyz"}), "C3"),
        "label_2": (line("2"), "label"),
    }
    if case == "empty":
        f.write_text("")
        return f, None, None
    if case == "missing":
        return f, None, None
    bad, field = rows[case]
    f.write_text("\n".join([*good, bad, line()]) + "\n")
    return f, 3, field


CASES = ["fewer_fields", "more_fields", "non_integer", "bad_hex", "label_2", "empty", "missing"]


def _snapshot(out: Path) -> dict[str, bytes] | None:
    if not out.exists():
        return None
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def _prepare_out(tmp: Path, existed: bool) -> Path:
    out = tmp / "out"
    if existed:  # an earlier ingest's output: only the input can be at fault
        with io.atomic_dir(out, stage="ingest") as t:
            (t / "day=0").mkdir()
            (t / "day=0" / "part-00000.parquet").write_bytes(b"previous output")
    return out


def _assert_failed_cleanly(rc: int, stderr: str, f: Path, line_no: int | None,
                           field: str | None, out: Path, before: dict | None) -> None:
    assert rc == 2, stderr
    msg = stderr.strip().splitlines()[-1]
    assert msg.startswith("error: ") and str(f) in msg, stderr
    if line_no is not None:
        assert f", line {line_no}, field {field}: " in msg, msg
    assert _snapshot(out) == before
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".out")] == []


def _params(tmp: Path, **ingest_section) -> Path:
    p = tmp / "params.yaml"
    p.write_text(yaml.safe_dump({"ingest": ingest_section}))
    return p


@pytest.mark.parametrize("existed", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_bad_input_in_process_exits_2_and_leaves_out(tmp_path, case, existed):
    f, line_no, field = _bad_input(tmp_path, case)
    out = _prepare_out(tmp_path, existed)
    before = _snapshot(out)
    r = CliRunner().invoke(app(ingest.STAGE), [
        "criteo", str(f), "--out", str(out), "--params", str(_params(tmp_path)),
        "--metrics", str(tmp_path / "m.json")])
    _assert_failed_cleanly(r.exit_code, r.stderr, f, line_no, field, out, before)


@pytest.mark.parametrize("entry,existed,case", [
    ("module", False, "fewer_fields"),
    ("lrm", False, "bad_hex"),
    ("module", True, "empty"),
    ("lrm", True, "more_fields"),
])
def test_bad_input_subprocess_exits_2_and_leaves_out(tmp_path, entry, existed, case):
    f, line_no, field = _bad_input(tmp_path, case)
    out = _prepare_out(tmp_path, existed)
    before = _snapshot(out)
    r = subprocess.run(
        [*ENTRY[entry], str(f), "--out", str(out), "--params", str(_params(tmp_path)),
         "--metrics", str(tmp_path / "m.json")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    _assert_failed_cleanly(r.returncode, r.stderr, f, line_no, field, out, before)
    assert not (tmp_path / "m.json").exists()


def test_files_from_params_relative_to_cwd_with_skip_bad(tmp_path):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.tsv").write_text("\n".join(random_lines(30, seed=1)) + "\n")
    (tmp_path / "raw" / "b.tsv").write_text(
        "\n".join([*random_lines(10, seed=2), "", line("2")]) + "\n")
    params = _params(tmp_path, files=["raw/a.tsv", "raw/b.tsv"], skip_bad=False)
    out = _prepare_out(tmp_path, existed=True)
    args = ["--out", "out", "--params", str(params), "--metrics", "metrics/i.json"]

    r = CliRunner().invoke(app(ingest.STAGE), ["criteo", *args])  # cwd: the repo
    assert r.exit_code == 2 and "raw/a.tsv: file not found" in r.stderr, r.stderr

    r = subprocess.run([*ENTRY["lrm"], *args, "--skip-bad", "--days", "file"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "metrics" / "i.json").read_text())
    assert (m["rows"], m["bad_rows"], m["files"], m["days"]) == (40, 2, 2, 2)
    assert m["bad_by_reason"] == {"field_count": 1, "label": 1, "not_integer": 0,
                                  "not_hex_hash": 0}
    assert sorted(p.name for p in out.iterdir() if p.name[0] != ".") == [
        "day=0", "day=1"]  # replaced: a day per file


def test_no_files_anywhere_is_an_error(tmp_path):
    r = CliRunner().invoke(app(ingest.STAGE), ["criteo", "--out", str(tmp_path / "out"),
                                               "--params", str(_params(tmp_path)),
                                               "--metrics", str(tmp_path / "m.json")])
    assert r.exit_code == 2 and "no input files" in r.stderr
    assert not (tmp_path / "out").exists()


def test_real_sample_through_python_m(tmp_path, criteo_dir):
    (tmp_path / "criteo").symlink_to(criteo_dir)
    params = _params(tmp_path, files=[f"criteo/{n}.tsv" for n in ("train", "dev", "test")])
    r = subprocess.run(
        [*ENTRY["module"], "--out", "data/criteo/raw", "--params", str(params),
         "--metrics", "metrics/ingest.json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "metrics" / "ingest.json").read_text())
    assert (m["rows"], m["days"], m["bad_rows"]) == (8000, 3, 0)
    assert m["ctr"] == pytest.approx(0.216, abs=1e-3)
    assert m["bytes"] > 0
    assert sorted(p.name for p in (tmp_path / "data/criteo/raw").iterdir() if p.name[0] != ".") == [
        "day=0", "day=1", "day=2"]
