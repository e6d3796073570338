"""Stage `student` (ExFM): every student x variant, day by day on augmented data -> NE table.

    lrm student
    python -m stages.student --data data/augmented --out models/students

Tables come from `model.tables` (shared with the teacher). For each student size in
`students.models` and each variant in `students.variants`
(labels only, distillation on the serving head, auxiliary head, auxiliary head + adapter:
see lrm.exfm.distill), trains day by day on the days after T (lrm.exfm.students), each
day going on from the previous day's model and evaluated on the next day. Writes

    models/students/NAME/VARIANT/   the last day's model (its serving head is `forward`)
    metrics/exfm.json               the table on the last evaluation day + NE per day
    metrics/exfm.md                 the same table as markdown
    plots/exfm_ne.csv               NE per evaluation day: teacher and every student/variant

The teacher's NE per day comes from the augment manifests (its logits are in the data).
"""

from __future__ import annotations

import csv
import dataclasses
import io as _io
import logging
from pathlib import Path
from typing import Any

import typer

from lrm import io, tracking
from lrm.config import ExFMConfig, LoaderConfig, ModelConfig, StudentsConfig, TableConfig
from lrm.errors import LrmError
from stages._common import ParamsOption, fail, load_config, section, stage

OUT = Path("models/students")
METRICS = Path("metrics/exfm.json")
PLOT = Path("plots/exfm_ne.csv")
log = logging.getLogger("lrm")


def write_plot(per_day: list[dict[str, Any]], path: Path) -> None:
    """NE per evaluation day, one column per model (wide CSV for `dvc plots`), atomically."""
    cols = list(per_day[0]) if per_day else ["day"]
    buf = _io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for row in per_day:
        w.writerow({k: (f"{v:.6f}" if isinstance(v, float) else v) for k, v in row.items()})
    io.write_text(buf.getvalue(), path)


def run(cfg: StudentsConfig, exfm: ExFMConfig, data: Path, out: Path = OUT, *,
        tables: TableConfig | None = None, loader_cfg: LoaderConfig | None = None,
        metrics: Path = METRICS, plot: Path = PLOT, log_mlflow: bool = False) -> dict[str, Any]:
    from lrm.exfm import students as S  # torch import: only when a stage runs

    days = S.student_days(data, exfm.teacher_days, cfg.days)
    teacher = S.teacher_per_day(data, [d + 1 for d in days])
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for name, size in cfg.models.items():
        results[name] = {}
        for variant, dcfg in cfg.variants.items():
            log.info("student %s, variant %s: days %s", name, variant, days)
            results[name][variant] = S.stream_student(
                size, dcfg, cfg.train, data, days, out / name / variant, tables=tables,
                loader_cfg=loader_cfg)
    rep = S.report(results, teacher, exfm.teacher_days)
    rep["days"] = {"train": days, "eval": [d + 1 for d in days]}
    rep["per_day_detail"] = results
    io.write_json(rep, metrics)
    io.write_text(S.markdown(rep["table"]), metrics.with_suffix(".md"))
    write_plot(rep["per_day"], plot)
    if log_mlflow:
        for point in rep["per_day"]:
            tracking.log_metrics({f"ne_per_day/{k}": v for k, v in point.items() if k != "day"},
                                 step=point["day"])
    return {"eval_day": rep["eval_day"], "teacher": rep["teacher"],
            "students": rep["students"], "gain_vs_labels_only": rep["gain_vs_labels_only"]}


def command(
    data: Path = typer.Option(Path("data/augmented"), "--data", help="augmented dataset"),
    out: Path = typer.Option(OUT, "--out", help="folder of the students' models"),
    params: Path = ParamsOption,
    metrics: Path = typer.Option(METRICS, help="the ExFM table (JSON; .md beside it)"),
    plot: Path = typer.Option(PLOT, help="NE per day (CSV)"),
) -> None:
    """Train every ExFM student variant day by day and write the NE table."""
    cfg, p = load_config(params, "students", StudentsConfig)
    try:
        exfm = section(p, "exfm", ExFMConfig)
        tables = section(p, "model", ModelConfig).tables
        loader_cfg = section(p, "loader", LoaderConfig)
    except LrmError as e:
        raise fail(e) from None
    extra = {"data": str(data), "exfm": dataclasses.asdict(exfm),
             "tables": dataclasses.asdict(tables)}
    with stage("student", cfg, p, None, extra_params=extra) as m:
        m.update(run(cfg, exfm, data, out, tables=tables, loader_cfg=loader_cfg,
                     metrics=metrics, plot=plot, log_mlflow=True))


if __name__ == "__main__":
    typer.run(command)
