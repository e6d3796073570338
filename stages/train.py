"""Stage `train`: a teacher or student on a dataset -> the model folder, checkpoints, MLflow.

    lrm train --model student --data data/sessions --out models/student
    python -m stages.train --model student --data data/sessions --out models/student
    python -m lrm.launch --nproc-per-node=2 -m stages.train --model student --data ...

One process initializes a 1-rank gloo group itself; launched as several (lrm.launch, or
torchrun across hosts) every process trains its share of each batch (gloo on CPU, nccl
with one GPU per process); `--plan` places the tables as plans/sharding.json says (stage
shard_plan, its entry KIND). Values come from params.yaml (`train`, `split`, `checkpoint`,
`loader`, `model.tables`, `model.KIND`; the teacher's training values are `train` under
`teacher.train`'s overrides, ParamsConfig.train_for); every `--section.key` option overrides
one.
Periodic checkpoints go to `--checkpoints` (kept out of DVC's outputs); `--resume` goes on
from the newest one (exit 2 where that folder is missing or holds no checkpoint: a typo
would start afresh); a run without it refuses a checkpoint folder holding another run's
checkpoints (another --out) unless `--force`. Only rank 0 logs to MLflow (params, per-step
metrics, the final model as a pyfunc) and writes the metrics and plot.
"""

from __future__ import annotations

from pathlib import Path

from lrm import plots, tracking
from lrm.config import (
    MODEL_KINDS,
    CheckpointConfig,
    LoaderConfig,
    ModelConfig,
    SplitConfig,
    StudentModelConfig,
    TableConfig,
    TeacherModelConfig,
    TrainConfig,
)
from stagekit import Arg, Metrics, Stage, main

NAME = "train"


def can_step(train: TrainConfig, rows: int) -> bool:
    """Whether `rows` impressions give this stage's training job one step at the smallest
    batch its schedule takes (a first day and a day carried over alike): what a stream day
    asks before it is made (lrm.streaming.days.unfit), since the stream trains only through
    the stages and knows no training schedule of its own."""
    from lrm.train.schedule import can_step as job_can_step

    return job_can_step(train, rows)


def run(*, kind: str, train: TrainConfig, split: SplitConfig,
        checkpoint: CheckpointConfig, loader: LoaderConfig, tables: TableConfig,
        model: StudentModelConfig | TeacherModelConfig, data: Path = Path("data/sessions"),
        plan: Path | None = None, out: Path | None = None, checkpoints: Path | None = None,
        resume: bool = False, eval_data: Path | None = None,
        metrics: Path | None = None, plot: Path | None = None, force: bool = False
        ) -> Metrics:
    """Train the teacher or the student (DMP, fused row-wise Adagrad, periodic checkpoints)."""
    from lrm.checkpoint import resumable  # here: lrm.checkpoint imports fbgemm (flows/cli.py)
    from lrm.fp8.dispatch import transform
    from lrm.train import build_job
    from lrm.train import train as train_model

    if resume:  # a resume that finds nothing to go on from is a mistake, not a fresh start
        resumable(checkpoints)
    job = build_job(kind, train=train, model=ModelConfig(tables=tables, **{kind: model}),
                    data=data, split=split, loader=loader, checkpoint=checkpoint,
                    checkpoints=checkpoints, start="resume" if resume else "fresh",
                    eval_data=eval_data, out=out, plan=plan,
                    transform=transform(train.fp8, kind), force=force)
    result = train_model(job, log_fn=tracking.log_metrics if tracking.active() else None)
    if out is not None and tracking.active():
        from lrm.serving import pyfunc

        pyfunc.log_model(out, eval_data or data, result.eval_day)
    if plot is not None and result.history:
        plots.write_lines(result.history, "step", plots.TRAINING, plot,
                          title=f"train {kind}: per logged step", stage=NAME, force=force)
    return Metrics(result.summary(kind))


STAGE = Stage(
    name=NAME, run=run, short=("train", "split"), label=("kind",), trains="{kind}",
    reads={"split": "split", "checkpoint": "checkpoint", "loader": "loader",
           "tables": "model.tables", "model": "model.{kind}"},
    args={
        "kind": Arg("--model", "which model to train", choices=MODEL_KINDS),
        "data": Arg("--data", "dataset folder", "in"),
        "plan": Arg("--plan", "sharding plan (lrm shard-plan) [default: torchrec's planner]",
                    "in"),
        "out": Arg("--out", "final model folder [default: models/KIND]", "out"),
        "checkpoints": Arg("--checkpoints", "checkpoint folder [default: checkpoints/KIND]",
                           "state"),
        "resume": Arg("--resume", "go on from the newest checkpoint"),
        "eval_data": Arg("--eval-data", "dataset whose split.eval_day is held out (every day "
                         "of --data then trains) [default: --data's own]", "in"),
        "metrics": Arg("--metrics", "stage metrics file (default: metrics/train_KIND.json)",
                       "metrics"),
        "plot": Arg("--plot", "loss and NE per logged step (CSV; a PNG beside it)", "plot"),
    },
    aliases={"loader.recd": ("--dedup",), "checkpoint.every": ("--checkpoint-every",),
             "checkpoint.keep": ("--keep-checkpoints",)},
    derived={"out": "models/{kind}", "checkpoints": "checkpoints/{kind}",
              "metrics": "metrics/train_{kind}.json"},
)

if __name__ == "__main__":
    main(STAGE)
