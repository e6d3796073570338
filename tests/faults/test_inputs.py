"""Bad input and hostile folders through the `lrm` command, as a user meets them: exit 2 and
one line on stderr naming what is wrong (no traceback), and what was there is kept: a bad
value inside lrm's Parquet (dedup; train, caught before a step), a fresh run on another
run's checkpoints, a pickled state dict in a model folder, another model's weights copied
into one, a model card of a kind this lrm does not build, a Parquet file beside the day
folders, a tracking store that is not a database. And the same command run twice (and resumed once finished) is rc 0 each time:
every writer names its stage. (Each bad
value and the day=two folder in-process: tests/data/test_values.py; a symlinked lock file:
tests/test_lock.py.) Cases run two at a time, each in its own folder and MLflow store."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mlflow
import pytest
import torch
import yaml

from lrm.data.schema import day_files
from lrm.io import MARKER, read_sha256
from tests.conftest import REPO, other_weights
from tests.data.test_values import set_value

pytestmark = pytest.mark.slow

PARAMS = {"train": {"batch_size": 256, "steps": 4, "threads": 1, "log_every": 2},
          "checkpoint": {"every": 2},
          "loader": {"prefetch": 2, "num_workers": 1},
          "model": {"tables": {"max_rows": 5000},
                    "student": {"embedding_dim": 4, "bottom_mlp": [8], "top_mlp": [8]}}}


class _Evil:
    def __reduce__(self):  # unpickling it would create a file in the case's folder
        return (open, ("pwned", "w"))


def _tree(path: Path) -> dict[str, str] | None:
    if not path.exists():
        return None
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def _train(cwd: Path, data: str = "sessions", out: str = "m", ck: str = "ck") -> list[str]:
    return ["train", "--model", "student", "--data", str(cwd / data), "--out", out,
            "--checkpoints", ck]


def _pickled(cwd: Path) -> list[str]:
    """A copy of the trained model whose state dict is a pickled object, its hash recorded
    again in the folder's .lrm-output.json (a hostile folder); evaluate it."""
    shutil.copytree(cwd / "m", cwd / "model")
    torch.save({"w": _Evil()}, cwd / "model" / "state_dict.pt")
    marker = json.loads((cwd / "model" / MARKER).read_text())
    marker["files"]["state_dict.pt"]["sha256"] = read_sha256(cwd / "model" / "state_dict.pt")
    (cwd / "model" / MARKER).write_text(json.dumps(marker))
    return ["evaluate", "--model-dir", "model", "--data", str(cwd / "sessions"),
            "--out", "eval.json"]


def _recorded(folder: Path, name: str) -> None:
    """Record `name`'s bytes now in the folder's .lrm-output.json (as if lrm wrote them)."""
    marker = json.loads((folder / MARKER).read_text())
    marker["files"][name]["sha256"] = read_sha256(folder / name)
    (folder / MARKER).write_text(json.dumps(marker))


def _other_kind(cwd: Path) -> list[str]:
    """The issue-45 probe: a model card of a kind this lrm does not build (a ValueError's
    traceback through `lrm evaluate`); recorded, so the kind is what is wrong."""
    shutil.copytree(cwd / "m", cwd / "model3")
    card = json.loads((cwd / "model3" / "model.json").read_text())
    (cwd / "model3" / "model.json").write_text(json.dumps({**card, "kind": "wide"}))
    _recorded(cwd / "model3", "model.json")
    return ["evaluate", "--model-dir", "model3", "--data", str(cwd / "sessions"),
            "--out", "eval3.json"]


def _swapped(cwd: Path) -> list[str]:
    """A copy of the trained model holding another model's weights (the issue-45 probe: it
    was scored, NE 0.9639 against the folder's own 0.9477); evaluate it."""
    shutil.copytree(cwd / "m", cwd / "model2")
    other_weights(cwd / "model2")
    return ["evaluate", "--model-dir", "model2", "--data", str(cwd / "sessions"),
            "--out", "eval2.json"]


def _linked_day(cwd: Path) -> list[str]:
    """The issue-45 probe: a day folder of another dataset linked into the input, the output
    inside it (it wrote into the other dataset)."""
    (cwd / "s2").mkdir()
    (cwd / "s2" / "day=2").symlink_to(cwd / "raw" / "day=2")
    return ["dedup", "--in", "s2", "--out", "s2/day=2/x"]


def _stray(cwd: Path) -> list[str]:
    """The issue-45 probe: a Parquet file beside the day folders (dedup read around it)."""
    shutil.copy(day_files(cwd / "raw")[0][0], cwd / "raw" / "stray.parquet")
    return ["dedup", "--in", "raw", "--out", "d"]


