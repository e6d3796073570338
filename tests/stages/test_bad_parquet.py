"""Every stage that reads Parquet, given a damaged file: exit status 2, one line on stderr
naming the file (and the row group when its data is bad), no traceback, --out untouched.

The damage (tests/data/test_parquet.py): `flipped` (4 KB inverted inside row group 1's
data, found when decoding it; d_bid is read while streaming, in the loader's threads),
`truncated` (half the file), `empty`, `text` (a CSV named part-00000.parquet). The file is
day 1's, not the dataset's first (whose schema is read up front), so each stage's own
reads meet it. Dedup, the cheap stage, gets every kind of damage; the torch stages (each
~10 s of imports and MLflow start-up) get the data damage and one footer damage each,
every footer damage once: all footer damage takes the same path (lrm.data.parquet.open_file),
which tests/data/test_parquet.py checks for every mode and every reader in-process.
Cases run two at a time, each in its own folder (cwd, a copy of an empty MLflow store, --out).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import mlflow
import pytest
import yaml

from lrm import io

from lrm.data.schema import day_files
from tests.conftest import REPO
from tests.data.test_parquet import MODES, corrupt, tiny_world
from tests.exfm.conftest import random_teacher

pytestmark = pytest.mark.slow

CASES = ([("dedup", m) for m in MODES]
         + [("train", "flipped"), ("train", "truncated"), ("evaluate", "flipped"),
            ("evaluate", "empty"), ("augment", "flipped"), ("augment", "text")])
PARAMS = {
    "train": {"batch_size": 256, "steps": 2, "threads": 1, "log_every": 1},
    "loader": {"prefetch": 2, "num_workers": 1},
    "model": {"tables": {"max_rows": 5000},
              "student": {"embedding_dim": 4, "bottom_mlp": [8], "top_mlp": [8]}},
    "exfm": {"teacher_days": 1},  # augment: day 1
    "augment": {"batch_size": 512},
    "evaluate": {"batch_size": 512},  # day -1: day 1
}
SENTINEL = '{"written": "before the run"}\n'


@dataclass
class Run:
    bad: Path  # the damaged file
    out: Path
    before: list[tuple[str, bytes]] | None  # --out's files before the run (None: absent)
    returncode: int
    stderr: str


def _snapshot(path: Path) -> list[tuple[str, bytes]] | None:
    if not path.exists():
        return None
    if path.is_file():
        return [("", path.read_bytes())]
    return sorted((str(p.relative_to(path)), p.read_bytes()) for p in path.rglob("*")
                  if p.is_file())


def _args(stage: str, data: Path, model: Path, out: Path) -> list[str]:
    return {
        "dedup": ["--in", data, "--out", out],
        "train": ["--model", "student", "--data", data, "--out", out],
        "evaluate": ["--model", model, "--data", data, "--out", out],
        "augment": ["--data", data, "--teacher", model, "--out", out],
    }[stage]


def _prepare(root: Path, world: dict[str, Path], stage: str, mode: str) -> tuple[Path, Path, Path]:
    """The case's folder, with its damaged dataset copy and --out (absent after data
    damage, a folder or file holding a sentinel otherwise): (cwd, damaged file, out)."""
    cwd = root / f"{stage}-{mode}"
    data = Path(shutil.copytree(world["raw" if stage == "dedup" else "sessions"], cwd / "data"))
    bad = day_files(data)[1][0]
    corrupt(bad, mode, column="d_bid")
    out = cwd / ("eval.json" if stage == "evaluate" else "out")
    if mode != "flipped":  # an earlier run's output: only the damaged input is at fault
        if stage == "evaluate":
            io.write_text(SENTINEL, out, stage=stage)
        else:
            with io.atomic_dir(out, stage=stage) as tmp:
                (tmp / "sentinel.json").write_text(SENTINEL)
    return cwd, bad, out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Run]:
    root = tmp_path_factory.mktemp("bad-parquet")
    world = tiny_world(root / "world")
    model = random_teacher(world["sessions"], root / "teacher")
    params = root / "params.yaml"
    params.write_text(yaml.safe_dump(PARAMS))
    store = root / "mlflow.db"  # created once (~2 s a process), copied into every case
    mlflow.MlflowClient(tracking_uri=f"sqlite:///{store}").search_experiments()

    def run(case: tuple[str, str]) -> Run:
        stage, mode = case
        cwd, bad, out = _prepare(root, world, stage, mode)
        before = _snapshot(out)
        shutil.copy(store, cwd / "mlflow.db")
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
               "MLFLOW_TRACKING_URI": f"sqlite:///{cwd}/mlflow.db"}
        r = subprocess.run([sys.executable, "-m", f"stages.{stage}",
                            *map(str, _args(stage, bad.parents[1], model, out)),
                            "--params", str(params)],
                           cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        return Run(bad, out, before, r.returncode, r.stderr)

    with ThreadPoolExecutor(2) as pool:  # two cores: each process mostly imports
        return dict(zip(CASES, pool.map(run, CASES), strict=True))


def _id(case: tuple[str, str]) -> str:
    return "-".join(case)


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_exit_2_with_one_line_naming_the_file(runs, case):
    r = runs[case]
    tail = r.stderr[-3000:]
    assert r.returncode == 2, tail
    last = (r.stderr.strip().splitlines() or [""])[-1]
    assert last.startswith(f"error: {r.bad}: "), tail
    if case[1] == "flipped":
        assert "row group 1: " in last, tail
    assert "Traceback" not in r.stderr and "Exception in thread" not in r.stderr, tail


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_out_is_untouched(runs, case):
    r = runs[case]
    assert _snapshot(r.out) == r.before, f"{r.out} changed (before: {r.before})"
    assert not list(r.out.parent.glob(f".{r.out.name}.*")), "a temporary was left behind"
