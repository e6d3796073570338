"""The runner: the one way a stage runs, whoever starts it (its CLI, DVC, a Prefect flow).

`execute` checks that no output overlaps an input and that every output is lrm's to
replace, locks the outputs for the run, opens the MLflow run (rank 0 only), calls the
stage's `run` (whatever it writes without naming a stage is recorded as the stage's:
lrm.io.running), logs its result and writes the metrics file.

The MLflow run nests under the pipeline run it belongs to: a flow's parent run (active in
the process), or, under `dvc repro` (each stage its own process), one parent run per
`dvc repro`: the `dvc` process that started the stage names it (its pid and start time),
and the first stage of that repro creates it, with the params (`_dvc_parent`). A stage's
headline (`Stage.headline`: NE and AUC per model) goes on that parent too.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lrm import io, lock, progress, tracking
from lrm.config import ParamsConfig
from stagekit.declare import Result, Stage

log = logging.getLogger("lrm")
DVC_REPRO_TAG = "lrm.dvc_repro"  # the `dvc` process a parent run stands for (pid@start)


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _flat_args(args: Mapping[str, Any]) -> dict[str, Any]:
    return {k: ([str(x) for x in v] if isinstance(v, (list, tuple)) else
                str(v) if isinstance(v, Path) else v) for k, v in args.items()}


def execute(stage: Stage, args: Mapping[str, Any], params: ParamsConfig, *,
            force: bool = False, tags: Mapping[str, str] | None = None,
            parent: str | None = None) -> Result:
    """Run `stage` once: check and lock its paths, log an MLflow run, write its metrics;
    its result (what its `run` returned).

    Every check happens before anything is written: an output that is, contains or lies
    inside an input, and an existing output lrm did not write (unless `force`), are
    ConfigErrors; an output another run holds is a LockedError. Only rank 0 (torchrun)
    locks, logs and writes the metrics; other ranks just run. `parent`: the MLflow run its
    run nests under where this thread has no active run (a stream day's run, for a vertical
    model trained in a worker process).
    """
    args = stage.complete(args)
    configs = stage.configs(params, args)
    call = dict(args, **configs)
    if "force" in stage.signature().parameters:
        call["force"] = force
    title = stage.title(args)
    if _rank() != 0:
        with progress.context(stage=title), io.running(stage.name):
            return stage.run(**call)
    inputs = stage.paths(args, "in")
    outputs = stage.paths(args, "out", "metrics", "summary", "plot", "state", held=True)
    io.check_paths(inputs, outputs)
    claimed: list[list[Path]] = []
    marked: list[Path] = []  # a user's empty folder the claim marked
    for k, a in stage.args.items():  # every output is lrm's to replace, before any work
        one = {k: args.get(k), **{x: args.get(x) for x in stage.label}}
        for p in stage.paths(one, "out", "metrics", "summary", "plot", "state", held=True):
            if a.file or a.role in ("metrics", "summary", "plot"):
                io.check_file_replaceable(p, stage.name, force=force)
            elif a.role == "state" or a.persist:  # kept and added to, run after run
                mark = io.marked_by_claim(p)
                if made := io.claim_dir(p, stage.name, force=force,
                                        option=a.flag or "path"):
                    claimed.append(made)
                elif mark:
                    marked.append(p)
            else:
                io.check_replaceable(p, stage.name, force=force, option=a.flag or "path")
    try:
        return _run_logged(stage, args, params, configs, call, title, outputs, tags, force,
                           parent)
    except BaseException:
        for made in claimed:  # a run that failed before writing leaves no empty folder
            io.release_claim(made)
        for p in marked:  # nor a marker in a folder it found empty
            io.unmark(p)
        raise


def _dvc_repro() -> tuple[str, str] | None:
    """(the dvc file, "pid@start time" of the `dvc` process) when `dvc repro` (or `dvc exp
    run`) started this stage, else None. DVC names the stage in DVC_STAGE
    ("pipelines/criteo/dvc.yaml:ingest", or "ingest" in ./dvc.yaml); the nearest
    ancestor process running dvc is the repro."""
    stage = os.environ.get("DVC_STAGE")
    if not stage:
        return None
    import psutil

    dvc_file = stage.rsplit(":", 1)[0] if ":" in stage else "dvc.yaml"
    try:
        for proc in psutil.Process().parents():
            words = proc.cmdline()
            if any(Path(w).name == "dvc" for w in words[:3]) or words[1:3] == ["-m", "dvc"]:
                return dvc_file, f"{proc.pid}@{proc.create_time():.3f}"
    except psutil.Error:
        pass
    return None


def _dvc_parent(params: ParamsConfig) -> str | None:
    """The id of the parent run of this `dvc repro` (made by its first stage), or None
    when no `dvc repro` started this stage or a flow's run is active in this process."""
    repro = None if tracking.active() else _dvc_repro()
    if repro is None:
        return None
    dvc_file, key = repro
    return tracking.parent_run(f"dvc repro {dvc_file}", (DVC_REPRO_TAG, key),
                               dataclasses.asdict(params), params.tracking,
                               tags={"lrm.pipeline": dvc_file})


def _run_logged(stage: Stage, args: Mapping[str, Any], params: ParamsConfig,
                configs: Mapping[str, Any], call: Mapping[str, Any], title: str,
                outputs: list[Path], tags: Mapping[str, str] | None, force: bool,
                parent: str | None = None) -> Result:
    run_params = {**_flat_args(args),
                  **{kw: dataclasses.asdict(c) if dataclasses.is_dataclass(c) else c
                     for kw, c in configs.items()}}
    dvc = _dvc_parent(params)
    if dvc is not None:
        tracking.set_status(dvc, "RUNNING")
    status = "FAILED"
    try:
        with lock.exclusive_all(outputs, purpose=f"lrm {title}"), \
                progress.context(stage=title), io.running(stage.name), \
                tracking.run(title.replace(" ", "_"), params=run_params, cfg=params.tracking,
                             tags={"lrm.stage": stage.name, **(tags or {})},
                             parent=dvc or parent):
            for out in outputs:  # what a killed run of them left: none is live, they are locked
                io.remove_leftovers(out)
            result = stage.run(**call)
            metrics = result.metrics()
            tracking.log_result(metrics)
            if stage.headline is not None:  # the pipeline's headline: on its parent run
                tracking.log_headline(stage.headline(metrics))
            for m in stage.paths(args, "metrics"):
                io.write_json(metrics, m, stage=stage.name, force=force)
        status = "FINISHED"
    finally:
        if dvc is not None:
            tracking.set_status(dvc, status)
    log.info("%s done: %s", title,
             {k: v for k, v in metrics.items() if isinstance(v, (int, float, str))})
    return result


