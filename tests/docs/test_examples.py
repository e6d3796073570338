"""The documentation's examples run as written, on tiny data a test writes where they expect
it: the quick start, the README's ingest, the Criteo commands and the click-log ingests (a
log of impressions, and MIND's page views through the mapping file the page shows). Each
block's lines run one by one through bash, in a fresh folder, with the installed `lrm`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl

from lrm.data.schema import day_files
from tests.data.test_criteo import random_lines
from tests.docs._pages import REPO, block_with, yaml_block

BIN = Path(sys.executable).parent  # the venv's bin: lrm, dvc
GETTING_STARTED = REPO / "docs" / "getting-started.md"
DATA = REPO / "docs" / "data.md"
README = REPO / "README.md"


def run_block(page: Path, first: str, cwd: Path) -> list[str]:
    """Run the bash block of `page` that holds a line starting with `first`, line by line as
    written; each must exit 0. Their standard outputs."""
    outs = []
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    for cmd in block_with(page, first):
        proc = subprocess.run(["bash", "-c", cmd.text], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=900)
        assert proc.returncode == 0, f"{cmd.page}:{cmd.line}: {cmd.text}\n{proc.stderr[-3000:]}"
        outs.append(proc.stdout)
    return outs


def clicks(folder: Path, days: int = 3, rows: int = 3500, seed: int = 0) -> int:
    """A log of one row per impression as the docs' example reads it: Parquet files of clicks
    with a user, an ad, a time in milliseconds, a surface, a device and a price."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    t0 = 1_699_920_000_000  # 2023-11-14 00:00 UTC, in ms: each day's times within its day
    for d in range(days):
        users = rng.integers(0, 150, rows)
        pl.DataFrame({
            "uid": [f"u{u}" for u in users],
            "ad_id": rng.integers(0, 80, rows),
            "ts": np.sort(t0 + d * 86_400_000 + rng.integers(0, 80_000_000, rows)),
            "clicked": (rng.random(rows) < 0.2).astype(np.int64),
            "surface": rng.choice(["feed", "search"], rows),
            "device": rng.choice(["ios", "android", "web"], rows),
            "price": rng.lognormal(0.0, 1.0, rows),
        }).write_parquet(folder / f"part-{d}.parquet")
    return days * rows


def test_quick_start_runs_as_written(tmp_path: Path) -> None:
    outs = run_block(GETTING_STARTED, "lrm generate", tmp_path)
    assert "Usage: lrm" in " ".join(outs[0].split())  # lrm --help
    assert sorted(day_files(tmp_path / "data" / "sessions")) == [0, 1, 2]
    for stage in ("generate", "dedup", "train_student"):  # where the page says
        assert (tmp_path / "metrics" / f"{stage}.json").is_file(), stage
    scores = json.loads((tmp_path / "metrics" / "mine.json").read_text())
    assert 0.5 < scores["student"]["ne"] < 1.1, scores


def test_click_log_ingest_runs_as_written(tmp_path: Path) -> None:
    n = clicks(tmp_path / "clicks")
    run_block(DATA, "lrm ingest logs clicks/", tmp_path)
    raw = tmp_path / "data" / "mine" / "raw"
    assert sorted(day_files(raw)) == [0, 1, 2]
    got = sum(pl.read_parquet(f).height for fs in day_files(raw).values() for f in fs)
    assert got == n


def test_readme_example_runs_as_written(tmp_path: Path) -> None:
    clicks(tmp_path / "clicks", seed=1)
    run_block(README, "lrm ingest logs clicks/", tmp_path)
    assert (tmp_path / "models" / "mine" / "model.json").is_file()


def test_mind_mapping_file_runs_as_written(tmp_path: Path) -> None:
    """The page's mind.yaml and its command, on page views in MIND's format."""
    (tmp_path / "mind.yaml").write_text(yaml_block(DATA, "# mind.yaml"))
    rng = np.random.default_rng(2)
    rows = []
    for i in range(60):
        day, h = 11 + i // 30, 1 + i % 11
        shown = " ".join(f"N{rng.integers(0, 40)}-{int(rng.random() < 0.3)}" for _ in range(5))
        seen = " ".join(f"N{rng.integers(0, 40)}" for _ in range(3))
        rows.append(f"{i + 1}\tU{i % 12}\t11/{day}/2019 {h}:05:0{i % 10} AM\t{seen}\t{shown}")
    (tmp_path / "behaviors.tsv").write_text("\n".join(rows) + "\n")
    run_block(DATA, "lrm ingest logs behaviors.tsv", tmp_path)
    raw = tmp_path / "data" / "mind" / "raw"
    assert sorted(day_files(raw)) == [0, 1]
    assert sum(pl.read_parquet(f).height for fs in day_files(raw).values() for f in fs) == 300


def test_criteo_commands_run_as_written(tmp_path: Path) -> None:
    # 6,400 rows a file: one epoch of the 50 steps a first run takes at least (train.min_steps)
    for name, seed in (("a.tsv", 1), ("b.tsv", 2), ("train.tsv", 3), ("test.tsv", 4)):
        (tmp_path / name).write_text("\n".join(random_lines(6400, seed=seed)) + "\n")
    run_block(DATA, "lrm ingest criteo a.tsv b.tsv", tmp_path)
    assert sorted(day_files(tmp_path / "data" / "mine" / "sessions")) == [0, 1]
    assert (tmp_path / "models" / "mine" / "model.json").is_file()
    run_block(DATA, "lrm ingest criteo train.tsv", tmp_path)
    assert (tmp_path / "models" / "student" / "model.json").is_file()
