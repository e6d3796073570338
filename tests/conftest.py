"""Shared fixtures: an isolated MLflow store per test session, the real Criteo sample."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# the real samples beside the repo (LRM_SHARED_DATA names another place, e.g. for a worktree)
SHARED_DATA = Path(os.environ.get("LRM_SHARED_DATA", REPO.parent / "shared" / "data"))
CRITEO_DIR = SHARED_DATA / "criteo_sample"
MIND_DIR = SHARED_DATA / "mind_sample"


@pytest.fixture(scope="session", autouse=True)
def _mlflow_store(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every MLflow run of the suite goes to a throwaway SQLite store, never ./mlflow.db."""
    db = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{db}"
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


@pytest.fixture
def criteo_dir() -> Path:
    """../shared/data/criteo_sample, or skip with a clear message where it is absent."""
    if not (CRITEO_DIR / "train.tsv").exists():
        pytest.skip(f"real Criteo sample not found at {CRITEO_DIR} (shared data absent)")
    return CRITEO_DIR


@pytest.fixture
def mind_dir() -> Path:
    """../shared/data/mind_sample, or skip with a clear message where it is absent."""
    if not (MIND_DIR / "behaviors.tsv").exists():
        pytest.skip(f"real MIND sample not found at {MIND_DIR} (shared data absent)")
    return MIND_DIR
