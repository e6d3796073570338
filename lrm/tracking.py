"""MLflow helpers: one run per stage execution, local SQLite store by default.

A stage's run holds its measurements once each: the series its training logs as it goes
(`log_metrics`: loss, eval_ne, ...) and, at its end, the stage's result (`log_result`):
a number the run already has as a series is not logged again under a second name, and
the values that describe the run rather than measure it (the day scored, the interval's
level and resamples, the world size, the schedule) are tags. The runs of one pipeline run
nest under a parent run (`run(..., parent=ID)`, `parent_run`), which carries the params
and the headline numbers (`log_headline`). The experiment is tagged as one of training
runs, and `ui_url` opens MLflow's UI on them rather than on MLflow 3's GenAI view.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from lrm.config import TrackingConfig
from lrm.errors import ConfigError

# The experiment's kind: training runs, not GenAI traces (MLflow's own tag; its assistant
# reads it). MLflow 3.17's UI opens on whichever of "GenAI" and "Model training" its switch
# at the top left holds (GenAI at first: traces, an empty latency chart): `ui_url` is the
# address that opens on the training runs.
KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
UI = "http://127.0.0.1:5000"  # `make ui`
# what a stage reports about how it ran, not what it measured: tags, never metrics
CONSTANTS = frozenset({"day", "eval_day", "ci_level", "ci_resamples", "world_size"})
PARENT_TAG = "mlflow.parentRunId"


def ui_url(base: str = UI, experiment_id: str | None = None) -> str:
    """The MLflow UI's page of the experiments (or of one) in its "Model training" view."""
    page = f"experiments/{experiment_id}" if experiment_id else "experiments"
    return f"{base}/#/{page}?workflowType=machine_learning"


PID_TAG, HOST_TAG = "lrm.pid", "lrm.host"  # the process a run belongs to (close_dead_runs)


def tracking_uri(cfg: TrackingConfig | None = None) -> str:
    """MLFLOW_TRACKING_URI wins over params.yaml, which wins over the local SQLite store."""
    return os.environ.get("MLFLOW_TRACKING_URI") or (cfg or TrackingConfig()).uri


REACH_S = 10.0  # seconds an http(s) tracking server gets to answer before lrm gives up
_opened: set[str] = set()  # stores this process has opened (each checked once)


def _store(uri: str) -> str:
    return f"tracking store {uri!r} (params tracking.uri; MLFLOW_TRACKING_URI wins over it)"


def _first_line(e: BaseException) -> str:
    text = str(getattr(e, "message", None) or e).strip()
    return (text.splitlines() or [type(e).__name__])[0][:300]


def _reachable(uri: str) -> None:
    """A ConfigError unless the http(s) server answers within REACH_S (any answer: a server
    without /health is still up). MLflow's own client retries for minutes, saying nothing
    (`http://127.0.0.1:9` hung past 120 s)."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=REACH_S).close()
    except urllib.error.HTTPError:
        return  # it answered
    except (urllib.error.URLError, OSError, ValueError) as e:
        why = getattr(e, "reason", e)
        raise ConfigError(f"{_store(uri)}: no answer within {REACH_S:g} s ({why}); start the "
                          f"server, or use e.g. sqlite:///mlflow.db") from None


@contextlib.contextmanager
def _writing(uri: str) -> Iterator[None]:
    """A store that opens but refuses a write (a SQLite file on a read-only mount) is a
    ConfigError naming it, not SQLAlchemy's traceback."""
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    try:
        yield
    except SQLAlchemyError as e:
        raise ConfigError(f"{_store(uri)}: cannot write to it ({_first_line(e.orig or e)}); "
                          f"a read-only file or mount?") from None
    except MlflowException as e:
        if not isinstance(e.__cause__ or e.__context__, SQLAlchemyError) and \
                "sqlite3." not in str(e.message):
            raise
        raise ConfigError(f"{_store(uri)}: cannot write to it ({_first_line(e)}); a "
                          f"read-only file or mount?") from None


