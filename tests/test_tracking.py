"""lrm.tracking: a run's artifacts stay with its SQLite store, wherever the run starts."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest

from lrm import tracking


def _log_from(folder: Path, store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(folder)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)  # the params' "lrm"
    with tracking.run("probe"):
        mlflow.log_text("logged", "note.txt")


def test_artifacts_go_beside_a_store_used_from_another_folder(tmp_path, monkeypatch):
    (tmp_path / "store").mkdir()
    (tmp_path / "work").mkdir()
    _log_from(tmp_path / "work", tmp_path / "store" / "mlflow.db", monkeypatch)
    _log_from(tmp_path / "work", tmp_path / "store" / "mlflow.db", monkeypatch)  # it exists now
    notes = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("note.txt"))
    assert len(notes) == 2 and all(p.parts[:2] == ("store", "mlruns") for p in notes), notes
    assert not any((tmp_path / "work").iterdir())  # nothing left where the runs started


def test_a_store_in_this_folder_keeps_mlflows_own_layout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert tracking.artifact_root("sqlite:///mlflow.db") is None  # ./mlruns/<experiment id>
    assert tracking.artifact_root(f"sqlite:///{tmp_path}/mlflow.db") is None
    assert tracking.artifact_root(f"sqlite:///{tmp_path}/a/mlflow.db") == \
        (tmp_path / "a" / "mlruns").as_uri()
    assert tracking.artifact_root("http://127.0.0.1:5000") is None  # a server has its own
    assert tracking.artifact_root("sqlite:///:memory:") is None
    _log_from(tmp_path, tmp_path / "mlflow.db", monkeypatch)
    (note,) = tmp_path.rglob("note.txt")
    experiment = mlflow.get_experiment_by_name("lrm")
    assert note.relative_to(tmp_path).parts[:2] == ("mlruns", experiment.experiment_id)


def test_runs_left_running_by_a_dead_process_are_closed_as_killed(tmp_path, monkeypatch):
    """A SIGKILLed stage or stream day cannot end its MLflow run; the next run closes it.
    Runs of a live process or of another host are left as they are."""
    import os
    import socket
    import subprocess
    import sys

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    with tracking.run("first") as r:  # the experiment, and a run tagged with this process
        assert r.data.tags[tracking.PID_TAG] == str(os.getpid())
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    client = mlflow.MlflowClient()
    exp = mlflow.get_experiment_by_name("lrm").experiment_id
    host = socket.gethostname()
    runs = {name: client.create_run(exp, tags={tracking.PID_TAG: pid, tracking.HOST_TAG: h},
                                    run_name=name).info.run_id
            for name, pid, h in (("killed", dead, host), ("alive", str(os.getpid()), host),
                                 ("elsewhere", dead, "another-host"))}
    assert tracking.close_dead_runs() == [runs["killed"]]
    status = {n: client.get_run(i).info.status for n, i in runs.items()}
    assert status == {"killed": "KILLED", "alive": "RUNNING", "elsewhere": "RUNNING"}


@pytest.mark.parametrize("uri", ["file:///{tmp}/mlruns", "bogus://{tmp}"])
def test_a_store_mlflow_refuses_is_one_line_and_exit_2(uri, tmp_path, monkeypatch):
    """MLflow 3 no longer opens a ./mlruns file store; an unknown scheme has no store. The
    user sees the URI, where it came from and what works, not MLflow's traceback."""
    import subprocess
    import sys

    from lrm.errors import ConfigError

    uri = uri.format(tmp=tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with pytest.raises(ConfigError, match="tracking.uri"), tracking.run("probe"):
        pass
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(f"tracking:\n  uri: {uri}\n")
    lrm = Path(sys.executable).parent / "lrm"
    done = subprocess.run([str(lrm), "models", "list"], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr[-2000:]
    assert uri in done.stderr and "tracking.uri" in done.stderr and "Traceback" not in \
        done.stderr, done.stderr[-2000:]


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nobody listens there once closed


@pytest.mark.parametrize("case", ["not a database", "read-only", "no server", "no driver",
                                  "a folder"])
def test_a_store_that_cannot_be_opened_is_one_line_naming_it_in_bounded_time(
        case, tmp_path, monkeypatch):
    """The issue-45 probe: a SQLite file that is not a database (DatabaseError) and one on
    a read-only mount (OperationalError at the first write) were tracebacks; a server that
    is not there (`http://127.0.0.1:9`) hung past 120 s printing nothing. Red with the
    SQLAlchemy errors not caught (first two) or the reachability check dropped (the
    third: MLflow retries for minutes); the ops probe's missing driver, with
    ModuleNotFoundError not caught."""
    import time

    from lrm.errors import ConfigError

    if case == "not a database":
        (tmp_path / "m.db").write_text("not a database, a note")
        uri, says = f"sqlite:///{tmp_path}/m.db", "cannot be opened (file is not a database)"
    elif case == "read-only":  # (root ignores file modes: SQLite's own read-only mode)
        mlflow.MlflowClient(f"sqlite:///{tmp_path}/m.db").search_experiments()
        uri = f"sqlite:///file:{tmp_path}/m.db?mode=ro&uri=true"
        says = "cannot write to it ((sqlite3.OperationalError) attempt to write a readonly"
    elif case == "no server":
        uri = f"http://127.0.0.1:{_closed_port()}"
        says = f"no answer within {tracking.REACH_S:g} s"
    elif case == "a folder":  # the ops probe: MLflow retried for 1m45s, then the error
        uri, says = f"sqlite:///{tmp_path}", f"{tmp_path} is a folder, not a SQLite file"
    else:  # the ops probe: ModuleNotFoundError's traceback (postgresql://: psycopg2)
        import importlib.util

        if importlib.util.find_spec("MySQLdb") is not None:
            pytest.skip("mysqlclient is installed here")
        uri, says = f"mysql://x@127.0.0.1:{_closed_port()}/db", "needs the Python module "
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as e, tracking.run("probe"):
        pass
    assert f"tracking store {uri!r} (params tracking.uri" in str(e.value) and \
        says in str(e.value) and "\n" not in str(e.value)
    assert time.monotonic() - t0 < 4 * tracking.REACH_S  # not MLflow's minutes of retries


def test_a_sqlite_file_of_another_program_is_refused_and_left_as_it_is(tmp_path, monkeypatch):
    """The ops probe: MLflow added its tables into another program's SQLite database, then
    went on as if it were a store. Red with `_check_sqlite` dropped from `connect`."""
    import hashlib
    import sqlite3

    from lrm.errors import ConfigError

    db = tmp_path / "app.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE orders (id INTEGER)")
    con.close()
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    uri = f"sqlite:///{db}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with pytest.raises(ConfigError) as e, tracking.run("probe"):
        pass
    assert f"tracking store {uri!r}" in str(e.value) and \
        "is a SQLite database but not an MLflow store (tables orders)" in str(e.value)
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


@pytest.mark.parametrize("case", ["missing", "empty", "in memory"])
def test_lrm_models_on_a_store_that_is_not_there_is_exit_2_and_creates_nothing(
        case, tmp_path):
    """The ops probe: `lrm models list` on a mistyped URI created the folder and a fresh
    store and said "no registered lrm models yet" (rc 0), as it did of sqlite:// (a store
    in memory); rollback said "has no version". Red with `existing=True` dropped from
    flows/cli.py's `_cfg`."""
    import os
    import subprocess
    import sys

    db = tmp_path / "typo" / "mlflow.db"
    if case == "empty":
        db.parent.mkdir()
        db.touch()
    says = {"missing": "does not exist (mistyped?", "empty": "holds no MLflow store",
            "in memory": "an in-memory store holds nothing between commands"}[case]
    uri = "sqlite://" if case == "in memory" else f"sqlite:///{db}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    lrm = Path(sys.executable).parent / "lrm"
    done = subprocess.run([str(lrm), "models", "list"], capture_output=True, text=True,
                          env=env, cwd=tmp_path)
    assert done.returncode == 2 and says in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    made = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert made == ([] if case != "empty" else ["typo", "typo/mlflow.db"])
    assert case != "empty" or db.stat().st_size == 0
