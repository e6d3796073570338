"""MLflow helpers: one run per stage execution, local SQLite store by default."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

from lrm.config import TrackingConfig


def tracking_uri(cfg: TrackingConfig | None = None) -> str:
    """MLFLOW_TRACKING_URI wins over params.yaml, which wins over the local SQLite store."""
    return os.environ.get("MLFLOW_TRACKING_URI") or (cfg or TrackingConfig()).uri


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


@contextlib.contextmanager
def run(name: str, params: Mapping[str, Any] | None = None, cfg: TrackingConfig | None = None,
        tags: Mapping[str, str] | None = None) -> Iterator[Any]:
    """Start an MLflow run named `name` with flattened `params`; yields the active run.

    Nested runs are used when a run is already active (e.g. a flow's parent run).
    """
    import logging

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    import mlflow  # slow import, only where tracking is used

    for noisy in ("mlflow", "alembic"):  # per-run INFO chatter: keep warnings only
        logging.getLogger(noisy).setLevel(logging.WARNING)
    cfg = cfg or TrackingConfig()
    mlflow.set_tracking_uri(tracking_uri(cfg))
    mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME") or cfg.experiment)
    nested = mlflow.active_run() is not None
    with mlflow.start_run(run_name=name, nested=nested, tags=dict(tags or {})) as active:
        if params:
            flat = {k: str(v)[:6000] for k, v in _flatten(params).items()}
            mlflow.log_params(flat)
        yield active


def active() -> bool:
    """Whether an MLflow run is active in this process (a stage run, on rank 0)."""
    import sys

    if "mlflow" not in sys.modules:  # no run can be active without mlflow imported
        return False
    import mlflow

    return mlflow.active_run() is not None


def log_metrics(metrics: Mapping[str, float], step: int | None = None) -> None:
    """Log numeric metrics to the active run (non-numbers are skipped; no run: nothing)."""
    if not active():
        return
    import mlflow

    clean = {k: float(v) for k, v in _flatten(metrics).items()
             if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if clean:
        mlflow.log_metrics(clean, step=step)
