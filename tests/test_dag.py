"""End to end: `dvc repro` of the whole DAG on tiny params, in a fresh copy of the repo."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import CRITEO_DIR, REPO

pytestmark = pytest.mark.slow

TINY = {
    "generate": {"users": 2000, "ads": 300, "advertisers": 40, "categories": 8, "days": 3,
                 "sessions_per_day": 150, "mean_session_length": 4.0, "max_history": 20},
    "dedup": {"rows_per_file": 100},
    "train": {"batch_size": 256, "checkpoint_every": 0, "log_every": 5},
    # ExFM: teacher on day 0, students train on day 1 and are evaluated on day 2
    "exfm": {"teacher_days": 1},
    "teacher": {"train": {"batch_size": 256, "log_every": 5}},
    "augment": {"batch_size": 1024},
    "students": {"train": {"batch_size": 256, "log_every": 5},
                 "models": {"small": {"embedding_dim": 4, "bottom_mlp": [8], "top_mlp": [8]}}},
}


def _fresh_clone(dst: Path) -> Path:
    """Copy what a clone of the current working tree would hold (tracked + unignored)."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                           cwd=REPO, check=True, capture_output=True).stdout.split(b"\0")
    repo = dst / "repo"
    for f in filter(None, files):
        src = REPO / f.decode()
        if src.is_file():
            (repo / f.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, repo / f.decode())
    if CRITEO_DIR.exists():  # the real sample beside the repo, as in CI
        (dst / "shared" / "data").mkdir(parents=True)
        (dst / "shared" / "data" / "criteo_sample").symlink_to(CRITEO_DIR)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    return repo


def _tiny_params(repo: Path) -> None:
    params = yaml.safe_load((repo / "params.yaml").read_text())
    for sec, vals in TINY.items():
        params[sec].update(vals)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def test_dvc_repro_end_to_end(tmp_path):
    repo = _fresh_clone(tmp_path)
    _tiny_params(repo)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}
    # Without the real sample beside the repo, everything but the Criteo ingest.
    targets = [] if CRITEO_DIR.exists() else ["evaluate", "student"]
    r = subprocess.run([sys.executable, "-m", "dvc", "repro", *targets], cwd=repo, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    gen = json.loads((repo / "metrics/generate.json").read_text())
    ded = json.loads((repo / "metrics/dedup.json").read_text())
    assert gen["rows"] == ded["rows"] > 0
    assert ded["sessions"] < ded["rows"]
    assert sorted(p.name for p in (repo / "data/sessions").iterdir()) == [
        "day=0", "day=1", "day=2"]
    ev = json.loads((repo / "metrics/eval.json").read_text())
    for kind in ("student", "teacher"):
        assert ev[kind]["rows"] > 0 and math.isfinite(ev[kind]["ne"]) and ev[kind]["day"] == 2
    exfm = json.loads((repo / "metrics/exfm.json").read_text())
    assert exfm["eval_day"] == 2 and len(exfm["table"]) == 5  # teacher + 4 variants
    assert (repo / "plots/exfm_ne.csv").exists()
    if CRITEO_DIR.exists():
        assert json.loads((repo / "metrics/ingest.json").read_text())["rows"] == 8000

    again = subprocess.run([sys.executable, "-m", "dvc", "repro", *targets], cwd=repo, env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "up to date" in again.stdout, again.stdout
