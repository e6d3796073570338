"""The models of a stream day: when the teacher is due and on which days, the teacher's
state, and the teacher's @champion that augments the day.

Each model of a stream is carried from day to day (lrm.train.days: `checkpoints/teacher`,
`checkpoints/students/NAME`, one folder per day): day D goes on from the day before's model
and optimizer state, or, after a failed run of D, D's own newest checkpoint. The training
and registering are the teacher and student stages' (flows/streaming.py runs them through
the stage runner); this module holds what the flow decides with.

The teacher (the foundation model): retrained every `exfm.teacher_every` days on the days
since its last window, each version trained through day D - `exfm.teacher_lag` (it lags the
students as in the ExFM stage, lrm.exfm.schedule: the first time on [0, D - lag + 1)),
scored on day D (a day it has not seen), registered as `teacher.registry_name`; its
@champion logs day D.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lrm import io, registry
from lrm.config import ParamsConfig
from lrm.errors import ConfigError
from lrm.streaming.layout import STAGE, StreamPaths


def teacher_state(paths: StreamPaths) -> dict[str, Any] | None:
    """{"until": D, "version": v, "window": [...]}: the teacher's last finished step."""
    try:
        doc = json.loads(paths.teacher_state().read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def teacher_due(paths: StreamPaths, cfg: ParamsConfig, day: int) -> list[int] | None:
    """The days the teacher trains on at day `day`, or None when it is not due: those since
    its last window, through day - exfm.teacher_lag."""
    end = day - cfg.exfm.teacher_lag + 1  # the first day it may not see
    state = teacher_state(paths)
    if state is None:
        return list(range(max(end, 1)))
    until = int(state["until"])
    if until == day:  # this day's own step, by a run of the day that then failed: again
        return [int(d) for d in state["window"]]  # (the stage finds it trained: it judges)
    every = cfg.exfm.teacher_every
    if every == 0 or day - until < every or end <= int(state.get("trained_until", until)):
        return None
    return list(range(int(state.get("trained_until", until)), end))


def not_due(paths: StreamPaths, cfg: ParamsConfig) -> dict[str, Any]:
    """What the day's record says of a teacher that is not due: its last window, the next."""
    state = teacher_state(paths) or {}
    every = cfg.exfm.teacher_every
    return {"due": False, "until": state.get("until"),
            "next": int(state["until"]) + every if every and state else None}


def record_teacher(paths: StreamPaths, day: int, window: list[int], version: str) -> None:
    """The teacher's step of day `day` is over: its window (through `trained_until` - 1)
    and registered version."""
    io.write_json({"until": day, "trained_until": window[-1] + 1 if window else day,
                   "window": window, "version": version},
                  paths.teacher_state(), stage=STAGE)


def registry_name(cfg: ParamsConfig) -> str:
    """The teacher's registered model, which the stream augments with."""
    if not cfg.teacher.registry_name:
        raise ConfigError("streaming: teacher.registry_name is empty; the stream augments "
                          "with the registered teacher's @champion")
    return cfg.teacher.registry_name


def teacher_champion(paths: StreamPaths, cfg: ParamsConfig, version: str | None = None
                     ) -> tuple[str, Path]:
    """(version, model folder) of the teacher's @champion, or of `version` (the day's
    champion-to-be: promotions move the alias at the end of the day); downloaded once per
    version."""
    name = registry_name(cfg)
    version = version or registry.alias_version(name, registry.CHAMPION, cfg.tracking)
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
