"""Stage `teacher` (ExFM): the Wukong teacher on days [0, T) -> models/teacher, registered.

    lrm teacher [--data data/sessions --out models/teacher]

Trains with the training loop (lrm.train: final eval on day T), then registers the model
as a new version of `teacher.registry_name` (lrm-teacher), tagged with the model's content
hash (the teacher version the augment stage records), as @challenger; @champion moves to
it only when its NE on day T beats the champion's on day T by `registry.margin`
(lrm.registry: the decision and both NEs are tags of the version). Training values are
`train`'s with `teacher.train`'s overrides; the shape is `model.teacher` and `model.tables`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lrm import plots, tracking
from lrm.config import (
    CheckpointConfig,
    ExFMConfig,
    LoaderConfig,
    ModelConfig,
    SplitConfig,
    TableConfig,
    TeacherModelConfig,
    TeacherStageConfig,
    TrackingConfig,
    TrainConfig,
    with_overrides,
)
from stagekit import Arg, Stage, main

NAME = "teacher"


def run(*, cfg: TeacherStageConfig, base: TrainConfig, exfm: ExFMConfig,
        checkpoint: CheckpointConfig, loader: LoaderConfig, tables: TableConfig,
        model: TeacherModelConfig, margin: float, tracking_cfg: TrackingConfig,
        data: Path = Path("data/sessions"),
        days: list[int] | None = None, eval_day: int | None = None, carry: bool = False,
        plan: Path | None = None,
        out: Path = Path("models/teacher"), checkpoints: Path = Path("checkpoints/teacher"),
        metrics: Path | None = Path("metrics/teacher.json"),
        plot: Path | None = Path("plots/teacher.csv"), force: bool = False
        ) -> dict[str, Any]:
    """Train the ExFM teacher (Wukong) on days [0, T) and register it as lrm-teacher."""
    from lrm import registry
    from lrm.serving import pyfunc
    from lrm.train import build_job, train
    from lrm.train import days as carried
    from lrm.train.export import CARD, model_hash

    train_days = list(days) if days else list(range(exfm.teacher_days))
    held = exfm.teacher_days if eval_day is None else eval_day
    job = build_job("teacher", train=with_overrides(base, cfg.train),
                    model=ModelConfig(tables=tables, teacher=model), data=data,
                    split=SplitConfig(days=train_days, eval_day=held), loader=loader,
                    checkpoint=checkpoint, checkpoints=checkpoints, out=out, plan=plan,
                    info={"stream_day": held} if carry else None)
    log_fn = tracking.log_metrics if tracking.active() else None
    if not carry:
        r = train(job, log_fn=log_fn)
    elif held in carried.finished(checkpoints) and (out / CARD).is_file():
        r = None  # trained by a run that stopped after it: registered below
    else:  # day `held` of the teacher carried from day to day
        r = carried.train_day(job, checkpoints, held, owner=NAME, log_fn=log_fn)
    m = r.summary("teacher") if r is not None else {"kind": "teacher", "skipped": True}
    if carry:
        m["train"] = carried.trained(r) if r is not None else {"skipped": True}
    m["content_hash"] = model_hash(out)
    if plot is not None and r is not None and r.history:
        plots.write_lines(r.history, "step", plots.TRAINING, plot,
                          title="teacher: per logged step", stage=NAME, force=force)
    if tracking.active():
        if cfg.registry_name:
            m["registry"] = registry.challenge(
                out, cfg.registry_name, eval_data=data, eval_day=held, margin=margin,
                evaluated_on=f"day {held}", cfg=tracking_cfg).as_dict()
        else:
            pyfunc.log_model(out, data, held)
    return m


STAGE = Stage(
    name=NAME, run=run, short=("teacher", "exfm"),
    reads={"cfg": "teacher", "base": "train", "exfm": "exfm", "checkpoint": "checkpoint",
           "loader": "loader", "tables": "model.tables", "model": "model.teacher",
           "margin": "registry.margin", "tracking_cfg": "tracking"},
    args={"data": Arg("--data", "dataset folder", "in"),
          "days": Arg("--days", "train days (repeat for more) [default: [0, T)]"),
          "eval_day": Arg("--eval-day", "the day it is scored on [default: T]"),
          "carry": Arg("--carry", "carry the teacher from day to day: --checkpoints holds "
                       "its per-day folders (lrm.train.days), --eval-day is the day"),
          "plan": Arg("--plan", "sharding plan (lrm shard-plan, its entry teacher) "
                      "[default: torchrec's planner]", "in"),
          "out": Arg("--out", "the teacher's model folder", "out"),
          "checkpoints": Arg("--checkpoints", "checkpoint folder (with --carry: one "
                             "folder per day)", "state"),
          "metrics": Arg("--metrics", "stage metrics file", "metrics"),
          "plot": Arg("--plot", "loss and NE per logged step (CSV; a PNG beside it)", "plot")},
)

if __name__ == "__main__":
    main(STAGE)
