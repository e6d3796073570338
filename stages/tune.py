"""Stage `tune`: Optuna searches a model's training params on the data's own days -> a
params file the other stages take (`--params FILE`).

    lrm tune --model student --data data/sessions --out tuned.yaml [--trials N] [--minutes M]
    lrm train --model student --data data/sessions --params params.yaml --params tuned.yaml

Each trial trains the model (lrm.train's job) on the days before the validation days
(`tune.valid_days`, just before `split.eval_day`) and is scored on them; the held-out day
stays unseen, so `lrm train --params FILE` scored there judges the tuned params on a later
day than the search saw. The search space is `tune.space`, the budget `tune.trials` and
`tune.minutes`; every trial is an MLflow run nested under the stage's run. Values come from
params.yaml (`train`, `teacher.train` for the teacher, `split`, `loader`, `model.tables`,
`model.KIND`, `tune`). In a pipeline (`--if-enabled`) it searches only where
`tune.in_pipeline` is true, and otherwise writes a params file that changes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from lrm.config import (
    MODEL_KINDS,
    LoaderConfig,
    ModelConfig,
    SplitConfig,
    StudentModelConfig,
    TableConfig,
    TeacherModelConfig,
    TrainConfig,
    TuneConfig,
    with_overrides,
)
from stagekit import Arg, Metrics, Stage, main

NAME = "tune"


def run(*, kind: str, train: TrainConfig, teacher_train: Any, split: SplitConfig,
        loader: LoaderConfig, tables: TableConfig,
        model: StudentModelConfig | TeacherModelConfig, cfg: TuneConfig, data: Path,
        out: Path, plan: Path | None = None, if_enabled: bool = False,
        metrics: Path | None = None, force: bool = False) -> Metrics:
    """Search a model's training params on its validation days; write the best as a
    params file."""
    from lrm import io
    from lrm.tune import params_overlay, tune

    if if_enabled and not cfg.in_pipeline:
        io.write_text("# lrm tune: off (tune.in_pipeline is false): the params as they are\n",
                      out, stage=NAME, force=force)
        return Metrics({"kind": kind, "searched": False})
    teacher = with_overrides(train, teacher_train, "teacher.train")
    own = teacher if kind == "teacher" else train
    models = ModelConfig(tables=tables, **{kind: model})
    result = tune(kind, train=own, model=models, data=data, split=split, loader=loader,
                  cfg=cfg, plan=plan)
    doc = params_overlay(result, train=own, model=models,
                         teacher_train=teacher if kind == "student" else None)
    best, start = result.best, result.baseline
    head = (f"# lrm tune --model {kind}: the best of {len(result.trials)} trials (trial "
            f"{best.number}), NE {best.ne:.5f} on day(s) {result.valid_days}"
            + (f" (the params as they were: {start.ne:.5f})"
               if start is not None and start.ne is not None else "")
            + f";\n# trained on days {result.train_days}; day {result.eval_day} held out, "
              f"unseen by the search. Lay it over the params: --params FILE\n")
    io.write_text(head + yaml.safe_dump(doc, sort_keys=False), out, stage=NAME, force=force)
    return Metrics({**result.summary(), "searched": True})


STAGE = Stage(
    name=NAME, run=run, short=("tune",), label=("kind",),
    reads={"train": "train", "teacher_train": "teacher.train", "split": "split",
           "loader": "loader", "tables": "model.tables", "model": "model.{kind}",
           "cfg": "tune"},
    args={
        "kind": Arg("--model", "which model to tune", choices=MODEL_KINDS),
        "data": Arg("--data", "dataset folder", "in"),
        "out": Arg("--out", "the params file to write (YAML)", "out", file=True, cache=False),
        "plan": Arg("--plan", "sharding plan (lrm shard-plan) [default: torchrec's planner]",
                    "in"),
        "if_enabled": Arg("--if-enabled", "search only where tune.in_pipeline is true (a "
                          "pipeline's node); else write a params file that changes nothing"),
        "metrics": Arg("--metrics", "stage metrics file: every trial, the best", "metrics"),
    },
    derived={"metrics": "metrics/tune_{kind}.json"},
)

if __name__ == "__main__":
    main(STAGE)
