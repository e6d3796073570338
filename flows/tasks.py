"""A node of the DAG as a Prefect task: the stage's typed `run`, through `execute`.

The task calls the same function with the same arguments as the node's command line in
dvc.yaml (both come from flows/dag.py), in this process. Bad input (an LrmError: exit 2 on
the command line) is not retried and its one-line reason becomes the task's and the flow
run's state message; anything else is retried, since a transient failure (a locked SQLite
store, a full disk being cleaned) may pass.

The independent units inside a stage (lrm.fanout: each input file and each day that
`ingest logs` reads and writes, each day `dedup` dedups) run as tasks of their own, named
"ingest day 3", "dedup day 3", ..., on the flow's task runner: threads by default; with a
distributed runner (prefect-dask's DaskTaskRunner, prefect-ray's RayTaskRunner) on other
machines, which then need the data's folders at the same paths (a shared file system).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collections.abc import Callable, Sequence

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State, TaskRun
from prefect.tasks import Task

from flows.dag import PIPELINES, Node
from lrm import fanout
from lrm.errors import LrmError
from stagekit import execute, load_params


def node(pipeline: str, name: str) -> Node:
    return next(n for n in PIPELINES[pipeline].nodes if n.name == name)


def _retry_unless_bad_input(task: Task, task_run: TaskRun, state: State) -> bool:
    try:
        state.result()
    except LrmError:
        return False
    except Exception:  # noqa: BLE001
        return True
    return False


@task(task_run_name="{kind} {name}", cache_policy=NO_CACHE)  # units are big, and run once
def unit_task(kind: str, name: str, fn: Callable[[Any], Any], item: Any) -> Any:
    """One unit of a stage (a day to write, a file to read): fn(item)."""
    return fn(item)


def task_units(kind: str, fn: Callable[[Any], Any], items: Sequence[Any],
               names: Sequence[str]) -> list[Any]:
    """lrm.fanout's mapper in a flow: every unit a task on the flow's task runner, at once."""
    futures = [unit_task.submit(kind, n, fn, x) for n, x in zip(names, items, strict=True)]
    return [f.result() for f in futures]


@task(retries=2, retry_delay_seconds=2, retry_condition_fn=_retry_unless_bad_input,
      task_run_name="{title}")
def stage_task(pipeline: str, name: str, title: str, params: list[str] | None = None,
               force: bool = False) -> dict[str, Any]:
    """Run node `name` of `pipeline` (its title names the stage and model); its metrics.
    Its units (lrm.fanout) run as tasks of their own."""
    n = node(pipeline, name)
    files = [Path(p) for p in params] if params else None
    with fanout.using(task_units):
        return execute(n.stage, n.args, load_params(files), force=force)