def _not_a_store(cwd: Path) -> list[str]:
    """The issue-45 probe: the tracking store is a file that is not a database (a traceback
    from SQLAlchemy)."""
    (cwd / "raw" / "stray.parquet").unlink(missing_ok=True)
    (cwd / "mlflow.db").write_text("notes, not a database\n")
    return ["dedup", "--in", "raw", "--out", "d"]


def _empty(cwd: Path, ck: str) -> list[str]:
    (cwd / ck).mkdir()
    return _train(cwd, ck=ck)


# Each case is a sequence of commands in one folder: (argv, or a callable making it; what
# the one line says, "" for rc 0; the path whose content must not change)
Step = tuple[object, str, str]
CASES: dict[str, tuple[str, list[Step]]] = {  # name: (data layout to copy, its steps)
    "dedup: label 2": ("raw", [(lambda c: ["dedup", "--in", str(c / "raw"), "--out", "out"],
                                "field label: row group 0, row 0: label 2", "out")]),
    "train: label 2": ("sessions", [(lambda c: _train(c, out="out"),
                                     "field label: row group 0, row 0: label 2", "out")]),
    "one run's folder, again and again": ("sessions", [
        (_train, "", ""),
        (_train, "", ""),  # the same command: its own output, rc 0 (a marker naming train)
        (lambda c: [*_train(c), "--resume"], "", ""),  # resumed once finished: rc 0
        (lambda c: _train(c, out="m_other"), "holds ", "ck"),  # another run: refused
        (_pickled, "state_dict.pt: not a state dict of plain tensors, refused unread",
         "model"),
        (_swapped, "model2/state_dict.pt: changed since lrm wrote it", "model2"),
        (_other_kind, "model.json, field kind: unknown model kind 'wide'; this lrm builds "
                      "teacher, student", "model3"),
    ]),
    "dedup: an output inside a linked day": ("raw", [
        (_linked_day, "lies inside input", "raw"),
        (_stray, "raw/stray.parquet: a Parquet file outside the day=N folders is not read",
         "raw"),
        (_not_a_store, "cannot be opened (file is not a database)", "mlflow.db"),
    ]),
    "train --resume of nothing": ("sessions", [
        (lambda c: [*_train(c, ck="ckk"), "--resume"],  # a typo: was a fresh start, rc 0
         "--resume: --checkpoints ckk holds no checkpoint to go on from (mistyped?", "ckk"),
        (lambda c: [*_empty(c, "ck2"), "--resume"],
         "--resume: --checkpoints ck2 holds no checkpoint", "ck2"),
    ]),
}
BAD = {"dedup: label 2": ("raw", "label", 2), "train: label 2": ("sessions", "label", 2)}


def _lrm(cwd: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "MLFLOW_TRACKING_URI": f"sqlite:///{cwd}/mlflow.db"}
    return subprocess.run([sys.executable, "-m", "flows.cli", *argv, "--params",
                           str(cwd / "params.yaml")], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def runs(datasets, tmp_path_factory) -> dict[str, list[tuple]]:
    root = tmp_path_factory.mktemp("inputs")
    store = root / "mlflow.db"  # made once (~2 s a process), copied into every case
    mlflow.MlflowClient(tracking_uri=f"sqlite:///{store}").search_experiments()

    def run(name: str) -> list[tuple]:
        layout, steps = CASES[name]
        cwd = root / name.replace(" ", "_").replace(":", "").replace("'", "")
        cwd.mkdir()
        (cwd / "params.yaml").write_text(yaml.safe_dump(PARAMS))
        shutil.copy(store, cwd / "mlflow.db")
        data = Path(shutil.copytree(datasets[layout], cwd / layout))
        if name in BAD:
            _, column, value = BAD[name]
            set_value(day_files(data)[1][0], column, value)
        done = []
        for argv, says, kept in steps:
            argv = argv(cwd) if callable(argv) else argv
            before = _tree(cwd / kept) if kept else None
            r = _lrm(cwd, argv)
            done.append((cwd, " ".join(argv[:1]), r, says, before,
                         _tree(cwd / kept) if kept else None))
        return done

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(CASES, pool.map(run, CASES), strict=True))


@pytest.mark.parametrize("case", list(CASES))
def test_one_line_exit_2_and_nothing_lost(runs, case):
    for cwd, cmd, r, says, before, after in runs[case]:
        tail = f"lrm {cmd}: {r.stderr[-3000:]}"
        if not says:
            assert r.returncode == 0, tail
            continue
        assert r.returncode == 2, tail
        lines = [x for x in r.stderr.strip().splitlines() if x.startswith("error: ")]
        assert len(lines) == 1 and says in lines[0], tail
        assert "Traceback" not in r.stderr, tail
        assert after == before, tail  # what was there (or its absence) is kept
        assert not (cwd / "pwned").exists()  # no pickled code ran
