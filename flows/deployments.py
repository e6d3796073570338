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
poll.

`deploy` (`lrm deploy --pool NAME`) puts the same flow on a Prefect work pool instead: a
process pool (created when missing), whose workers (`prefect worker start --pool NAME`, on
the GPU machines) run each scheduled run in a process of their own, in this folder (the
workers need this repo installed at the same path, and the stream's folder). No process of
lrm's stays up; the runs wait for a worker. A worker lost in the middle of a day (killed,
its machine gone) cannot say so: the run's heartbeats stop (every `heartbeat` seconds,
PREFECT_FLOWS_HEARTBEAT_FREQUENCY of the run's process), and an automation of the server
marks it Crashed `LOST_AFTER` heartbeats later; the deployment runs one run at a time, so the
next scheduled run waits for that, takes over the stream's lock from the dead process and
finishes the day (its champions moved once, at its end).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from prefect.types.entrypoint import EntrypointType

from flows.streaming import settings, streaming
from lrm.errors import ConfigError

DEPLOYMENT = "lrm-streaming"
POOL_DEPLOYMENT = "lrm-streaming-pool"  # `lrm deploy`'s default name (beside `lrm serve`'s)
HEARTBEAT_S = 30  # the runs' heartbeat (Prefect's least; its default is 180 s)
LOST_AFTER = 3  # heartbeats missed before a run is marked Crashed
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


def _needs(cfg: Any, pool: str, folder: Path) -> tuple[str, list[str]]:
    """What the deployment needs, for the Prefect UI: its description and tags."""
    gpu = {"cuda": "a GPU on the worker's machine (train.device: cuda)",
           "auto": "a GPU on the worker's machine where it trains (train.device: auto: "
                   "the GPU when there is one, else the CPUs)",
           "cpu": "no GPU (train.device: cpu)"}[cfg.train.device]
    text = (f"lrm streaming retraining: the next days of {cfg.streaming.root} "
            f"({cfg.streaming.source}). Needs: the work pool {pool!r} and a worker on it "
            f"(`prefect worker start --pool {pool}`) with lrm installed and {folder} at the "
            f"same path; {gpu}. One run at a time; a run whose worker is lost is marked "
            f"Crashed after {LOST_AFTER} missed heartbeats and the next run finishes its day.")
    tags = ["lrm", "streaming", f"pool:{pool}", "needs:worker",
            {"cuda": "needs:gpu", "auto": "gpu:where-present", "cpu": "cpu-only"}[
                cfg.train.device]]
    return text, tags


def deploy(pool: str, cron: str | None = None, params: list[str] | None = None,
           root: str | None = None, days: int | None = None, name: str = POOL_DEPLOYMENT,
           heartbeat: int = HEARTBEAT_S) -> str:
    """Deploy the streaming flow to work pool `pool` (a process pool, created when missing)
    on its cron schedule, with the automation that crashes its lost runs; its id."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    cfg, _ = settings(params, root)
    schedule = cron or cfg.streaming.cron
    if len(schedule.split()) != 5:
        raise ConfigError(f"--cron: {schedule!r} is not a 5-field cron expression")
    if heartbeat < 30:
        raise ConfigError(f"--heartbeat {heartbeat}: Prefect's least is 30 seconds")
    folder = Path.cwd()
    with get_client(sync_client=True) as client:
        try:
            kind = client.read_work_pool(pool).type
        except ObjectNotFound:
            client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
            log.info("work pool %s created (type process)", pool)
            kind = "process"
    description, tags = _needs(cfg, pool, folder)
    env = {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(heartbeat)}
    job = {"env": env, **({"working_dir": str(folder)} if kind == "process" else {})}
    dep_id = streaming.deploy(
        name, work_pool_name=pool, cron=schedule, parameters=parameters(params, root, days),
        description=description, tags=tags, concurrency_limit=1, job_variables=job,
        # "flows.streaming.streaming": importable wherever lrm is installed
        entrypoint_type=EntrypointType.MODULE_PATH, build=False, push=False,
        print_next_steps=False, ignore_warnings=True)
    crash_lost_runs(f"{streaming.name}/{name}", str(dep_id), heartbeat)
    log.info("deployment %s/%s on work pool %s, cron %r: start a worker with `prefect worker "
             "start --pool %s`", streaming.name, name, pool, schedule, pool)
    return str(dep_id)


def crash_lost_runs(deployment: str, deployment_id: str, heartbeat: int) -> None:
    """The server's automation (made again on each deploy) that marks a run of the deployment
    Crashed when its heartbeats stop for LOST_AFTER periods (Prefect's recipe for runs whose
    process died with its worker: nothing else reports them)."""
    from datetime import timedelta

    from prefect.automations import Automation
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture

    name = f"lrm: crash lost runs of {deployment}"
    try:
        Automation.read(name=name).delete()
    except ValueError:  # none yet
        pass
    Automation(
        name=name, description=f"A run of {deployment} whose heartbeats stopped (its worker "
        f"or machine lost) is marked Crashed, so the next run can finish its day.",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", "prefect.flow-run.Completed",
                    "prefect.flow-run.Failed", "prefect.flow-run.Cancelled",
                    "prefect.flow-run.Crashed"},
            match={"prefect.resource.id": ["prefect.flow-run.*"]},
            match_related={"prefect.resource.role": "deployment",
                           "prefect.resource.id": f"prefect.deployment.{deployment_id}"},
            for_each={"prefect.resource.id"}, posture=Posture.Proactive, threshold=1,
            within=timedelta(seconds=heartbeat * LOST_AFTER)),
        actions=[ChangeFlowRunState(
            state=StateType.CRASHED, name="Crashed",
            message=f"no heartbeat for {heartbeat * LOST_AFTER} s: its worker or machine was "
                    "lost; the next run finishes the day")],
    ).create()
