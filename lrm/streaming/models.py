"""The models of a stream day: each resumed from its checkpoint chain, trained, registered.

Every model keeps its checkpoints (`checkpoints/teacher`, `checkpoints/students/NAME`) in
one folder per day (lrm.streaming.chains): day D resumes the newest checkpoint of the day
before with `lrm.train.train(..., resume=True, new_data=True)` (the model and optimizer
state carry over, the day's data gets one pass), or, after a failed run of D, D's own newest
checkpoint (where it stopped). The day's model folder is written once training is over
and its checkpoint folder is then marked finished; a run that finds the model goes straight
to the registry (`lrm.registry.challenge`: register once, score challenger and champion on the same
data, move @champion only when NE improves).

Students: every size in `students.models`, in the serving variant `registry.variant`,
registered as lrm-student-NAME. The teacher: retrained every `streaming.teacher_every`
days on the days since its last window (the first time on [0, T)), scored on day D (a day
it has not seen), registered as `teacher.registry_name`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from lrm import io, progress, registry, tracking
from lrm.config import (ModelConfig, ParamsConfig, SplitConfig, TrainConfig, TrainOverrides,
                        with_overrides)
from lrm.errors import ConfigError
from lrm.streaming import chains
from lrm.streaming.days import EvalPlan
from lrm.streaming.layout import STAGE, StreamPaths
from lrm.train.export import CARD


def _complete(model_dir: Path) -> bool:
    return (Path(model_dir) / CARD).is_file()


def _log_fn() -> Any:
    return tracking.log_metrics if tracking.active() else None


def _train_cfg(cfg: ParamsConfig, overrides: TrainOverrides) -> TrainConfig:
    """The train values of a stream model. fit_tables off: the tables keep the rows of
    `model.tables` day after day (a day's distinct ids would give each day other table
    sizes, and the next day could not resume the model); arriving ids hash into them (the
    day's collision report)."""
    return dataclasses.replace(with_overrides(cfg.train, overrides), fit_tables=False)


def _trained(r: Any, new_data: bool) -> dict[str, Any]:
    """What a day's training did: steps, and what it resumed (the day before's checkpoint,
    or this day's own after a failed run; None: a fresh start)."""
    return {"steps": r.steps, "resumed_from": r.resumed_from,
            "resumed": None if r.resumed_from is None else
            ("previous day" if new_data else "this day (a run that stopped)"),
            "checkpoint": str(r.checkpoint) if r.checkpoint else None, "eval": r.eval}


# ------------------------------------------------------------------------- teacher

def teacher_state(paths: StreamPaths) -> dict[str, Any] | None:
    """{"until": D, "version": v, "window": [...]}: the teacher's last finished step."""
    try:
        doc = json.loads(paths.teacher_state().read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def teacher_due(paths: StreamPaths, cfg: ParamsConfig, day: int) -> list[int] | None:
    """The days the teacher trains on at day `day`, or None when it is not due."""
    state = teacher_state(paths)
    if state is None:
        return list(range(day))
    until = int(state["until"])
    every = cfg.streaming.teacher_every
    if every == 0 or day - until < every:
        return None
    return list(range(until, day))


def teacher_step(paths: StreamPaths, cfg: ParamsConfig, day: int) -> dict[str, Any]:
    """Retrain the teacher when due (else say when it is next), register, promote on NE."""
    from lrm.train import train

    name = cfg.teacher.registry_name
    if not name:
        raise ConfigError("streaming: teacher.registry_name is empty; the stream augments "
                          "with the registered teacher's @champion")
    window = teacher_due(paths, cfg, day)
    if window is None:
        state = teacher_state(paths) or {}
        every = cfg.streaming.teacher_every
        return {"due": False, "until": state.get("until"),
                "next": int(state["until"]) + every if every and state else None}
    out = paths.teacher_model(day)
    trained: dict[str, Any] = {"skipped": True}
    if not _complete(out):
        folder, new_data = chains.day_folder(paths.teacher_chain(), day)
        with progress.context(model="teacher", day=day):
            r = train("teacher", _train_cfg(cfg, cfg.teacher.train),
                      ModelConfig(tables=cfg.model.tables, teacher=cfg.model.teacher),
                      paths.sessions, split=SplitConfig(days=window, eval_day=day),
                      loader_cfg=cfg.loader, checkpoint=cfg.checkpoint, checkpoints=folder,
                      resume=True, new_data=new_data, out=out, log_fn=_log_fn(),
                      info={"stream_day": day})
        trained = _trained(r, new_data)
    chains.finish(paths.teacher_chain(), day, trained)
    d = registry.challenge(out, name, eval_data=paths.sessions, eval_day=day,
                           margin=cfg.registry.margin, evaluated_on=f"day {day}",
                           cfg=cfg.tracking)
    state = {"until": day, "window": window, "version": d.version}
    io.write_json(state, paths.teacher_state(), stage=STAGE)
    return {"due": True, "window": window, "train": trained, "decision": d.as_dict(),
            "champion": registry.alias_version(name, registry.CHAMPION, cfg.tracking)}


def teacher_champion(paths: StreamPaths, cfg: ParamsConfig) -> tuple[str, Path]:
    """(version, model folder) of the teacher's @champion (downloaded once per version)."""
    name = cfg.teacher.registry_name
    version = registry.alias_version(name, registry.CHAMPION, cfg.tracking)
    if version is None:
        raise ConfigError(f"streaming: {name} has no @{registry.CHAMPION} to augment with")
    dst = paths.registered(name, version)
    marker = dst / "folder.json"
    if marker.is_file():
        return version, dst / json.loads(marker.read_text())["path"]
    with io.atomic_dir(dst, stage=STAGE) as tmp:
        folder = registry.model_folder(name, version, tmp, cfg.tracking)
        rel = folder.resolve().relative_to(tmp.resolve()).as_posix()
        io.write_json({"path": rel}, tmp / "folder.json")
    return version, dst / rel


# ------------------------------------------------------------------------ students

def student_step(paths: StreamPaths, cfg: ParamsConfig, name: str, day: int,
                 plan: EvalPlan) -> dict[str, Any]:
    """Train student `name` (its serving variant) on day D from its chain; register it."""
    from lrm.exfm.augment import TEACHER_COLUMN
    from lrm.exfm.distill import ExFMLoss, student_config
    from lrm.train import train

    variant = registry.serving_variant(cfg.registry, cfg.students.variants)
    size = cfg.students.models[name]
    out = paths.student_model(name, day)
    trained: dict[str, Any] = {"skipped": True}
    if not _complete(out):
        chain = paths.student_chain(name)
        folder, new_data = chains.day_folder(chain, day)
        with progress.context(student=name, variant=cfg.registry.variant, day=day):
            r = train("student", _train_cfg(cfg, cfg.students.train),
                      ModelConfig(tables=cfg.model.tables, student=student_config(size, variant)),
                      plan.train_data, split=SplitConfig(days=[day], eval_day=plan.eval_day),
                      eval_from=plan.separate_eval, loader_cfg=cfg.loader,
                      checkpoint=cfg.checkpoint, checkpoints=folder, resume=True,
                      new_data=new_data, out=out, loss_fn=ExFMLoss(variant),
                      teacher_column=TEACHER_COLUMN if variant.distill else None,
                      log_fn=_log_fn(), info={"stream_day": day, "evaluated_on": plan.label})
        trained = _trained(r, new_data)
    chains.finish(paths.student_chain(name), day, trained)
    model = registry.student_model(name, cfg.registry)
    d = registry.challenge(out, model, eval_data=plan.eval_data, eval_day=plan.eval_day,
                           margin=cfg.registry.margin, evaluated_on=plan.label,
                           cfg=cfg.tracking)
    return {"train": trained, "decision": d.as_dict(),
            "champion": registry.alias_version(model, registry.CHAMPION, cfg.tracking)}
