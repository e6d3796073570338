"""Stage `student` (ExFM): every student x variant, day by day on augmented data -> NE table.

    lrm student [--data data/augmented --out models/students]
    lrm student --day D --name small --eval-data DIR --eval-day E   (one day: the stream's)

For each student size in `students.models` and each variant in `students.variants`
(labels only, distillation on the serving head, auxiliary head, auxiliary head + adapter:
lrm.exfm.distill), trains day by day on the days after T as one model carried from day to
day (lrm.train.days: the model and the optimizers' state; `--checkpoints` holds a chain of
per-day folders for each), evaluated on the next day. Training values are `train`'s with
`students.train`'s overrides; tables are `model.tables`. Writes

    models/students/NAME/VARIANT/   the last day's model (its serving head is `forward`)
    metrics/exfm.json               the table on the last evaluation day + NE per day
    metrics/exfm.md                 the same table as markdown
    plots/exfm_ne.csv (+ .png)      NE per evaluation day: teacher and every student/variant

The teacher's NE per day comes from the augment manifests (its logits are in the data).

With `--day D` it is one day of the same procedure, as the streaming flow runs it: each
student (or `--name`'s) in the serving variant (`registry.variant`) carried on to day D from
its chain (`--checkpoints`/NAME), scored on `--eval-day` of `--eval-data`, its model in
`--out`/NAME/VARIANT; no table. A day already trained (its chain's day finished, its model
there) is not trained again.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from lrm import io, plots, progress, tracking
from lrm.config import (
    CheckpointConfig,
    DistillConfig,
    ExFMConfig,
    LoaderConfig,
    ModelConfig,
    StudentModelConfig,
    StudentStageConfig,
    TableConfig,
    TrainConfig,
    with_overrides,
)
from stagekit import Arg, Stage, main

NAME = "student"


def run(*, cfg: StudentStageConfig, base: TrainConfig, exfm: ExFMConfig, loader: LoaderConfig,
        tables: TableConfig, checkpoint: CheckpointConfig, serving: str,
        data: Path = Path("data/augmented"), plan: Path | None = None,
        out: Path = Path("models/students"), checkpoints: Path = Path("checkpoints/students"),
        day: int | None = None, name: str | None = None, eval_data: Path | None = None,
        eval_day: int | None = None, metrics: Path | None = Path("metrics/exfm.json"),
        table: Path | None = Path("metrics/exfm.md"),
        plot: Path | None = Path("plots/exfm_ne.csv"), force: bool = False) -> dict[str, Any]:
    """Train every ExFM student variant day by day and write the NE table."""
    from lrm.exfm import students as S  # torch import: only when the stage runs
    from lrm.train import build_job

    train_cfg = with_overrides(base, cfg.train)
    log_fn = tracking.log_metrics if tracking.active() else None

    def job(size: StudentModelConfig, variant: DistillConfig, student: str, dst: Path) -> Any:
        return build_job("student", train=train_cfg, model=ModelConfig(tables=tables,
                                                                       student=size),
                         data=data, loader=loader, checkpoint=checkpoint, out=dst, plan=plan,
                         plan_entry=f"students.{student}", distill=variant,
                         eval_data=eval_data if day is not None else None)

    if day is not None:
        return _one_day(cfg, serving, job, out, checkpoints, day, name, eval_day, log_fn)
    days = S.student_days(data, exfm.teacher_days, cfg.days)
    teacher = S.teacher_per_day(data, [d + 1 for d in days])
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with io.atomic_dir(out, stage=NAME, force=force) as tmp:
        for student, size in cfg.models.items():
            results[student] = {}
            for variant, dcfg in cfg.variants.items():
                chain = checkpoints / student / variant
                if io.owned_by_lrm(chain) == NAME:  # another run's days: this run starts over
                    shutil.rmtree(chain)
                with progress.context(student=student, variant=variant):
                    results[student][variant] = S.stream_student(
                        job(size, dcfg, student, tmp / student / variant), days, chain,
                        owner=NAME, log_fn=log_fn)
    rep = S.report(results, teacher, exfm.teacher_days)
    rep["days"] = {"train": days, "eval": [d + 1 for d in days]}
    rep["per_day_detail"] = results
    if table is not None:
        io.write_text(S.markdown(rep["table"]), table, stage=NAME, force=force)
    ys = [k for k in rep["per_day"][0] if k != "day"] if rep["per_day"] else []
    if plot is not None:
        plots.write_lines(rep["per_day"], "day", {plots.NE: ys}, plot,
                          title="ExFM: NE per evaluation day", stage=NAME, force=force)
    for point in rep["per_day"]:
        tracking.log_metrics({f"ne_per_day/{k}": v for k, v in point.items() if k != "day"},
                             step=point["day"])
    return rep


def _one_day(cfg: StudentStageConfig, serving: str, job: Any, out: Path, checkpoints: Path,
             day: int, name: str | None, eval_day: int | None, log_fn: Any) -> dict[str, Any]:
    """Day `day` of each student (or `name`) in the serving variant (module docstring)."""
    from lrm.config import SplitConfig
    from lrm.errors import ConfigError
    from lrm.train import days as carried
    from lrm.train.export import CARD

    if serving not in cfg.variants:
        raise ConfigError(f"registry.variant: {serving!r} is not one of students.variants "
                          f"{sorted(cfg.variants)}")
    names = [name] if name is not None else list(cfg.models)
    unknown = [n for n in names if n not in cfg.models]
    if unknown:
        raise ConfigError(f"--name: {unknown[0]!r} is not one of students.models "
                          f"{sorted(cfg.models)}")
    held = day + 1 if eval_day is None else eval_day
    io.claim_dir(out, NAME)  # the day's models: lrm's, replaceable by this stage's next run
    done: dict[str, Any] = {}
    for student in names:
        chain, dst = checkpoints / student, out / student / serving
        if day in carried.finished(chain) and (dst / CARD).is_file():
            done[student] = {"skipped": True, "model": str(dst)}  # a run that stopped after it
            continue
        j = job(cfg.models[student], cfg.variants[serving], student, dst)
        with progress.context(student=student, variant=serving, day=day):
            r = carried.train_day(j.but(split=SplitConfig(days=[day], eval_day=held)), chain,
                                  day, owner=NAME, log_fn=log_fn)
        done[student] = {**carried.trained(r), "model": str(dst)}
    return {"day": day, "eval_day": held, "variant": serving, "students": done}


STAGE = Stage(
    name=NAME, run=run, short=("students",), label=("name",),
    reads={"cfg": "students", "base": "train", "exfm": "exfm", "loader": "loader",
           "tables": "model.tables", "checkpoint": "checkpoint", "serving": "registry.variant"},
    args={"data": Arg("--data", "augmented dataset", "in"),
          "plan": Arg("--plan", "sharding plan (lrm shard-plan, its entries students.NAME) "
                      "[default: torchrec's planner]", "in"),
          "out": Arg("--out", "folder of the students' models", "out"),
          "checkpoints": Arg("--checkpoints", "the students' per-day checkpoint folders "
                             "(NAME/VARIANT; with --day: NAME)", "state"),
          "day": Arg("--day", "train this day only, in the serving variant (the stream's)"),
          "name": Arg("--name", "with --day: this student only [default: every one]"),
          "eval_data": Arg("--eval-data", "with --day: the dataset scored [default: --data]",
                           "in"),
          "eval_day": Arg("--eval-day", "with --day: the day scored [default: the next]"),
          "metrics": Arg("--metrics", "the ExFM report (JSON)", "metrics"),
          "table": Arg("--table", "the ExFM table (markdown)", "out", file=True, cache=False),
          "plot": Arg("--plot", "NE per day (CSV; a PNG beside it)", "plot")},
)

if __name__ == "__main__":
    main(STAGE)
