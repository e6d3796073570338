"""The deployment in the Prefect UI, seen through a real browser.

A Prefect server started here on 127.0.0.1 (a free port, its own PREFECT_HOME), `lrm serve`
in its own process (the streaming flow as a deployment with a cron schedule, tiny params), a
run triggered by hand and completed, then headless Chromium (Debian's package, installed here
when missing) opens the UI: the deployment, its schedule and the completed run are on its
page, the day's report is on the artifact's page; screenshots are saved. Stopping `lrm
serve` pauses the schedule (pause_on_shutdown). Every process is bounded in time and
stopped. Chromium is driven through its DevTools protocol (a websocket; nothing to
download).
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.flows.test_streaming import _write_params

pytestmark = pytest.mark.slow
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1400,1000"]
CRON = "0 3 * * *"  # not streaming.cron: the --cron option wins


def chromium() -> str:
    """Debian's Chromium, installed with apt-get when missing (or a skip saying why not)."""
    for name in ("chromium", "chromium-browser"):
        if found := shutil.which(name):
            return found
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        pytest.skip("Chromium is not installed and cannot be installed here (this test "
                    "installs Debian's `chromium` with apt-get, which needs root)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]
    r = subprocess.run(install, env=env, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:  # stale package lists: refresh them once
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, timeout=600)
        r = subprocess.run(install, env=env, capture_output=True, text=True, timeout=900)
    found = shutil.which("chromium")
    if r.returncode != 0 or found is None:
        pytest.skip(f"Chromium could not be installed with apt-get: {r.stderr[-500:]}")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, body: dict | None = None, timeout: float = 10, tries: int = 5) -> object:
    """GET (or POST `body`) as JSON. A 503 is retried, as Prefect's own client does: the
    server answers it while SQLite is locked by another writer (seen once in a CI run,
    right after the deployment registered, while the runner polled)."""
    data = None if body is None else json.dumps(body).encode()
    for attempt in range(tries):
        req = urllib.request.Request(url, data=data,
                                     headers={"Content-Type": "application/json"})
        try:
            return json.loads(urllib.request.urlopen(req, timeout=timeout).read() or b"null")
        except urllib.error.HTTPError as e:
            if e.code != 503 or attempt == tries - 1:
                raise
            time.sleep(float(e.headers.get("Retry-After") or 1))
    raise AssertionError("unreachable")


