"""`make ui`: MLflow's UI on the local store, its address printed only once the server is
warm (`python -m lrm.mlflow_ui [--store URI] [--port N]`).

Why not plain `mlflow ui`: MLflow 3.17's server has a race on its first requests. A GraphQL
request imports mlflow.server.auth (mlflow/server/handlers.py:4082, whose import fails later
for want of Flask-WTF, but only after it has imported mlflow/server/auth/db/models.py). The
first registry request imports mlflow/store/model_registry/sqlalchemy_store.py (handlers.py
:775 -> :565), whose line 92 calls SQLAlchemy's `configure_mappers()`, which configures every
declarative registry, the auth models' included. If that runs in one request thread while
another is between the SqlUser and the SqlUserRoleAssignment classes of the auth models,
the registry request is answered 500:

    sqlalchemy.exc.InvalidRequestError: When initializing mapper Mapper[SqlUser(users)],
    expression 'SqlUserRoleAssignment.user_id' failed to locate a name ...

and SQLAlchemy keeps the failure on the mapper: every later registry request that reaches
that server process is answered 500 too ("One or more mappers failed to initialize", same
line). A browser's first page fires its requests at once, so a user could meet it.

So the server runs one worker (`mlflow ui` starts 4 uvicorn worker processes, each with its
own imports, and a request cannot choose its worker), and before the address is printed one
GraphQL request, alone, completes the import of the auth models, then one registry search,
alone, configures the mappers. No later `configure_mappers()` can then meet half of the
auth models: the race cannot happen after the warm-up (tests/test_mlflow_ui.py holds its
window open to check that).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import typer

from lrm import tracking
from lrm.config import TrackingConfig
from lrm.errors import LrmError

HOST = "127.0.0.1"
STORE = TrackingConfig().uri  # the local store the stages track to by default
PORT = 5000
START_TIMEOUT_S = 180.0  # a first start migrates a new store: seconds on a loaded machine
STOP_TIMEOUT_S = 90.0  # a clean stop takes ~4 s idle; past 30 s under a loaded 2-core suite
# what the warm-up asks, in this order, one at a time: the GraphQL endpoint (its handler
# imports mlflow.server.auth, so the auth models), then the model registry (its store's
# import configures SQLAlchemy's mappers)
GRAPHQL = "/graphql"
REGISTRY = "/ajax-api/2.0/mlflow/registered-models/search?max_results=1"


class UiError(LrmError):
    """The MLflow server did not start, or did not answer its warm-up."""


def command(store: str = STORE, port: int = PORT) -> list[str]:
    """`mlflow ui` on `store`, bound to 127.0.0.1, one worker (see the module's docstring)."""
    return [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store,
            "--host", HOST, "--port", str(port), "--workers", "1"]


def _ask(url: str, body: dict | None = None, timeout: float = 60) -> int:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def wait_ready(base: str, proc: subprocess.Popen, timeout: float = START_TIMEOUT_S) -> None:
    """Poll `base`/health until it answers 200; UiError if `proc` exits first or time runs
    out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if _ask(f"{base}/health", timeout=5) == 200:
                return
        except OSError:
            pass
        if proc.poll() is not None:
            raise UiError(f"the MLflow server exited with status {proc.returncode} before "
                          f"it answered at {base}")
        if time.monotonic() > deadline:
            raise UiError(f"the MLflow server did not answer at {base} within {timeout:.0f} s")
        time.sleep(0.2)


def warm_up(base: str) -> None:
    """The requests that take the server past MLflow's mapper race, one at a time."""
    for what, path, body in (("GraphQL", GRAPHQL, {"query": "{ __typename }"}),
                             ("model registry", REGISTRY, None)):
        try:
            status: int | str = _ask(f"{base}{path}", body)
        except OSError as e:
            status = str(e)
        if status != 200:
            raise UiError(f"the MLflow server answered {status} to its first {what} request")


@contextlib.contextmanager
def running(store: str = STORE, port: int = PORT, timeout: float = START_TIMEOUT_S,
            **popen: Any) -> Iterator[subprocess.Popen]:
    """The MLflow server, answering and warmed up (`popen`: Popen's keywords: stdout, env,
    cwd...), in its own session: a Ctrl-C in the terminal reaches this process, which
    stops the server (`_stop`) when the block ends, however it ends."""
    with socket.socket() as s:  # or the readiness check would ask the server already there
        try:
            s.bind((HOST, port))
        except OSError as e:
            raise UiError(f"port {port} of {HOST} is taken (another `make ui`?): {e}") from None
    proc = subprocess.Popen(command(store, port), start_new_session=True, **popen)
    try:
        base = f"http://{HOST}:{port}"
        wait_ready(base, proc, timeout)
        warm_up(base)
        yield proc
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    """SIGINT to `mlflow ui`, as a Ctrl-C (it stops its uvicorn worker and job runner, and
    exits 0); SIGKILL to what is left of its process group STOP_TIMEOUT_S later, or at once on a
    second Ctrl-C. Not SIGINT to the whole group: the uvicorn worker, signalled twice (by the
    group and by `mlflow ui`), stops with a traceback."""
    try:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(STOP_TIMEOUT_S)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        pass
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # only stragglers, after a clean stop
        proc.wait()


def _status(rc: int) -> int:
    return 128 - rc if rc < 0 else rc  # killed by a signal: the shell's 128 + N


def serve(store: str = STORE, port: int = PORT) -> int:
    """Run the server until it stops or Ctrl-C / SIGTERM stops it; its exit status."""
    # SIGTERM (a supervisor, `kill`) stops the server as Ctrl-C does
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    proc = None
    try:
        # the server writes its log to the terminal; in its own session, a Ctrl-C reaches
        # it through this process (`running` stops it)
        with running(store, port) as proc:
            print(f"MLflow UI: {tracking.ui_url(f'http://{HOST}:{port}')}", flush=True)
            return _status(proc.wait())
    except UiError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # `running` has stopped the server: its status, if it has one
        return _status(proc.returncode) if proc is not None and proc.returncode is not None \
            else 130


def main(store: str = typer.Option(STORE, "--store", help="the MLflow backend store URI"),
         port: int = typer.Option(PORT, "--port", help="the port on 127.0.0.1")) -> None:
    """MLflow's UI on the local store, its address printed once the server is warm."""
    raise typer.Exit(serve(store, port))


if __name__ == "__main__":
    typer.run(main)
