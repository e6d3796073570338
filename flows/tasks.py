"""A node of the DAG as a Prefect task: the stage's typed `run`, through `execute`.

The task calls the same function with the same arguments as the node's command line in
dvc.yaml (both come from flows/dag.py), in this process. Bad input (an LrmError: exit 2 on
the command line) is not retried and its one-line reason becomes the task's and the flow
run's state message; anything else is retried, since a transient failure (a locked SQLite
store, a full disk being cleaned) may pass.

The independent units inside a stage (lrm.fanout: each input file and each day that
`ingest logs` reads and writes, each day `dedup` dedups) run as tasks of their own, named
"ingest day 3", "dedup day 3", ..., on the flow's task runner: threads by default; with a
distributed runner (prefect-dask's DaskTaskRunner: flows/cluster.py) in worker processes or on
other machines, which then need the flow's folders at the same paths (a shared file system):
a unit runs in the flow's working folder, so the stage's relative paths mean there what they
mean in the flow.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from prefect import get_client, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State, TaskRun
from prefect.tasks import Task

from flows.dag import PIPELINES, Node
from lrm import fanout
from lrm.errors import ConfigError, LrmError
from stagekit import execute, load_params
from stagekit.params import PARAMS


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


_CWD_LOCK = threading.Lock()
_CWD_USERS: dict[str, int] = {}  # folder -> units running in it in this process


@contextmanager
def _in_folder(folder: str):
    """Run in `folder` (the flow's working folder) for the block. The working folder is the
    process's: units of flows started in other folders wait for each other here."""
    if not os.path.isdir(folder):
        raise ConfigError(f"worker {socket.gethostname()} (pid {os.getpid()}): the flow's "
                          f"folder {folder} is not there: every worker must see the flow's "
                          "folders at the same paths (a shared file system)")
    while True:
        with _CWD_LOCK:
            if not _CWD_USERS or folder in _CWD_USERS:
                if not _CWD_USERS:  # always: the folder may have been made again since
                    os.chdir(folder)
                _CWD_USERS[folder] = _CWD_USERS.get(folder, 0) + 1
                break
        threading.Event().wait(0.05)
    try:
        yield
    finally:
        with _CWD_LOCK:
            _CWD_USERS[folder] -= 1
            if not _CWD_USERS[folder]:
                del _CWD_USERS[folder]


@task(task_run_name="{kind} {name}", cache_policy=NO_CACHE)  # units are big, and run once
def unit_task(kind: str, name: str, fn: Callable[[Any], Any], item: Any,
              cwd: str | None = None) -> Any:
    """One unit of a stage (a day to write, a file to read): fn(item), in the flow's working
    folder `cwd` (where the unit runs in another process or on another machine)."""
    with _in_folder(cwd) if cwd else nullcontext():
        return fn(item)


def task_units(kind: str, fn: Callable[[Any], Any], items: Sequence[Any],
               names: Sequence[str]) -> list[Any]:
    """lrm.fanout's mapper in a flow: every unit a task on the flow's task runner, at once.

    A unit that fails other than on bad input (its worker lost for good) fails the stage
    naming it ("dedup day 3: KilledWorker: ..."). Where Prefect runs on its temporary server
    (no PREFECT_API_URL), the units are sent with its address, so that worker processes
    record their task runs there rather than each starting a temporary server of its own."""
    cwd = os.getcwd()
    with _api_of_this_flow():
        futures = [unit_task.submit(kind, n, fn, x, cwd)
                   for n, x in zip(names, items, strict=True)]
    out = []
    for n, f in zip(names, futures, strict=True):
        try:
            out.append(f.result())
        except LrmError:
            raise
        except Exception as e:  # e.g. dask's KilledWorker, which names only its task key
            raise RuntimeError(f"{kind} {n}: {type(e).__name__}: {e}") from e
    return out


@contextmanager
def _api_of_this_flow():
    from prefect.settings import PREFECT_API_URL, temporary_settings

    if PREFECT_API_URL.value():
        yield
        return
    with get_client(sync_client=True) as client:
        url = str(client.api_url).rstrip("/")
    with temporary_settings(updates={PREFECT_API_URL: url}):
        yield


@task(retries=2, retry_delay_seconds=2, retry_condition_fn=_retry_unless_bad_input,
      task_run_name="{title}")
def stage_task(pipeline: str, name: str, title: str, params: list[str] | None = None,
               force: bool = False) -> dict[str, Any]:
    """Run node `name` of `pipeline` (its title names the stage and model); its metrics.
    Its units (lrm.fanout) run as tasks of their own."""
    n = node(pipeline, name)
    files = [Path(p) for p in params] if params else None
    if n.params:  # its own files (a tune node's) over the pipeline's
        files = [*(files or ([PARAMS] if PARAMS.exists() else [])), *map(Path, n.params)]
    with fanout.using(task_units):
        return execute(n.stage, n.args, load_params(files), force=force).metrics()