def _wait(what: str, check, timeout: float, proc: subprocess.Popen | None = None,
          log: Path | None = None):
    """Poll `check()` until it returns something truthy; fail saying what, with the log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = check()
        except OSError:
            got = None
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(1)
    tail = log.read_text()[-3000:] if log is not None and log.exists() else ""
    pytest.fail(f"{what}: not within {timeout:.0f} s\n{tail}")


@contextmanager
def _process(args: list[str], log: Path, stop: int = signal.SIGTERM, **kw
             ) -> Iterator[subprocess.Popen]:
    """A process in its own group, its output in `log`; sent `stop` at exit (SIGKILL if it
    is still there 30 s later)."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, **kw)
        try:
            yield proc
        finally:
            for sig, wait in ((stop, 30), (signal.SIGKILL, 10)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue


class Browser:
    """Headless Chromium on one page, driven through the DevTools protocol."""

    def __init__(self, ws_url: str) -> None:
        from websockets.sync.client import connect

        self.ws = connect(ws_url, max_size=64 << 20, open_timeout=30)
        self.ids = itertools.count(1)

    def call(self, method: str, **params: object) -> dict:
        i = next(self.ids)
        self.ws.send(json.dumps({"id": i, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def text(self) -> str:
        r = self.call("Runtime.evaluate", expression="document.body.innerText",
                      returnByValue=True)
        return r.get("result", {}).get("value") or ""

    def open(self, url: str, *needles: str, timeout: float = 60) -> str:
        """Go to `url` and wait until the rendered page shows every needle."""
        self.call("Page.navigate", url=url)
        seen = {"text": ""}

        def shows() -> str | None:
            seen["text"] = t = self.text()
            return t if all(n in t for n in needles) else None

        try:
            return _wait(f"{url} showing {needles}", shows, timeout)
        except pytest.fail.Exception as e:
            raise AssertionError(f"{e}\nthe page shows: {seen['text'][-1500:]!r}") from None

    def screenshot(self, path: Path) -> Path:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot",
                                                    format="png")["data"]))
        return path


@contextmanager
def browser(binary: str, home: Path) -> Iterator[Browser]:
    profile = home / "chromium-profile"  # a fresh profile every time
    with _process([binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                   "--remote-debugging-port=0", "about:blank"], home / "chromium.log") as p:
        port_file = profile / "DevToolsActivePort"
        _wait("Chromium's DevTools port", port_file.is_file, 60, p, home / "chromium.log")
        port = int(port_file.read_text().split()[0])
        pages = _wait("a Chromium page", lambda: [t for t in _get(
            f"http://127.0.0.1:{port}/json/list") if t["type"] == "page"], 30)
        b = Browser(pages[0]["webSocketDebuggerUrl"])
        try:
            yield b
        finally:
            b.ws.close()


def _png_has_content(path: Path) -> bool:
    import matplotlib.image

    img = matplotlib.image.imread(path)
    return img.shape[0] > 500 and float(img.std()) > 0.02


def test_the_ui_shows_the_deployment_its_schedule_and_a_completed_run(tmp_path):
    binary = chromium()
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_API_URL": api,
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_RUNNER_POLL_FREQUENCY": "1",
           "PREFECT_LOGGING_LEVEL": "INFO", "PYTHONPATH": str(REPO),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}
    env.pop("PREFECT_API_KEY", None)
    params = _write_params(tmp_path)
    server_log, serve_log = tmp_path / "server.log", tmp_path / "serve.log"
    with _process([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                   "--port", str(port)], server_log, env=env, cwd=tmp_path) as server:
        _wait("the Prefect server", lambda: _get(f"{api}/health"), 120, server, server_log)
        with _process([sys.executable, "-m", "flows.cli", "serve", "--cron", CRON,
                       "--params", str(params)], serve_log, stop=signal.SIGINT,  # Ctrl-C
                      env=env, cwd=tmp_path) as serve:
            dep = _wait("the deployment", lambda: _get(
                f"{api}/deployments/name/lrm-streaming/lrm-streaming"), 120, serve, serve_log)
            assert [s["schedule"]["cron"] for s in dep["schedules"]] == [CRON]
            assert not dep["paused"]
            run = _get(f"{api}/deployments/{dep['id']}/create_flow_run", {})  # "Run" by hand
            done = _wait("the triggered run to finish", lambda: (
                r := _get(f"{api}/flow_runs/{run['id']}"))["state"]["type"] in
                ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") and r, 300, serve, serve_log)
            assert done["state"]["type"] == "COMPLETED", serve_log.read_text()[-3000:]

            with browser(binary, tmp_path) as b:
                ui = f"http://127.0.0.1:{port}"
                b.open(f"{ui}/deployments", "lrm-streaming")
                page = b.open(f"{ui}/deployments/deployment/{dep['id']}", "1 Flow run",
                              run["name"], "At 03:00 AM every day")
                assert "Completed" in page.split(run["name"], 1)[1]
                shot = b.screenshot(tmp_path / "prefect-deployment.png")
                (art,) = _get(f"{api}/artifacts/filter",
                              {"artifacts": {"key": {"any_": ["lrm-stream-day-1"]}}})
                b.open(f"{ui}/artifacts/artifact/{art['id']}", "lrm stream: day 1",
                       "lrm-student-small", "challenger", "Decisions")
                report = b.screenshot(tmp_path / "prefect-artifact.png")
            print(f"screenshots: {shot} {report}")
            assert _png_has_content(shot) and _png_has_content(report)
        # `lrm serve` stopped: its schedule is paused (pause_on_shutdown), nothing piles up
        paused = _wait("the schedule to pause", lambda: _get(
            f"{api}/deployments/{dep['id']}")["paused"], 30, log=serve_log)
        assert paused
