"""Stage `student` (ExFM): every student x variant, day by day on augmented data -> NE table.

    lrm student [--data data/augmented --out models/students]

For each student size in `students.models` and each variant in `students.variants`
(labels only, distillation on the serving head, auxiliary head, auxiliary head + adapter:
lrm.exfm.distill), trains day by day on the days after T (lrm.exfm.students), each day
going on from the previous day's model and evaluated on the next day. Training values are
`train`'s with `students.train`'s overrides; tables are `model.tables`. Writes

    models/students/NAME/VARIANT/   the last day's model (its serving head is `forward`)
    metrics/exfm.json               the table on the last evaluation day + NE per day
    metrics/exfm.md                 the same table as markdown
    plots/exfm_ne.csv (+ .png)      NE per evaluation day: teacher and every student/variant

The teacher's NE per day comes from the augment manifests (its logits are in the data).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lrm import io, plots, progress, tracking
from lrm.config import (
    ExFMConfig,
    LoaderConfig,
    StudentStageConfig,
    TableConfig,
    TrainConfig,
    with_overrides,
)
from stages._common import Arg, Stage, main

NAME = "student"


def run(*, cfg: StudentStageConfig, base: TrainConfig, exfm: ExFMConfig, loader: LoaderConfig,
        tables: TableConfig, data: Path = Path("data/augmented"), plan: Path | None = None,
        out: Path = Path("models/students"), metrics: Path | None = Path("metrics/exfm.json"),
        table: Path = Path("metrics/exfm.md"), plot: Path = Path("plots/exfm_ne.csv"),
        force: bool = False) -> dict[str, Any]:
    """Train every ExFM student variant day by day and write the NE table."""
    from lrm.config import ModelConfig
    from lrm.exfm import students as S  # torch import: only when the stage runs
    from lrm.fp8.dispatch import transform
    from lrm.sharding.plan import training_plan

    days = S.student_days(data, exfm.teacher_days, cfg.days)
    teacher = S.teacher_per_day(data, [d + 1 for d in days])
    train_cfg = with_overrides(base, cfg.train)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with io.atomic_dir(out, stage=NAME, force=force) as tmp:
        for name, size in cfg.models.items():
            results[name] = {}
            sharding = None if plan is None else training_plan(
                plan, f"students.{name}", kind="student", data=data,
                model_cfg=ModelConfig(tables=tables, student=size), device=train_cfg.device)
            for variant, dcfg in cfg.variants.items():
                with progress.context(student=name, variant=variant):
                    results[name][variant] = S.stream_student(
                        size, dcfg, train_cfg, data, days, tmp / name / variant,
                        tables=tables, loader_cfg=loader, plan=sharding,
                        transform=transform(train_cfg.fp8, "student"))
    rep = S.report(results, teacher, exfm.teacher_days)
    rep["days"] = {"train": days, "eval": [d + 1 for d in days]}
    rep["per_day_detail"] = results
    io.write_text(S.markdown(rep["table"]), table, stage=NAME, force=force)
    ys = [k for k in rep["per_day"][0] if k != "day"] if rep["per_day"] else []
    plots.write_lines(rep["per_day"], "day", ys, plot, ylabel="NE (lower is better)",
                      title="ExFM: NE per evaluation day", stage=NAME, force=force)
    for point in rep["per_day"]:
        tracking.log_metrics({f"ne_per_day/{k}": v for k, v in point.items() if k != "day"},
                             step=point["day"])
    return rep


STAGE = Stage(
    name=NAME, run=run, short=("students",),
    reads={"cfg": "students", "base": "train", "exfm": "exfm", "loader": "loader",
           "tables": "model.tables"},
    args={"data": Arg("--data", "augmented dataset", "in"),
          "plan": Arg("--plan", "sharding plan (lrm shard-plan, its entries students.NAME) "
                      "[default: torchrec's planner]", "in"),
          "out": Arg("--out", "folder of the students' models", "out"),
          "metrics": Arg("--metrics", "the ExFM report (JSON)", "metrics"),
          "table": Arg("--table", "the ExFM table (markdown)", "out", file=True, cache=False),
          "plot": Arg("--plot", "NE per day (CSV; a PNG beside it)", "plot")},
)

if __name__ == "__main__":
    main(STAGE)
