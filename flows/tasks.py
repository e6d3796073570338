"""A node of the DAG as a Prefect task: the stage's typed `run`, through `execute`.

The task calls the same function with the same arguments as the node's command line in
dvc.yaml (both come from flows/dag.py), in this process. Bad input (an LrmError: exit 2 on
the command line) is not retried and its one-line reason becomes the task's and the flow
run's state message; anything else is retried, since a transient failure (a locked SQLite
store, a full disk being cleaned) may pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task
from prefect.client.schemas.objects import State, TaskRun
from prefect.tasks import Task

from flows.dag import PIPELINES, Node
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


@task(retries=2, retry_delay_seconds=2, retry_condition_fn=_retry_unless_bad_input,
      task_run_name="{title}")
def stage_task(pipeline: str, name: str, title: str, params: list[str] | None = None,
               force: bool = False) -> dict[str, Any]:
    """Run node `name` of `pipeline` (its title names the stage and model); its metrics."""
    n = node(pipeline, name)
    files = [Path(p) for p in params] if params else None
    return execute(n.stage, n.args, load_params(files), force=force)


