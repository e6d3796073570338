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
    TrainConfig,
    with_overrides,
)
from stages._common import Arg, Stage, main

NAME = "teacher"


def run(*, cfg: TeacherStageConfig, base: TrainConfig, exfm: ExFMConfig,
        checkpoint: CheckpointConfig, loader: LoaderConfig, tables: TableConfig,
        model: TeacherModelConfig, margin: float, data: Path = Path("data/sessions"),
        plan: Path | None = None,
        out: Path = Path("models/teacher"), checkpoints: Path = Path("checkpoints/teacher"),
        metrics: Path | None = Path("metrics/teacher.json"),
        plot: Path | None = Path("plots/teacher.csv"), force: bool = False
        ) -> dict[str, Any]:
    """Train the ExFM teacher (Wukong) on days [0, T) and register it as lrm-teacher."""
    from lrm import registry
    from lrm.exfm.augment import teacher_hash
    from lrm.fp8.dispatch import transform
    from lrm.serving import pyfunc
    from lrm.sharding.plan import training_plan
    from lrm.train import train

    T = exfm.teacher_days
    train_cfg, model_cfg = with_overrides(base, cfg.train), ModelConfig(tables=tables,
                                                                        teacher=model)
    sharding = None if plan is None else training_plan(
        plan, "teacher", kind="teacher", model_cfg=model_cfg, data=data,
        device=train_cfg.device)
    result = train("teacher", train_cfg, model_cfg, data,
                   split=SplitConfig(days=list(range(T)), eval_day=T), loader_cfg=loader,
                   checkpoint=checkpoint, checkpoints=checkpoints, out=out, plan=sharding,
                   transform=transform(train_cfg.fp8, "teacher"),
                   log_fn=tracking.log_metrics if tracking.active() else None)
    m = result.summary("teacher")
    m["content_hash"] = teacher_hash(out)
    if plot is not None and result.history:
        plots.write_lines(result.history, "step", ["loss", "ne_window", "eval_ne"], plot,
                          title="teacher: per logged step", stage=NAME, force=force)
    if tracking.active():
        if cfg.registry_name:
            m["registry"] = registry.challenge(
                out, cfg.registry_name, eval_data=data, eval_day=result.eval_day,
                margin=margin, evaluated_on=f"day {result.eval_day}").as_dict()
        else:
            pyfunc.log_model(out, data, result.eval_day)
    return m


STAGE = Stage(
    name=NAME, run=run, short=("teacher", "exfm"),
    reads={"cfg": "teacher", "base": "train", "exfm": "exfm", "checkpoint": "checkpoint",
           "loader": "loader", "tables": "model.tables", "model": "model.teacher",
           "margin": "registry.margin"},
    args={"data": Arg("--data", "dataset folder", "in"),
          "plan": Arg("--plan", "sharding plan (lrm shard-plan, its entry teacher) "
                      "[default: torchrec's planner]", "in"),
          "out": Arg("--out", "the teacher's model folder", "out"),
          "checkpoints": Arg("--checkpoints", "checkpoint folder", "state"),
          "metrics": Arg("--metrics", "stage metrics file", "metrics"),
          "plot": Arg("--plot", "loss and NE per logged step (CSV; a PNG beside it)", "plot")},
)

if __name__ == "__main__":
    main(STAGE)
