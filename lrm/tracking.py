"""MLflow helpers: one run per stage execution, local SQLite store by default."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator, Mapping
from typing import Any

from lrm.config import TrackingConfig


PID_TAG, HOST_TAG = "lrm.pid", "lrm.host"  # the process a run belongs to (close_dead_runs)


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


def artifact_root(uri: str) -> str | None:
    """Where a new experiment of a local SQLite store keeps its artifacts: `mlruns/` beside
    the database file (a file URI); None where MLflow's default is that already (the store
    is in this folder) and for any other store."""
    from pathlib import Path

    prefix = "sqlite:///"
    db = uri[len(prefix):] if uri.startswith(prefix) else ""
    if not db or db.startswith(":memory:"):
        return None
    folder = Path(db).resolve().parent
    return None if folder == Path.cwd().resolve() else (folder / "mlruns").as_uri()


def _use_experiment(name: str, uri: str) -> None:
    """Make `name` the active experiment, creating it with its artifacts beside a SQLite
    store. MLflow's own default is ./mlruns of whatever folder the creating process runs in,
    so a store used from another folder (a test suite, a flow started elsewhere) scattered
    its models there (the default ./mlflow.db keeps MLflow's own layout)."""
    import mlflow
    from mlflow.exceptions import MlflowException

    root = artifact_root(uri)
    if root is not None and mlflow.get_experiment_by_name(name) is None:
        try:
            mlflow.create_experiment(name, artifact_location=root)
        except MlflowException as e:  # another process created it meanwhile: use theirs
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
    mlflow.set_experiment(name)


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
    uri = tracking_uri(cfg)
    mlflow.set_tracking_uri(uri)
    _use_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME") or cfg.experiment, uri)
    nested = mlflow.active_run() is not None
    owner = {PID_TAG: str(os.getpid()), HOST_TAG: socket.gethostname()}  # close_dead_runs
    with mlflow.start_run(run_name=name, nested=nested,
                          tags={**owner, **dict(tags or {})}) as active:
        if params:
            flat = {k: str(v)[:6000] for k, v in _flatten(params).items()}
            mlflow.log_params(flat)
        yield active


def close_dead_runs(cfg: TrackingConfig | None = None) -> list[str]:
    """Close as KILLED the runs of this experiment left RUNNING by a process of this host
    that is gone (a killed stage or stream day: MLflow cannot end a run its process never
    ended); returns their ids. Runs of live processes, and of other hosts, are left."""
    import mlflow

    cfg = cfg or TrackingConfig()
    mlflow.set_tracking_uri(tracking_uri(cfg))
    exp = mlflow.get_experiment_by_name(os.environ.get("MLFLOW_EXPERIMENT_NAME")
                                        or cfg.experiment)
    if exp is None:
        return []
    client = mlflow.MlflowClient()
    closed = []
    for r in client.search_runs([exp.experiment_id], "attributes.status = 'RUNNING'",
                                max_results=1000):
        pid, host = r.data.tags.get(PID_TAG), r.data.tags.get(HOST_TAG)
        if host == socket.gethostname() and pid and pid.isdigit() and not _alive(int(pid)):
            client.set_terminated(r.info.run_id, status="KILLED")
            closed.append(r.info.run_id)
    return closed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


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
