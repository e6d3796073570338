"""The runner: the one way a stage runs, whoever starts it (its CLI, DVC, a Prefect flow).

`execute` checks that no output overlaps an input and that every output is lrm's to
replace, locks the outputs for the run, opens the MLflow run (rank 0 only), calls the
stage's `run` (whatever it writes without naming a stage is recorded as the stage's:
lrm.io.running), and writes the metrics file.
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
from stagekit.declare import Stage

log = logging.getLogger("lrm")

def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _flat_args(args: Mapping[str, Any]) -> dict[str, Any]:
    return {k: ([str(x) for x in v] if isinstance(v, (list, tuple)) else
                str(v) if isinstance(v, Path) else v) for k, v in args.items()}


def execute(stage: Stage, args: Mapping[str, Any], params: ParamsConfig, *,
            force: bool = False, tags: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run `stage` once: check and lock its paths, log an MLflow run, write its metrics.

    Every check happens before anything is written: an output that is, contains or lies
    inside an input, and an existing output lrm did not write (unless `force`), are
    ConfigErrors; an output another run holds is a LockedError. Only rank 0 (torchrun)
    locks, logs and writes the metrics; other ranks just run.
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
    outputs = stage.paths(args, "out", "metrics", "summary", "plot", "state")
    io.check_paths(inputs, outputs)
    claimed: list[list[Path]] = []
    for k, a in stage.args.items():  # every output is lrm's to replace, before any work
        for p in stage.paths({k: args.get(k)}, "out", "metrics", "summary", "plot", "state"):
            if a.file or a.role in ("metrics", "summary", "plot"):
                io.check_file_replaceable(p, stage.name, force=force)
            elif a.role == "state" or a.persist:  # kept and added to, run after run
                if made := io.claim_dir(p, stage.name, force=force):
                    claimed.append(made)
            else:
                io.check_replaceable(p, stage.name, force=force)
    try:
        return _run_logged(stage, args, params, configs, call, title, outputs, tags, force)
    except BaseException:
        for made in claimed:  # a run that failed before writing leaves no empty folder
            io.release_claim(made)
        raise


def _run_logged(stage: Stage, args: Mapping[str, Any], params: ParamsConfig,
                configs: Mapping[str, Any], call: Mapping[str, Any], title: str,
                outputs: list[Path], tags: Mapping[str, str] | None, force: bool
                ) -> dict[str, Any]:
    run_params = {**_flat_args(args),
                  **{kw: dataclasses.asdict(c) if dataclasses.is_dataclass(c) else c
                     for kw, c in configs.items()}}
    with lock.exclusive_all(outputs, purpose=f"lrm {title}"), progress.context(stage=title), \
            io.running(stage.name), \
            tracking.run(title.replace(" ", "_"), params=run_params, cfg=params.tracking,
                         tags={"lrm.stage": stage.name, **(tags or {})}):
        metrics = stage.run(**call)
        tracking.log_metrics(metrics)
        for m in stage.paths(args, "metrics"):
            io.write_json(metrics, m, stage=stage.name, force=force)
    log.info("%s done: %s", title,
             {k: v for k, v in metrics.items() if isinstance(v, (int, float, str))})
    return metrics


