"""The streaming flow as a Prefect deployment on a cron schedule: `lrm serve` (flows/cli.py).

`serve` creates (or updates) the deployment `lrm-streaming/lrm-streaming` with the cron
schedule of `streaming.cron` (or --cron) and then runs its scheduled and manually triggered
runs in this process until stopped (Prefect's `flow.serve`: no work pool or worker to set
up). With `prefect server start` on 127.0.0.1 and PREFECT_API_URL pointing at it, the UI
shows the deployment, its schedule, its runs and each day's report artifact.

This process is the only one that executes the runs, so when it stops (Ctrl-C, SIGTERM)
it stands the deployment down (`stand_down`, after Prefect's runner has returned, so that
nothing of it depends on the runner's cancelled event loop): the deployment paused (which
deletes its waiting scheduled runs) with every schedule off, a run that was waiting for
this process (scheduled by hand, pending) cancelled, and a run left running crashed; no
run is left Late for a process that is gone. The run in progress at Ctrl-C is interrupted
(Crashed) and leaves the stream as it was. `lrm serve` again resumes the deployment and
its schedule, and since each run processes the next days not yet done, nothing is lost in
between. Prefect's server marks the deployment "Not Ready" within a minute of its last
poll. (A deployment on a GPU work pool, see the README, runs without this process and is
not stood down by it.)
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from prefect.types.entrypoint import EntrypointType

from flows.streaming import settings, streaming
from lrm.errors import ConfigError

DEPLOYMENT = "lrm-streaming"
log = logging.getLogger("lrm")


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
    try:
        streaming.serve(name=name, cron=schedule, parameters=parameters(params, root, days),
                        description=f"lrm streaming retraining: the next days of "
                                    f"{cfg.streaming.root} ({cfg.streaming.source}), "
                                    f"cron {schedule!r}",
                        tags=["lrm", "streaming"], paused=False, limit=1,
                        pause_on_shutdown=False,  # stand_down does it, and more
                        # "flows.streaming.streaming": importable wherever lrm is installed
                        entrypoint_type=EntrypointType.MODULE_PATH)
    finally:
        try:
            stand_down(f"{streaming.name}/{name}")
        except Exception as e:  # noqa: BLE001 (the server gone, or nothing was registered)
            log.warning("deployment %s/%s not stood down: %s", streaming.name, name, e)


def stand_down(deployment: str) -> dict[str, int]:
    """The deployment once its only runner has stopped: paused (Prefect then deletes its
    waiting auto-scheduled runs), every schedule off, a run still waiting cancelled and a
    run still marked running crashed. Returns how many of each it changed."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelled, Crashed

    gone = "lrm serve stopped"
    done = {"schedules": 0, "cancelled": 0, "crashed": 0}
    with get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name(deployment)
        client.pause_deployment(dep.id)
        for sched in dep.schedules:
            if sched.active:
                client.update_deployment_schedule(dep.id, sched.id, active=False)
                done["schedules"] += 1
        left = client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id])),
            flow_run_filter=FlowRunFilter(state=FlowRunFilterState(
                type=FlowRunFilterStateType(any_=[StateType.SCHEDULED, StateType.PENDING,
                                                  StateType.RUNNING]))))
        for run in left:
            if run.state_type == StateType.RUNNING:
                state = Crashed(message=f"{gone} while this run was in progress")
                done["crashed"] += 1
            else:
                state = Cancelled(message=f"{gone} before this run started; `lrm serve` "
                                          "again runs the days not done yet")
                done["cancelled"] += 1
            client.set_flow_run_state(run.id, state, force=True)
    log.info("deployment %s stood down: paused, %d schedule(s) off, %d waiting run(s) "
             "cancelled, %d running run(s) crashed", deployment, done["schedules"],
             done["cancelled"], done["crashed"])
    return done
