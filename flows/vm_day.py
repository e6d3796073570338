"""A stream day's vertical model (`vm_day`): its student stage and its register stage, run
where the day trains it (the flow's process, or a worker process of the day's pool).

A module without Prefect: a worker process imports what the function it runs lives in, and
flows.streaming's Prefect (a quarter of that module's import, 5 of 20 s at load 17 on 2
cores) is nothing a vertical model's day needs. Nothing imported here may import fbgemm
either (see flows/streaming.py).
"""

# No `from __future__ import annotations`: see flows/streaming.py (`lrm serve` pickles the
# flow, and these functions with it, by value where it must)

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lrm import registry
from lrm.config import ParamsConfig
from lrm.errors import LrmError
from lrm.streaming import days as sdays
from lrm.streaming.layout import StreamPaths
from stagekit import OFF, Result, Stage, execute
from stages import register
from stages import student as student_stage


@dataclass(frozen=True)
class Judged:
    """A model's step of the day: its part of the day's record, and the registry's decision
    on it (None: nothing registered), carried out by `promote` once the day is done."""

    record: dict[str, Any]
    decision: registry.Decision | None = None
    champion: str | None = None  # @champion's version once the day's decision is carried out


def run_stage(stage: Stage, args: dict[str, Any], cfg: ParamsConfig, day: int,
              parent: str | None = None) -> Result:
    """Run a stage for day `day` through the stage runner (its checks, locks, MLflow run
    nested under the day's: the active one, or `parent`; one-line errors); its typed
    result."""
    return execute(stage, args, cfg, tags={"lrm.stream.day": str(day)}, parent=parent)


def champion_after(decision: registry.Decision, name: str, cfg: ParamsConfig) -> str | None:
    """@champion of `name` once the day's decision is carried out (at the end of the day)."""
    if decision.promoted:
        return str(decision.version)
    return registry.alias_version(name, registry.CHAMPION, cfg.tracking)


def vm_day(cfg: ParamsConfig, paths: StreamPaths, name: str, day: int,
           teacher: str | None = None, parent: str | None = None) -> Judged:
    """Vertical model `name`'s day D: the student stage carries it on (its serving variant,
    or with registry.variant auto the variants of the day: every one every
    students.ablation_every days, else the served one and labels only); the register stage
    registers the served one (a VM's variant, or `teacher`, the day's foundation model,
    where its own prediction serves the surface) and judges it on NE. A VM with nothing
    new to serve (its surface's day too small to train on) registers nothing. `parent`: the
    day's MLflow run (a worker process has none active)."""
    plan = sdays.plan(paths, day, cfg.streaming.holdout)
    out = paths.student_models(day)
    trained = run_stage(student_stage.STAGE, {
        "data": plan.train_data, "sessions": paths.sessions, "out": out,
        "teacher": Path(teacher) if teacher else None,
        "checkpoints": paths.student_chains(), "day": day, "name": name,
        "eval_data": plan.separate_eval, "eval_day": plan.eval_day,
        "plan": cfg.streaming.plan or None,
        "metrics": paths.reports / f"student_{name}_day={day}.json", "table": OFF,
        "plot": OFF}, cfg, day, parent)
    assert isinstance(trained, student_stage.Day), trained  # --day: one day
    m = trained.students[name]
    from lrm.exfm.pick import FM  # here, not at load: see the module's imports

    served = m.serving
    base = {"variant": served, "validation_ne": m.validation_ne, "pick": m.pick,
            "ablation": m.ablation, "trained": sorted(m.variants)}
    if served is None or (served != FM and served not in m.variants):
        why = m.skipped or m.not_trained or "nothing trained"
        champion = registry.alias_version(registry.student_model(name, cfg.registry),
                                          registry.CHAMPION, cfg.tracking)
        return Judged({**base, "skipped": why, "decision": None, "champion": champion},
                      None, champion)
    r = run_stage(register.STAGE, {
        "models": out, "data": plan.eval_data, "day": plan.eval_day, "name": name,
        "evaluated_on": plan.label, "defer": True,
        "metrics": paths.reports / f"register_{name}_day={day}.json"}, cfg, day, parent)
    assert isinstance(r, register.Registered), r
    decision = r.decisions[name]
    champion = champion_after(decision, decision.name, cfg)
    return Judged({**base, "train": m.variants.get(served, {"foundation_model": teacher}),
                   "decision": {**decision.as_dict(), "variant": r.variants[name]},
                   "champion": champion}, decision, champion)


def vm_day_in_worker(*args: Any) -> Judged:
    """`vm_day` in a worker process: bad input comes back as one line (an LrmError that
    pickles: DataError's fields do not)."""
    try:
        return vm_day(*args)
    except LrmError as e:
        raise LrmError(str(e)) from None


def worker_threads(threads: int) -> None:
    """A worker process's share of the cores (lrm.dist.intra_op_threads reads it)."""
    import os

    import torch

    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
