"""The streaming flow as a Prefect deployment on a cron schedule: `lrm serve` (flows/cli.py).

`serve` creates (or updates) the deployment `lrm-streaming/lrm-streaming` with the cron
schedule of `streaming.cron` (or --cron) and then runs its scheduled and manually triggered
runs in this process until stopped (Prefect's `flow.serve`: no work pool or worker to set
up). With `prefect server start` on 127.0.0.1 and PREFECT_API_URL pointing at it, the UI
shows the deployment, its schedule, its runs and each day's report artifact.

pause_on_shutdown=True, on purpose: this process is the only one that executes the runs,
so when it stops, the schedule is paused rather than left piling up Late runs nobody will
start; `lrm serve` again resumes it, and since each run processes the next days not yet
done, nothing is lost in between. (A deployment on a GPU work pool, see the README, runs
without this process and is not paused by it.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect.types.entrypoint import EntrypointType

from flows.streaming import settings, streaming
from lrm.errors import ConfigError

DEPLOYMENT = "lrm-streaming"


def parameters(params: list[str] | None, root: str | None, days: int | None) -> dict[str, Any]:
    """The deployment's default run parameters (absolute params paths: runs start elsewhere)."""
    out: dict[str, Any] = {}
    if params:
        out["params"] = [str(Path(p).resolve()) for p in params]
    if root:
        out["root"] = str(Path(root).resolve())
    if days:
        out["days"] = days
    return out


def serve(cron: str | None = None, params: list[str] | None = None, root: str | None = None,
          days: int | None = None, name: str = DEPLOYMENT) -> None:
    """Serve the streaming flow on its cron schedule until stopped (Ctrl-C or SIGTERM)."""
    cfg, _ = settings(params, root)
    schedule = cron or cfg.streaming.cron
    if len(schedule.split()) != 5:
        raise ConfigError(f"--cron: {schedule!r} is not a 5-field cron expression")
    streaming.serve(name=name, cron=schedule, parameters=parameters(params, root, days),
                    description=f"lrm streaming retraining: the next days of "
                                f"{cfg.streaming.root} ({cfg.streaming.source}), "
                                f"cron {schedule!r}",
                    tags=["lrm", "streaming"], pause_on_shutdown=True, limit=1,
                    # "flows.streaming.streaming": importable wherever lrm is installed
                    entrypoint_type=EntrypointType.MODULE_PATH)
