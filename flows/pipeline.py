"""A whole pipeline of flows/dag.py as a Prefect flow: `python -m flows.pipeline` (`make run`).

Runs on Prefect's ephemeral server with no set-up; set PREFECT_API_URL to use a real one.
The same nodes, arguments and outputs as `dvc repro` (which also skips up-to-date stages),
one task per node, named after its stage and model; a run with the pipeline's own params
is recorded in dvc.lock (`record_for_dvc`), so `dvc repro` after it has nothing to do.
`--cluster local:N` or `--cluster tcp://HOST:PORT` runs the units of ingest and dedup (each
file, each day) on a Dask cluster (flows/cluster.py, the `cluster` extra). One MLflow parent run holds every
stage's run, the params and the headline (NE and AUC per model). A failed stage fails the flow with its one-line reason as the state message.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import typer
from prefect import flow
from prefect.states import Failed

from flows.cluster import task_runner
from flows.dag import PIPELINES, Pipeline
from flows.tasks import stage_task
from lrm import tracking
from lrm.errors import LrmError
from stagekit import load_params
from stagekit.cli import terminated_as_exit

SUMMARY = Path("metrics/summary.md")


@flow(name="lrm-pipeline", log_prints=True)
def pipeline(name: str = "lrm", params: list[str] | None = None,
             force: bool = False) -> dict[str, Any]:
    """Every node of pipeline `name`, in order (params: files laid over each other)."""
    pipe = PIPELINES[name]
    files = params or own_files(pipe)
    out: dict[str, Any] = {}
    try:
        cfg = load_params([Path(f) for f in files] if files else None)
        for run_id in tracking.close_dead_runs(cfg.tracking):  # a killed run's, before this
            print(f"closed MLflow run {run_id}: left RUNNING by a process that is gone")
        with tracking.run(f"pipeline_{pipe.name}", params=dataclasses.asdict(cfg),
                          cfg=cfg.tracking, tags={"lrm.pipeline": pipe.name}):
            for n in pipe.nodes:
                out[n.name] = stage_task(pipe.name, n.name, n.title, files, force)
    except LrmError as e:
        return Failed(message=f"{e}")  # type: ignore[return-value]
    if files == own_files(pipe):
        record_for_dvc(pipe)
    return out


def own_files(pipe: Pipeline) -> list[str] | None:
    """The params files a pipeline reads when none are given (as `dvc repro` does)."""
    return [p for p in pipe.params if Path(p).exists()] or None


def record_for_dvc(pipe: Pipeline) -> bool:
    """Record the run in dvc.lock, as `dvc repro` would have (`dvc commit` of every stage
    of the pipeline's dvc.yaml: the hashes of their deps, params and outs, the outs into
    DVC's cache), so that `make repro` after `make run` finds nothing to do.

    Recording rather than running the flow's stages through `dvc repro`: the flow keeps
    calling each stage in this process (one MLflow parent run, a Prefect task per stage,
    its state and retries), and DVC's own command checks what it records. Only a run with
    the pipeline's own params files is recorded (what dvc.yaml says the stages read), in
    a DVC repository; a lock held by a running `dvc repro` leaves dvc.lock as it was, with
    a line saying so. Returns whether it recorded."""
    if not (Path(".dvc").is_dir() and pipe.dvc_file.is_file()):
        return False
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    try:
        with Repo() as repo:
            repo.commit(str(pipe.dvc_file), force=True)
    except DvcException as e:
        print(f"dvc.lock not updated (`dvc repro` will run the stages again): {e}")
        return False
    print(f"recorded the run in {pipe.dvc_file.with_suffix('.lock')} (`dvc repro` has "
          "nothing to do until something changes)")
    return True


def report() -> str:
    """What `make run` prints at the end: the NE table and where to look."""
    table = SUMMARY.read_text() if SUMMARY.exists() else "(no metrics/summary.md)\n"
    return (f"\nHeld-out NE (lower is better; 1.0 = the base rate) and AUC:\n\n{table}\n"
            "Where to look:\n"
            f"  MLflow UI   make ui        ({tracking.ui_url()}: runs, models, "
            "registry)\n"
            "  Prefect UI  prefect server start  (http://127.0.0.1:4200; set PREFECT_API_URL="
            "http://127.0.0.1:4200/api before `make run` to record the flow there)\n"
            "  DVC         dvc metrics show --md; dvc plots show (plots/*.png)\n")


def main(name: str = typer.Option("lrm", "--pipeline", help=f"one of {sorted(PIPELINES)}"),
         params: list[Path] = typer.Option(None, "--params", help="params files"),
         force: bool = typer.Option(False, "--force", help="replace outputs lrm did not write"),
         cluster: str = typer.Option(None, "--cluster", help="where ingest's and dedup's "
                                     "units run: local:N (N Dask worker processes here) or "
                                     "tcp://HOST:PORT (a Dask scheduler); default: threads "
                                     "of this process (flows/cluster.py)"),
         ) -> None:
    """Run a pipeline of flows/dag.py as a Prefect flow."""
    try:
        runner = task_runner(cluster)
    except LrmError as e:
        print(f"error: {e}", file=sys.stderr)
        raise typer.Exit(2) from None
    run = pipeline.with_options(task_runner=runner) if runner is not None else pipeline
    with terminated_as_exit():  # SIGTERM exits through Prefect's teardown: its temporary
        # server is stopped (Python's default ends the process and leaves it running)
        state = run(name, [str(p) for p in params] if params else None, force,
                    return_state=True)
    if state.is_failed():
        print(f"error: {state.message}", file=sys.stderr)
        raise typer.Exit(2)
    if name == "lrm":
        print(report())


if __name__ == "__main__":
    typer.run(main)
