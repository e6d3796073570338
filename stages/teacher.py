"""Stage `teacher` (ExFM): the Wukong teacher on days [0, T) -> models/teacher, registered.

    lrm teacher
    python -m stages.teacher --data data/sessions --out models/teacher

Trains with the ordinary training stage (stages.train.run: lrm.train.loop.train, final
eval on day T, the pyfunc logged to the MLflow run), then registers the logged model as
`teacher.registry_name` (lrm-teacher) in the MLflow model registry, tags the version with
the model's content hash (the teacher version the augment stage records) and points the
alias `teacher.alias` (champion) at it: MLflow 3 aliases, not the deprecated stages.
Values come from params.yaml: `exfm` (T = exfm.teacher_days), `teacher` (training,
registry), `model.teacher` and `model.tables` (the teacher's shape, shared with `train`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import typer

from lrm import registry
from lrm.config import ExFMConfig, LoaderConfig, ModelConfig, TeacherStageConfig
from lrm.errors import LrmError
from stages import train as train_stage
from stages._common import ParamsOption, fail, load_config, section, stage

OUT = Path("models/teacher")
METRICS = Path("metrics/teacher.json")


def run(cfg: TeacherStageConfig, exfm: ExFMConfig, model_cfg: ModelConfig, data: Path,
        out: Path = OUT, *,
        loader_cfg: LoaderConfig | None = None, checkpoints: Path | None = None,
        log_mlflow: bool = False) -> dict[str, Any]:
    """Train the teacher on days [0, T), evaluate on day T; register it when logging."""
    from lrm.exfm.augment import teacher_hash  # torch import: only when a stage runs

    T = exfm.teacher_days
    train_cfg = dataclasses.replace(cfg.train, days=list(range(T)), eval_day=T)
    m = train_stage.run("teacher", train_cfg, model_cfg, data, out, loader_cfg=loader_cfg,
                        checkpoints=checkpoints, log_mlflow=log_mlflow)
    content = teacher_hash(out)
    m["content_hash"] = content
    if log_mlflow and cfg.registry_name:
        version = registry.register_last_logged(cfg.registry_name, content,
                                                aliases=[cfg.alias] if cfg.alias else [])
        m["registry"] = {"name": cfg.registry_name, "version": version, "alias": cfg.alias}
    return m


def command(
    data: Path = typer.Option(Path("data/sessions"), "--data", help="dataset folder"),
    out: Path = typer.Option(OUT, "--out", help="the teacher's model folder"),
    checkpoints: Path = typer.Option(Path("checkpoints/teacher"), help="checkpoint folder"),
    teacher_days: int = typer.Option(None, help="T: train on days [0, T) (exfm.teacher_days)"),
    params: Path = ParamsOption,
    metrics: Path = typer.Option(METRICS, help="stage metrics file"),
) -> None:
    """Train the ExFM teacher (Wukong) on days [0, T) and register it as lrm-teacher."""
    cfg, p = load_config(params, "teacher", TeacherStageConfig)
    try:
        exfm = section(p, "exfm", ExFMConfig, {"teacher_days": teacher_days})
        model_cfg = section(p, "model", ModelConfig)
        loader_cfg = section(p, "loader", LoaderConfig)
    except LrmError as e:
        raise fail(e) from None
    extra = {"data": str(data), "exfm": dataclasses.asdict(exfm),
             "model": {"teacher": dataclasses.asdict(model_cfg.teacher),
                       "tables": dataclasses.asdict(model_cfg.tables)}}
    with stage("teacher", cfg, p, metrics, extra_params=extra) as m:
        m.update(run(cfg, exfm, model_cfg, data, out, loader_cfg=loader_cfg,
                     checkpoints=checkpoints, log_mlflow=True))


if __name__ == "__main__":
    typer.run(command)
