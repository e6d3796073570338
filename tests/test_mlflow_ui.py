"""lrm.mlflow_ui (`make ui`): once it says the MLflow server is ready, the server answers
concurrent first requests (MLflow 3.17's mapper race notwithstanding), listens on
127.0.0.1 only, and a Ctrl-C stops it, leaving nothing behind, with its exit status."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from lrm import mlflow_ui, tracking
from tests.conftest import REPO
from tests.flows.test_deployments import _free_port

pytestmark = pytest.mark.slow

RACE = "expression 'SqlUserRoleAssignment.user_id' failed to locate a name"
OPENED = "lrm test: the mapper race's window is open"
WIDE_S = 5.0
# The race's window is the time mlflow/server/auth/db/models.py takes from its SqlUser class
# to its SqlUserRoleAssignment class: a few ms, which a test meets too rarely to tell a
# server that was warmed up from one that was not. The server's processes import this
# sitecustomize, which holds that window open WIDE_S seconds (a sleep before the SqlRole
# class, which comes between the two) and says so in the server's log: a registry request
# that comes meanwhile is answered 500, unless the warm-up went through the window before.
SITECUSTOMIZE = f"""
import importlib.machinery, sys, time


def hold():
    print({OPENED!r}, file=sys.stderr, flush=True)
    time.sleep({WIDE_S!r})


class _Loader(importlib.machinery.SourceFileLoader):
    def get_code(self, fullname):
        src = self.get_data(self.path).decode()
        anchor = "\\nclass SqlRole(Base):"
        if anchor not in src:
            raise ImportError("lrm test: no SqlRole class in " + self.path)
        src = src.replace(anchor, "\\n__import__('sitecustomize').hold()" + anchor, 1)
        return compile(src, self.path, "exec", dont_inherit=True)


class _Finder:
    def find_spec(self, name, path=None, target=None):
        if name != "mlflow.server.auth.db.models":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        spec.loader = _Loader(name, spec.origin)
        return spec


sys.meta_path.insert(0, _Finder())
"""


def _ask(base: str, what: str) -> int | str:
    if what == "graphql":
        req = urllib.request.Request(f"{base}/graphql", headers={
            "Content-Type": "application/json"}, data=json.dumps({"query": "{ __typename }"})
            .encode())
    else:
        req = urllib.request.Request(
            f"{base}/ajax-api/2.0/mlflow/registered-models/search?max_results=10")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError as e:
        return repr(e)


def _wide_window_env(tmp: Path) -> dict[str, str]:
    site = tmp / "wide-window"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_for(check, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_first_concurrent_requests_succeed_once_it_is_ready(tmp_path):
    """A browser's first page: GraphQL and registry requests at once. Without the warm-up
    the first GraphQL request opens the window and the registry requests that come while it
    is open are answered 500 (the race's line in the log); with it, all are served."""
    port, log = _free_port(), tmp_path / "mlflow-ui.log"
    base = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out, mlflow_ui.running(
            f"sqlite:///{tmp_path}/mlflow.db", port, stdout=out, stderr=subprocess.STDOUT,
            env=_wide_window_env(tmp_path), cwd=tmp_path) as proc:
        opened_before = log.read_text(errors="replace").count(OPENED)
        listening = {c.laddr.ip for c in psutil.net_connections("inet")
                     if c.laddr.port == port and c.status == psutil.CONN_LISTEN}
        got: dict[str, int | str] = {}

        def ask(key: str, what: str) -> None:
            got[key] = _ask(base, what)

        graphql = [threading.Thread(target=ask, args=(f"graphql {i}", "graphql"))
                   for i in range(8)]
        for t in graphql:
            t.start()
        # the registry requests while the window is open, if a GraphQL request opens it
        _wait_for(lambda: log.read_text(errors="replace").count(OPENED) > opened_before
                  or not any(t.is_alive() for t in graphql), 60)
        registry = [threading.Thread(target=ask, args=(f"registry {i}", "registry"))
                    for i in range(8)]
        for t in registry:
            t.start()
        for t in graphql + registry:
            t.join()
        later = _ask(base, "registry")  # a server the race broke answers 500 from then on
        assert proc.poll() is None
    served = log.read_text(errors="replace")
    failed = {k: v for k, v in got.items() if v != 200}
    assert not failed and later == 200, (f"answered {failed}, later {later}; the race "
                                         f"{served.count(RACE)} times\n{served[-3000:]}")
    assert RACE not in served
    # the window opened once, before the server was said to be ready: the warm-up's doing
    assert opened_before == 1 and served.count(OPENED) == 1, served[-3000:]
    assert listening == {"127.0.0.1"}, listening


def test_make_ui_prints_the_address_when_ready_and_stops_on_ctrl_c(tmp_path):
    """`make ui`'s command: the address of the training runs, printed when the server
    answers; a Ctrl-C (SIGINT to it, the server being in its own session) stops the server
    and its processes, and the command exits with the server's status (0)."""
    port, log = _free_port(), tmp_path / "mlflow-ui.log"
    base = f"http://127.0.0.1:{port}"
    with open(log, "wb") as err:
        ui = subprocess.Popen([sys.executable, "-m", "lrm.mlflow_ui", "--store",
                               f"sqlite:///{tmp_path}/mlflow.db", "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=err, text=True, cwd=tmp_path,
                              start_new_session=True)
        server: list[psutil.Process] = []
        try:
            out: list[str] = []  # its output (the server's too: they share the terminal)
            printed = threading.Event()

            def read() -> None:
                for line in ui.stdout:
                    out.append(line)
                    if line.startswith("MLflow UI:"):
                        printed.set()

            threading.Thread(target=read, daemon=True).start()
            ready = printed.wait(240)
            server = psutil.Process(ui.pid).children(recursive=True)
            assert ready, f"{out}\n{log.read_text(errors='replace')[-3000:]}"
            assert f"MLflow UI: {tracking.ui_url(base)}\n" in out, out
            assert _ask(base, "registry") == 200  # ready when it says so
            assert server, "no server process"
            ui.send_signal(signal.SIGINT)
            rc = ui.wait(mlflow_ui.STOP_TIMEOUT_S + 60)
        finally:  # on a failure, nothing left behind either (the server has its own session)
            if ui.poll() is None:
                ui.send_signal(signal.SIGINT)
                try:
                    ui.wait(60)
                except subprocess.TimeoutExpired:
                    ui.kill()
                    ui.wait()
            # killed processes take a moment to go (status running, cmdline empty): wait
            left = [p for p in psutil.wait_procs(server, timeout=30)[1] if _alive(p)]
            for p in left:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()
    said = log.read_text(errors="replace")
    assert rc == 0, said[-3000:]
    assert not left, [" ".join(p.cmdline())[:120] for p in left]
    assert isinstance(_ask(base, "registry"), str)  # refused: nothing listens there
    assert "Traceback" not in said, said[-3000:]


def test_a_taken_port_is_said_at_once(tmp_path):
    """Another server on the port (an earlier `make ui`): an error naming the port, not a
    readiness check answered by that other server."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(mlflow_ui.UiError, match=f"port {port} .* is taken"), \
                mlflow_ui.running(f"sqlite:///{tmp_path}/mlflow.db", port):
            pass


def test_make_ui_runs_it():
    recipe = re.search(r"^ui:.*\n((?:\t.*\n)+)", (REPO / "Makefile").read_text(), re.M)
    assert recipe and "-m lrm.mlflow_ui" in recipe.group(1), recipe
