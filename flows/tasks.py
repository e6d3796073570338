"""Stages as Prefect tasks: each task runs the stage's own CLI command in-process.

The command is the same function `lrm NAME` and `python -m stages.NAME` run, so a flow,
DVC and the CLI can never drift apart. Bad input (exit 2) is not retried; anything else
is, since a transient failure (a locked SQLite store, a full disk being cleaned) may pass.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import typer
from prefect import task
from prefect.tasks import Task
from prefect.client.schemas.objects import TaskRun, State
from typer.main import get_command


class StageFailed(RuntimeError):
    def __init__(self, name: str, code: int) -> None:
        super().__init__(f"stage {name} exited with status {code}")
        self.code = code


def invoke(name: str, argv: list[str]) -> None:
    """Run stage `name`'s CLI with `argv` in this process; raise StageFailed on non-zero."""
    mod = importlib.import_module(f"stages.{name}")
    app = getattr(mod, "app", None)
    if app is None:
        app = typer.Typer(add_completion=False)
        app.command()(mod.command)
    code = get_command(app).main(args=argv, prog_name=name, standalone_mode=False)
    if code:
        raise StageFailed(name, int(code))


def _retry_unless_bad_input(task: Task, task_run: TaskRun, state: State) -> bool:
    try:
        state.result()
    except StageFailed as e:
        return e.code != 2
    except Exception:
        return True
    return False


@task(retries=2, retry_delay_seconds=2, retry_condition_fn=_retry_unless_bad_input,
      task_run_name="{name}")
def stage_task(name: str, argv: list[str], metrics: str | None = None) -> dict[str, Any]:
    """Run one stage; return its metrics JSON (empty when the stage writes none)."""
    invoke(name, argv)
    if metrics and Path(metrics).exists():
        return json.loads(Path(metrics).read_text())
    return {}
