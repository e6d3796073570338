"""End to end: `dvc repro` of the default DAG on tiny params, in a fresh clone with nothing
beside it (no ../shared), then a second `dvc repro` that does nothing; the clone stays clean."""

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

from tests.conftest import REPO

pytestmark = pytest.mark.slow

TINY = {
    "generate": {"users": 2000, "ads": 300, "advertisers": 40, "categories": 8, "days": 4,
                 "sessions_per_day": 150, "mean_session_length": 4.0, "max_history": 20,
                 "verticals": [{"name": "all"}]},
    "dedup": {"rows_per_file": 100},
    "train": {"batch_size": 256, "log_every": 2},
    "checkpoint": {"every": 0},
    # ExFM: one teacher version (day 0) logging days 1-3; students train on days 0-2 (labels
    # only on day 0), the validation day is 2, the table's day 3
    "exfm": {"teacher_days": 1, "teacher_every": 0, "teacher_lag": 1},
    "augment": {"batch_size": 1024},
    "students": {"models": {"small": {"embedding_dim": 4, "bottom_mlp": [8], "top_mlp": [8]}}},
}


def fresh_clone(dst: Path) -> Path:
    """A clone of the current working tree (tracked + unignored files), committed, in `dst`
    (a folder with nothing else in it: no ../shared)."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                           cwd=REPO, check=True, capture_output=True).stdout.split(b"\0")
    repo = dst / "repo"
    for f in filter(None, files):
        src = REPO / f.decode()
        if src.is_file():
            (repo / f.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, repo / f.decode())
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "clone"], cwd=repo, check=True)
    return repo


def tiny_params(repo: Path) -> None:
    params = yaml.safe_load((repo / "params.yaml").read_text())
    for sec, vals in TINY.items():
        params[sec].update(vals)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam",
                    "tiny"], cwd=repo, check=True)


def _png_has_content(path: Path) -> bool:
    import matplotlib.image

    img = matplotlib.image.imread(path)
    return img.shape[0] > 100 and float(img.std()) > 0.01  # not one flat colour


def test_dvc_repro_on_a_fresh_clone_then_up_to_date(tmp_path):
    repo = fresh_clone(tmp_path)
    assert not (tmp_path / "shared").exists()
    tiny_params(repo)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}
    r = subprocess.run([sys.executable, "-m", "dvc", "repro"], cwd=repo, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Successfully loaded" not in r.stdout + r.stderr

    gen = json.loads((repo / "metrics/generate.json").read_text())
    ded = json.loads((repo / "metrics/dedup.json").read_text())
    assert gen["rows"] == ded["rows"] > 0 and ded["sessions"] < ded["rows"]
    ev = json.loads((repo / "metrics/eval.json").read_text())
    for kind in ("student", "teacher"):
        assert ev[kind]["rows"] > 0 and math.isfinite(ev[kind]["ne"]) and ev[kind]["day"] == 3
    exfm = json.loads((repo / "metrics/exfm.json").read_text())
    assert exfm["eval_day"] == 3 and len(exfm["table"]) == 1 + 4  # teacher + 4 variants
    summary = json.loads((repo / "metrics/summary.json").read_text())
    assert set(summary) == {"baseline_day3", "exfm_day3_all"}
    assert summary["baseline_day3"]["student"]["ne"] == round(ev["student"]["ne"], 4)

    # plots read offline: PNGs with content, one point per logged step / per day
    for png in ("train_student.png", "train_teacher.png", "exfm_ne.png"):
        assert _png_has_content(repo / "plots" / png), png
    steps = (repo / "plots/train_student.csv").read_text().splitlines()
    assert steps[0].startswith("step,loss") and len(steps) - 1 >= 2

    # `dvc metrics show` reads at a glance: the headline file only
    shown = subprocess.run([sys.executable, "-m", "dvc", "metrics", "show", "--json"],
                           cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    files = next(iter(json.loads(shown.stdout).values()))["data"]  # the workspace
    assert list(files) == ["metrics/summary.json"], files

    again = subprocess.run([sys.executable, "-m", "dvc", "repro"], cwd=repo, env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "up to date" in again.stdout, again.stdout
    assert "Running stage" not in again.stdout

    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True,
                            text=True, check=True).stdout
    # DVC's record of the run is the one new file (the user commits it); nothing else changed
    assert status == "?? dvc.lock\n", f"the run left files changed:\n{status}"