MLFLOW_TABLES = frozenset({"alembic_version", "experiments", "runs"})  # in every MLflow store


def sqlite_file(uri: str) -> Path | None:
    """The database file of a sqlite:/// URI (SQLAlchemy's path or SQLite's own file: form,
    query dropped); None for a server or an in-memory store."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix):
        return None
    db = uri[len(prefix):].split("?", 1)[0].removeprefix("file:")
    return None if not db or db.startswith(":memory:") else Path(db)


def _check_sqlite(uri: str, existing: bool) -> None:
    """A ConfigError for a SQLite file MLflow would take over or invent: another program's
    database (MLflow added its ~80 tables beside the user's, then listed no models), and,
    with `existing`, a file that is not there (a mistyped URI was a fresh store, folders
    made, "no registered lrm models yet"). The file is opened read-only; a file that is
    not a database is left to MLflow's open, which names it."""
    import sqlite3

    path = sqlite_file(uri)
    if path is None:
        if existing and uri.startswith("sqlite:"):  # sqlite:// (it listed no models, rc 0)
            raise ConfigError(f"{_store(uri)}: an in-memory store holds nothing between "
                              f"commands; give the file, e.g. sqlite:///mlflow.db")
        return
    if not path.exists():
        if existing:
            raise ConfigError(f"{_store(uri)}: {path} does not exist (mistyped? a training "
                              f"run creates it)")
        return
    if path.is_dir():  # MLflow retried "unable to open database file" for 1m45s
        raise ConfigError(f"{_store(uri)}: {path} is a folder, not a SQLite file")
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in con.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            con.close()
    except sqlite3.DatabaseError:
        return
    if MLFLOW_TABLES <= tables:
        return
    if tables:
        shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        raise ConfigError(f"{_store(uri)}: {path} is a SQLite database but not an MLflow "
                          f"store (tables {shown}); left as it is")
    if existing:
        raise ConfigError(f"{_store(uri)}: {path} holds no MLflow store (an empty database; "
                          f"a training run fills it)")


def connect(cfg: TrackingConfig | None = None, existing: bool = False) -> Any:
    """An MlflowClient on the tracking store, mlflow pointed at it, the store opened (once a
    process). A store MLflow refuses (an unknown scheme, the file store MLflow 3 no longer
    opens, a file that is not a database), or a server that does not answer within REACH_S,
    is a ConfigError naming the URI and where it came from, not MLflow's traceback (or a
    silent wait of minutes). A SQLite file of another program is refused, left untouched;
    `existing` (a command that only reads or moves aliases): a store that is not there yet
    too, rather than created."""
    import mlflow
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    uri = tracking_uri(cfg)
    mlflow.set_tracking_uri(uri)
    if uri in _opened:
        return mlflow.MlflowClient()
    if uri.startswith(("http://", "https://")):
        _reachable(uri)
    _check_sqlite(uri, existing)
    try:
        client = mlflow.MlflowClient()
        client.search_experiments(max_results=1)  # opens the store now, not mid-stage
    except MlflowException as e:
        first = str(e.message).strip().split(". ")[0]
        raise ConfigError(f"{_store(uri)}: {first}. Use e.g. sqlite:///mlflow.db or an "
                          f"http:// server") from None
    except SQLAlchemyError as e:
        raise ConfigError(f"{_store(uri)}: cannot be opened ({_first_line(e.orig or e)})"
                          ) from None
    except ModuleNotFoundError as e:  # a database's driver (postgresql: psycopg2)
        raise ConfigError(f"{_store(uri)}: needs the Python module {e.name!r}, not "
                          f"installed here") from None
    _opened.add(uri)
    return client


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
    db = sqlite_file(uri)
    if db is None:
        return None
    folder = db.resolve().parent
    return None if folder == Path.cwd().resolve() else (folder / "mlruns").as_uri()


def _use_experiment(name: str, uri: str) -> None:
    """Make `name` the active experiment, creating it with its artifacts beside a SQLite
    store. MLflow's own default is ./mlruns of whatever folder the creating process runs in,
    so a store used from another folder (a test suite, a flow started elsewhere) scattered
    its models there (the default ./mlflow.db keeps MLflow's own layout)."""
    import mlflow
    from mlflow.exceptions import MlflowException

    root = artifact_root(uri)
    if mlflow.get_experiment_by_name(name) is None:
        try:
            mlflow.create_experiment(name, artifact_location=root,
                                     tags={KIND_TAG: EXPERIMENT_KIND})
        except MlflowException as e:  # another process created it meanwhile: use theirs
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
    exp = mlflow.set_experiment(name)
    if KIND_TAG not in exp.tags:  # a store from before lrm set the kind
        mlflow.MlflowClient().set_experiment_tag(exp.experiment_id, KIND_TAG, EXPERIMENT_KIND)


def _mlflow(cfg: TrackingConfig | None) -> Any:
    """mlflow, pointed at the store and the experiment."""
    import logging

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    import mlflow  # slow import, only where tracking is used

    for noisy in ("mlflow", "alembic"):  # per-run INFO chatter: keep warnings only
        logging.getLogger(noisy).setLevel(logging.WARNING)
    connect(cfg)
    with _writing(tracking_uri(cfg)):
        _use_experiment(_experiment(cfg), tracking_uri(cfg))
    return mlflow


def _experiment(cfg: TrackingConfig | None) -> str:
    """MLFLOW_EXPERIMENT_NAME wins over params.yaml's tracking.experiment."""
    return os.environ.get("MLFLOW_EXPERIMENT_NAME") or (cfg or TrackingConfig()).experiment


def _params(params: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(v)[:6000] for k, v in _flatten(params).items()}


@contextlib.contextmanager
def run(name: str, params: Mapping[str, Any] | None = None, cfg: TrackingConfig | None = None,
        tags: Mapping[str, str] | None = None, parent: str | None = None) -> Iterator[Any]:
    """Start an MLflow run named `name` with flattened `params`; yields the active run.

    Nested under the active run when there is one (a flow's parent run), else under run
    `parent` when given (a `dvc repro`'s, see `parent_run`).
    """
    mlflow = _mlflow(cfg)
    nested = mlflow.active_run() is not None
    owner = {PID_TAG: str(os.getpid()), HOST_TAG: socket.gethostname()}  # close_dead_runs
    with _writing(tracking_uri(cfg)):
        active = mlflow.start_run(run_name=name, nested=nested,
                                  tags={**owner, **dict(tags or {})},
                                  parent_run_id=None if nested else parent)
    with active:
        if params:
            with _writing(tracking_uri(cfg)):
                mlflow.log_params(_params(params))
        yield active


@contextlib.contextmanager
def child_run(name: str, params: Mapping[str, Any] | None = None) -> Iterator[Any]:
    """A run nested under the active one, in its store and experiment (a tuning run's
    trial); yields it, or None where no run is active (nothing is logged then)."""
    if not active():
        yield None
        return
    import mlflow

    with mlflow.start_run(run_name=name, nested=True,
                          tags={PID_TAG: str(os.getpid()), HOST_TAG: socket.gethostname()}
                          ) as child:
        if params:
            mlflow.log_params(_params(params))
        yield child


def close_dead_runs(cfg: TrackingConfig | None = None) -> list[str]:
    """Close as KILLED the runs of this experiment left RUNNING by a process of this host
    that is gone (a killed stage or stream day: MLflow cannot end a run its process never
    ended); returns their ids. Runs of live processes, and of other hosts, are left."""
    import mlflow

    cfg = cfg or TrackingConfig()
    client = connect(cfg)
    exp = mlflow.get_experiment_by_name(os.environ.get("MLFLOW_EXPERIMENT_NAME")
                                        or cfg.experiment)
    if exp is None:
        return []
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


def parent_run(name: str, key: tuple[str, str], params: Mapping[str, Any],
               cfg: TrackingConfig | None = None, tags: Mapping[str, str] | None = None
               ) -> str:
    """The id of the run tagged `key` (tag, value), made (named `name`, with `params` and
    `tags`) when there is none yet: the parent of one pipeline run's stage runs, where
    each stage is a process of its own (`dvc repro`)."""
    mlflow = _mlflow(cfg)
    client = mlflow.MlflowClient()
    exp = mlflow.get_experiment_by_name(_experiment(cfg))
    found = client.search_runs([exp.experiment_id],
                               f"tags.`{key[0]}` = '{key[1]}'", max_results=1)
    if found:
        return found[0].info.run_id
    made = client.create_run(exp.experiment_id, run_name=name, tags={key[0]: key[1],
                                                                      **(tags or {})})
    from mlflow.entities import Param

    client.log_batch(made.info.run_id,
                     params=[Param(k, v) for k, v in _params(params).items()])
    return made.info.run_id


def set_status(run_id: str, status: str) -> None:
    """RUNNING while one of its stages runs, FINISHED or FAILED after it."""
    import mlflow

    client = mlflow.MlflowClient()
    if status == "RUNNING":
        client.update_run(run_id, status=status)
    else:
        client.set_terminated(run_id, status)


def active() -> bool:
    """Whether an MLflow run is active in this process (a stage run, on rank 0)."""
    import sys

    if "mlflow" not in sys.modules:  # no run can be active without mlflow imported
        return False
    import mlflow

    return mlflow.active_run() is not None


def active_run_id() -> str | None:
    """The id of the MLflow run active in this thread, or None (what a worker process's
    runs nest under: lrm.tracking.run's `parent`)."""
    if not active():
        return None
    import mlflow

    return mlflow.active_run().info.run_id


def constant(key: str) -> bool:
    """Whether a reported number describes the run (the day scored, an interval's level)
    rather than measures it: `eval.ci_level`, `eval_ci_level`, `student.day`,
    `schedule.steps`."""
    leaf = re.split(r"[./]", key)[-1]
    return leaf in CONSTANTS or leaf.removeprefix("eval_") in CONSTANTS or \
        key.startswith("schedule.")


def _numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in _flatten(metrics).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def log_metrics(metrics: Mapping[str, float], step: int | None = None) -> None:
    """Log numeric metrics to the active run (non-numbers and constants are skipped; no
    run: nothing)."""
    if not active():
        return
    import mlflow

    clean = {k: v for k, v in _numbers(metrics).items() if not constant(k)}
    if clean:
        mlflow.log_metrics(clean, step=step)


def _series_name(key: str) -> str:
    """The name a training series carries for a result's key (eval.ne -> eval_ne,
    validation.best_ne -> val_best_ne)."""
    return re.sub(r"^validation\.", "val_", key).replace(".", "_")


def log_result(metrics: Mapping[str, Any]) -> None:
    """A stage's result on the active run: each number once (not again when the run has it
    as a series already), the constants as tags."""
    if not active():
        return
    import mlflow

    numbers = _numbers(metrics)
    have = set(mlflow.get_run(mlflow.active_run().info.run_id).data.metrics)
    tags = {k: str(int(v)) if v.is_integer() else repr(v)
            for k, v in numbers.items() if constant(k)}
    if tags:
        mlflow.set_tags(tags)
    new = {k: v for k, v in numbers.items()
           if not constant(k) and k not in have and _series_name(k) not in have}
    if new:
        mlflow.log_metrics(new)


def log_headline(metrics: Mapping[str, Any]) -> None:
    """Numbers of the active run's parent (a pipeline run's headline): nothing without one."""
    if not active():
        return
    import mlflow

    parent = mlflow.get_run(mlflow.active_run().info.run_id).data.tags.get(PARENT_TAG)
    numbers = {k: v for k, v in _numbers(metrics).items() if not constant(k)}
    if parent and numbers:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        mlflow.MlflowClient().log_batch(parent, metrics=[Metric(k, v, now, 0)
                                                         for k, v in numbers.items()])
