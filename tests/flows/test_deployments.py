"""The schedule as a user meets it, and the deployment in the Prefect UI through a real
browser.

`prefect server start` on 127.0.0.1 (a free port, its own PREFECT_HOME, started in the repo
so its pyproject.toml settings apply, as they do for a user there), `lrm serve --cron
"* * * * *"` in its own process (the streaming flow as a deployment, tiny params): a run
*created by the schedule* (not by hand) completes a day of the stream within the next
minutes (on SQLAlchemy 2.1 Prefect's scheduler created none). Headless Chromium (Debian's
package, installed here when missing) then finds that run on the deployment's page and the
day's report on the artifact's page; screenshots are saved. Ctrl-C stops `lrm serve`: the
deployment is paused with its schedule off, turns "Not Ready", and no run is left
Scheduled, Late, Pending or Running (the run due next is not left Late); `lrm serve` again
resumes the schedule. Both logs are clean: Prefect's log format (time, level, the task
run's name) and no ERROR line (offline, the server's telemetry logged one every ten
minutes). Every process is bounded in time and stopped. Chromium is driven through its
DevTools protocol (a websocket; nothing to download).
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
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
CRON = "* * * * *"  # every minute, the shortest a cron allows; not streaming.cron: --cron wins
FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")
WAITING = ("SCHEDULED", "PENDING", "RUNNING")  # a stopped `lrm serve` leaves none of these


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
        self.errors: list[str] = []  # the page's exceptions, failed loads and error logs
        self.urls: dict[str, str] = {}  # request id -> URL, to name a request that failed
        self.reloads: list[str] = []  # what each reload of `open(reload_on=...)` saw
        for domain in ("Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")

    def call(self, method: str, **params: object) -> dict:
        i = next(self.ids)
        self.ws.send(json.dumps({"id": i, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if msg.get("method") == "Network.requestWillBeSent":
                self.urls[msg["params"]["requestId"]] = msg["params"]["request"]["url"]
            elif said := _page_error(msg, self.urls):  # kept to explain a failure
                self.errors.append(said)

    def text(self) -> str:
        r = self.call("Runtime.evaluate", expression="document.body.innerText",
                      returnByValue=True)
        return r.get("result", {}).get("value") or ""

    def open(self, url: str, *needles: str, timeout: float = 60,
             reload_on: str | None = None, reloads: int = 2) -> str:
        """Go to `url` and wait until the rendered page shows every needle. Where the page
        shows `reload_on` (an app's "a request failed" view), reload it, as a user would, at
        most `reloads` times for this `url`; `self.reloads` keeps what the page had logged
        before each reload."""
        self.call("Page.navigate", url=url)
        seen = {"text": "", "reloads": 0}

        def shows() -> str | None:
            seen["text"] = t = self.text()
            if reload_on and reload_on in t and seen["reloads"] < reloads:
                seen["reloads"] += 1
                self.reloads.append(f"{url}: {self.errors[-5:]}")
                self.call("Page.reload", ignoreCache=False)
                return None
            return t if all(n in t for n in needles) else None

        try:
            return _wait(f"{url} showing {needles}", shows, timeout)
        except pytest.fail.Exception as e:
            raise AssertionError(f"{e}\nthe page shows: {seen['text'][-1500:]!r}\n"
                                 f"reloaded: {self.reloads}\nthe page logged: "
                                 f"{self.errors[-10:]}") from None

    def screenshot(self, path: Path) -> Path:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot",
                                                    format="png")["data"]))
        return path


def _page_error(msg: dict, urls: dict[str, str]) -> str | None:
    """A DevTools event worth showing when a page does not render: an uncaught exception,
    an error logged by the page, a request that failed or was answered 4xx/5xx."""
    m, p = msg.get("method"), msg.get("params", {})
    if m == "Runtime.exceptionThrown":
        d = p["exceptionDetails"]
        return f"exception: {d.get('exception', {}).get('description') or d.get('text')}"[:500]
    if m == "Log.entryAdded" and p["entry"]["level"] == "error" \
            and p["entry"].get("source") != "network":  # a failed request is said below
        return f"log: {p['entry']['text']}"[:500]
    if m == "Network.loadingFailed":
        why = p.get("errorText") or p.get("blockedReason") or "no answer"
        return f"request failed ({why}): {urls.get(p.get('requestId'), '?')}"[:500]
    if m == "Network.responseReceived" and p["response"]["status"] >= 400:
        return f"HTTP {p['response']['status']}: {p['response']['url']}"[:500]
    return None


@contextmanager
def browser(binary: str, home: Path) -> Iterator[Browser]:
    profile = Path(tempfile.mkdtemp(prefix="chromium-profile-", dir=home))  # fresh each time
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


def _lrm() -> str:
    return str(Path(sys.executable).parent / "lrm")  # the console script a user runs


def _runs(api: str, deployment: str) -> list[dict]:
    """The deployment's flow runs (not their subflows), oldest expected start first."""
    return _get(f"{api}/flow_runs/filter", {
        "sort": "EXPECTED_START_TIME_ASC",
        "deployments": {"id": {"any_": [deployment]}},
        "flow_runs": {"parent_task_run_id": {"is_null_": True}}})


def _switches(b: Browser) -> list[dict]:
    """Every toggle and checkbox on the page: its markup and whether it is on."""
    r = b.call("Runtime.evaluate", returnByValue=True, expression=(
        "Array.from(document.querySelectorAll('input[type=checkbox], [role=switch]'))"
        ".map(e => ({html: e.outerHTML.slice(0, 160), on: e.checked === true || "
        "e.getAttribute('aria-checked') === 'true'}))"))
    return r.get("result", {}).get("value") or []


def test_a_scheduled_run_completes_a_day_and_ctrl_c_stands_the_deployment_down(tmp_path):
    binary = chromium()
    port = _free_port()
    api, ui = f"http://127.0.0.1:{port}/api", f"http://127.0.0.1:{port}"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_API_URL": api,
           "PREFECT_RUNNER_POLL_FREQUENCY": "1", "PREFECT_LOGGING_LEVEL": "INFO",
           "PYTHONPATH": str(REPO), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}
    for k in ("PREFECT_API_KEY", "PREFECT_SERVER_ANALYTICS_ENABLED"):  # the repo's own say
        env.pop(k, None)
    # Prefect's server marks a deployment Not Ready a while after its last poll (60 s by
    # default, checked every 15 s): sooner here, so the test can see it
    server_env = {**env, "PREFECT_SERVER_SERVICES_FOREMAN_LOOP_SECONDS": "2",
                  "PREFECT_SERVER_SERVICES_FOREMAN_DEPLOYMENT_LAST_POLLED_TIMEOUT_SECONDS": "10"}
    params = _write_params(tmp_path)
    server_log, serve_log = tmp_path / "server.log", tmp_path / "serve.log"
    serve_cmd = [_lrm(), "serve", "--cron", CRON, "--params", str(params)]
    with _process([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                   "--port", str(port)], server_log, env=server_env, cwd=REPO) as server:
        _wait("the Prefect server", lambda: _get(f"{api}/health"), 120, server, server_log)
        with _process(serve_cmd, serve_log, stop=signal.SIGINT, env=env, cwd=tmp_path) as serve:
            dep = _wait("the deployment", lambda: _get(
                f"{api}/deployments/name/lrm-streaming/lrm-streaming"), 120, serve, serve_log)
            assert [s["schedule"]["cron"] for s in dep["schedules"]] == [CRON]
            assert not dep["paused"] and all(s["active"] for s in dep["schedules"])
            # the first run the schedule created, once it is over (a minute boundary away,
            # then one tiny day: bounded by three cron periods and the day's own time)
            done = _wait("a run created by the schedule to finish", lambda: [
                r for r in _runs(api, dep["id"])
                if r["auto_scheduled"] and r["state_type"] in FINAL], 420, serve, serve_log)[0]
            assert done["created_by"]["type"] == "SCHEDULE", done["created_by"]
            assert done["expected_start_time"].endswith(":00Z"), done  # on the cron's minute
            assert done["state_type"] == "COMPLETED", serve_log.read_text()[-3000:]
            (day,) = _get(f"{api}/flow_runs/filter", {
                "flow_runs": {"parent_flow_run_id": {"any_": [done["id"]]}}})
            assert day["name"] == "day 1" and day["state_type"] == "COMPLETED"
            assert (tmp_path / "stream" / "reports" / "day=1.md").is_file()
            # Prefect's format, as in `make run`: time, level, the task run's name
            said = serve_log.read_text()
            assert re.search(r"\d\d:\d\d:\d\d\.\d{3} \| INFO +\| Task run 'dedup day 1' - ",
                             said), said[-3000:]
            assert "INFO:prefect" not in said, said[-3000:]

            with browser(binary, tmp_path) as b:
                b.open(f"{ui}/deployments", "lrm-streaming")
                page = b.open(f"{ui}/deployments/deployment/{dep['id']}", done["name"],
                              "Every minute", "Ready")
                assert "auto-scheduled" in page.split(done["name"], 1)[1][:200]
                assert "Completed" in page.split(done["name"], 1)[1][:300]
                assert sum(t["on"] for t in _switches(b)) >= 2  # Schedules, and the cron's
                shot = b.screenshot(tmp_path / "prefect-deployment.png")
                (art,) = _get(f"{api}/artifacts/filter",
                              {"artifacts": {"key": {"any_": ["lrm-stream-day-1"]}}})
                b.open(f"{ui}/artifacts/artifact/{art['id']}", "lrm stream: day 1",
                       "lrm-student-small", "challenger", "Decisions")
                report = b.screenshot(tmp_path / "prefect-artifact.png")
            print(f"screenshots: {shot} {report}")
            assert _png_has_content(shot) and _png_has_content(report)

            os.killpg(serve.pid, signal.SIGINT)  # Ctrl-C
            serve.wait(120)
        after = _get(f"{api}/deployments/{dep['id']}")
        assert after["paused"] and not any(s["active"] for s in after["schedules"]), after

        def left() -> list[tuple[str, str]]:  # runs waiting for the stopped `lrm serve`
            return [(r["name"], r["state_name"]) for r in _runs(api, dep["id"])
                    if r["state_type"] in WAITING]

        assert not left(), left()  # the run due next included: it cannot turn Late
        # the server's status first (its foreman, on a loaded machine, may be late), then
        # the page that reads it
        _wait("the deployment Not Ready", lambda: _get(
            f"{api}/deployments/{dep['id']}")["status"] == "NOT_READY", 180)
        with browser(binary, tmp_path) as b:
            page = b.open(f"{ui}/deployments/deployment/{dep['id']}", "Not Ready",
                          timeout=90)
            on = [t["html"] for t in _switches(b) if t["on"]]
            assert not on, f"toggles still on: {on}\n{page[-1500:]}"
            b.screenshot(tmp_path / "prefect-stopped.png")
        assert not left(), left()  # nor made since (the schedule is off)

        # `lrm serve` again resumes the deployment and its schedule
        with _process(serve_cmd, tmp_path / "serve2.log", stop=signal.SIGINT, env=env,
                      cwd=tmp_path) as serve:
            _wait("the schedule back on", lambda: (d := _get(
                f"{api}/deployments/{dep['id']}")) and not d["paused"] and d["schedules"] and all(
                s["active"] for s in d["schedules"]), 120, serve, tmp_path / "serve2.log")

    assert "INFO:prefect" not in serve_log.read_text()  # to the end
    server_text = server_log.read_text()
    assert "| ERROR" not in server_text, server_text[-3000:]


def test_prefect_run_in_the_repo_sends_no_telemetry():
    """`prefect server start` in the repo (as the README says) reads pyproject.toml's
    [tool.prefect.server]: no telemetry call, which offline logged an ERROR every ten
    minutes ("Failed to send telemetry")."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_SERVER_ANALYTICS_ENABLED"}
    r = subprocess.run([sys.executable, "-m", "prefect", "config", "view", "--show-sources"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert "PREFECT_SERVER_ANALYTICS_ENABLED='False' (from pyproject.toml)" in r.stdout, \
        r.stdout + r.stderr
