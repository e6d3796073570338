"""A fresh clone of this checkout on tiny params: what the end-to-end flow and repro tests
run the pipelines in (a folder with nothing beside it: no ../shared)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from tests.conftest import REPO

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
    (a folder with nothing else in it: no ../shared). Not an untracked dvc.lock: the record
    of a pipeline run in this checkout (`make run` before `make test`), which a clone has
    not."""
    def listed(*which: str) -> list[bytes]:
        return subprocess.run(["git", "ls-files", *which, "--exclude-standard", "-z"], cwd=REPO,
                              check=True, capture_output=True).stdout.split(b"\0")

    files = listed("--cached") + [f for f in listed("--others")
                                  if f.rsplit(b"/", 1)[-1] != b"dvc.lock"]
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
