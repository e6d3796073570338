"""A whole pipeline of flows/dag.py as a Prefect flow: `python -m flows.pipeline` (`make run`).

Runs on Prefect's ephemeral server with no set-up; set PREFECT_API_URL to use a real one.
The same nodes, arguments and outputs as `dvc repro` (which also skips up-to-date stages),
one task per node, named after its stage and model. One MLflow parent run holds every
stage's run. A failed stage fails the flow with its one-line reason as the state message.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer
from prefect import flow
from prefect.states import Failed

from flows.dag import PIPELINES
from flows.tasks import stage_task
from lrm import tracking
from lrm.errors import LrmError
from stagekit import load_params

SUMMARY = Path("metrics/summary.md")


@flow(name="lrm-pipeline", log_prints=True)
def pipeline(name: str = "lrm", params: list[str] | None = None,
             force: bool = False) -> dict[str, Any]:
    """Every node of pipeline `name`, in order (params: files laid over each other)."""
    pipe = PIPELINES[name]
    files = params or [p for p in pipe.params if Path(p).exists()] or None
    out: dict[str, Any] = {}
    try:
        cfg = load_params([Path(f) for f in files] if files else None)
        for run_id in tracking.close_dead_runs(cfg.tracking):  # a killed run's, before this
            print(f"closed MLflow run {run_id}: left RUNNING by a process that is gone")
        with tracking.run(f"pipeline_{pipe.name}", cfg=cfg.tracking,
                          tags={"lrm.pipeline": pipe.name}):
            for n in pipe.nodes:
                out[n.name] = stage_task(pipe.name, n.name, n.title, files, force)
    except LrmError as e:
        return Failed(message=f"{e}")  # type: ignore[return-value]
    return out


def report() -> str:
    """What `make run` prints at the end: the NE table and where to look."""
    table = SUMMARY.read_text() if SUMMARY.exists() else "(no metrics/summary.md)\n"
    return (f"\nHeld-out NE (lower is better; 1.0 = the base rate) and AUC:\n\n{table}\n"
            "Where to look:\n"
            "  MLflow UI   make ui        (http://127.0.0.1:5000: runs, models, registry)\n"
            "  Prefect UI  prefect server start  (http://127.0.0.1:4200; set PREFECT_API_URL="
            "http://127.0.0.1:4200/api before `make run` to record the flow there)\n"
            "  DVC         dvc metrics show; dvc plots show (plots/*.png)\n")


def main(name: str = typer.Option("lrm", "--pipeline", help=f"one of {sorted(PIPELINES)}"),
         params: list[Path] = typer.Option(None, "--params", help="params files"),
         force: bool = typer.Option(False, "--force", help="replace outputs lrm did not write"),
         ) -> None:
    """Run a pipeline of flows/dag.py as a Prefect flow."""
    state = pipeline(name, [str(p) for p in params] if params else None, force,
                     return_state=True)
    if state.is_failed():
        print(f"error: {state.message}", file=sys.stderr)
        raise typer.Exit(2)
    if name == "lrm":
        print(report())


if __name__ == "__main__":
    typer.run(main)
