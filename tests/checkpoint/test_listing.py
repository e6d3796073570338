"""`lrm checkpoint ls|verify DIR`: what the folder holds, and exit status 2 naming what is
wrong (through the real command line: flows/cli.py's app)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from flows.cli import app
from lrm.checkpoint import CheckpointManager
from lrm.config import CheckpointConfig
from tests.checkpoint.conftest import build, train_steps


@pytest.fixture(scope="module")
def folder(env, tmp_path_factory):
    root = tmp_path_factory.mktemp("ls") / "ck"
    _, parts = build(env)
    with CheckpointManager(root, env, CheckpointConfig(every=2, quantize="int4"), {}) as ck:
        ck.start(parts, False)
        train_steps(parts, range(4), ck)
        ck.finish(5, parts)
    return root


def _cli(*args):
    r = CliRunner().invoke(app, ["checkpoint", *map(str, args)])
    return r.exit_code, r.stdout, r.stderr


def test_ls_lists_steps_kinds_bytes_quantization_and_verification(folder):
    code, out, _ = _cli("ls", folder)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["checkpoint", "step", "kind", "chain", "bytes", "quantize",
                                "rows", "verified"]
    rows = [line.split() for line in lines[1:]]
    assert [(r[0], r[1], r[2], r[6], r[-1]) for r in rows] == [
        ("000001-step-2", "2", "baseline", "int4", "yes"),
        ("000002-step-4", "4", "delta", "int4", "yes"),
        ("000003-step-5", "5", "delta", "int4", "yes")]
    assert int(rows[1][7]) < int(rows[0][7]) == 100  # a delta: only the touched rows


def test_verify_passes_then_names_the_bad_file_with_exit_2(folder, tmp_path):
    import shutil

    code, out, _ = _cli("verify", folder)
    assert code == 0 and "3 checkpoint(s)" in out and "newest 000003-step-5" in out
    bad = tmp_path / "ck"
    shutil.copytree(folder, bad)
    (bad / "000002-step-4" / "rows-0.pt").write_bytes(b"")
    code, out, err = _cli("verify", bad)
    assert code == 2
    (line,) = err.strip().splitlines()
    assert line.startswith("error: ") and "000002-step-4/rows-0.pt: 0 bytes" in line
    assert "newest restorable: 000001-step-2" in line  # step 5 builds on the bad delta
    code, _, err = _cli("verify", tmp_path / "nope")
    assert code == 2 and "no such checkpoint folder" in err
    (tmp_path / "a.txt").write_text("not a folder")  # the ops probe: "no such folder"
    for cmd in ("ls", "verify"):
        code, _, err = _cli(cmd, tmp_path / "a.txt")
        assert code == 2 and "a.txt: a file, not a checkpoint folder" in err


def test_a_folder_of_chains_names_the_subfolders_that_hold_checkpoints(folder, tmp_path):
    """The ops probe: `lrm checkpoint ls stream/checkpoints` (teacher/, students/NAME/)
    said only "no checkpoints". Red without _chains_below."""
    import shutil

    root = tmp_path / "checkpoints"
    shutil.copytree(folder, root / "teacher")
    shutil.copytree(folder, root / "students" / "small")
    code, out, _ = _cli("ls", root)
    assert code == 0 and "its subfolders teacher, students/small hold checkpoints" in out
    code, _, err = _cli("verify", root)
    assert code == 2 and "no checkpoints; its subfolders teacher, students/small" in err
