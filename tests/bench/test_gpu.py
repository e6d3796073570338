"""bench/gpu.py: the GPU section's steps in one call, checked on the CPU (--smoke) so that
the flags it passes cannot rot while no GPU is lent."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from bench.common import SMOKE_ENV, check_line
from tests.bench._smoke import REPO


def _gpu(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != SMOKE_ENV}
    return subprocess.run([sys.executable, str(REPO / "bench" / "gpu.py"), *args], cwd=REPO,
                          env={**base, **(env or {})}, capture_output=True, text=True,
                          timeout=600)


def test_its_steps_run_and_their_lines_and_calibration_land_in_out(tmp_path) -> None:
    """Planted bugs that turn this red (tried): a step's flag misspelt (`--batchsize`), the
    calibration written beside --out instead of in it."""
    r = _gpu("--smoke", "--out", str(tmp_path), "--only", "train_65536", "calibrate")
    assert r.returncode == 0, r.stderr[-4000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [(s["step"], s["status"]) for s in summary] == [("train_65536", "ok"),
                                                             ("calibrate", "ok")]
    lines = [json.loads(x) for x in (tmp_path / "gpu.jsonl").read_text().splitlines()
             if x.startswith("{")]
    for rec in lines:
        check_line(rec)
    assert {x["bench"] for x in lines} == {"train.vs_torchrec"}
    cal = json.loads((tmp_path / "calibration-cpu.json").read_text())
    assert cal["device"] == "cpu" and cal["points"]


def test_a_step_that_does_not_fit_the_budget_is_skipped_and_said(tmp_path) -> None:
    """Planted bug that turns this red (tried): the budget check dropped (the step runs)."""
    r = _gpu("--smoke", "--out", str(tmp_path), "--budget", "30", "--only", "fp8")
    assert r.returncode == 1
    (step,) = json.loads((tmp_path / "summary.json").read_text())
    assert step["status"] == "skipped" and "budget" in step["why"]
    assert not (tmp_path / "gpu.jsonl").read_text()


def test_missing_packages_are_named_before_any_step(tmp_path) -> None:
    """Without polars (as on the GPU machine's image) it says so and runs nothing.
    Planted bug that turns this red (tried): the check of NEEDS dropped."""
    block = tmp_path / "block"  # a sitecustomize that hides polars from the finders
    block.mkdir()
    (block / "sitecustomize.py").write_text(
        "import sys, importlib.machinery as m\n"
        "class _Hide(m.PathFinder):\n"
        "    @classmethod\n"
        "    def find_spec(cls, name, path=None, target=None):\n"
        "        return None if name.split('.')[0] == 'polars' else "
        "super().find_spec(name, path, target)\n"
        "sys.meta_path = [_Hide if f is m.PathFinder else f for f in sys.meta_path]\n")
    out = tmp_path / "out"
    r = _gpu("--out", str(out), env={"PYTHONPATH": f"{block}:{REPO}"})
    assert r.returncode == 2
    assert r.stderr.strip().startswith("error: bench/gpu.py: missing polars")
    assert not out.exists()


def test_without_a_gpu_it_says_so(tmp_path) -> None:
    r = _gpu("--out", str(tmp_path / "out"), env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 2 and "no CUDA device" in r.stderr
