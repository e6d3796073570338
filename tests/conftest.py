"""Shared fixtures: an isolated MLflow store per test session, the real Criteo sample."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Prefect's ephemeral server gets 20 s to start by default: on a loaded 2-core machine (CI)
# that was not always enough ("Timed out while attempting to connect"). Set before any test
# module imports Prefect, which reads its settings once.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
HARNESS_STARTUP_S = 120  # prefect_test_harness's own bound (30 s by default)

REPO = Path(__file__).resolve().parents[1]
CRITEO_DIR = REPO.parent / "shared" / "data" / "criteo_sample"


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
