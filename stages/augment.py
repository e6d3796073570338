"""Stage `augment` (ExFM's data augmentation system): the teacher's logit per impression.

    lrm augment
    python -m stages.augment --data data/sessions --teacher models/teacher --out data/augmented

The teacher scores every impression of the students' days (augment.days, default every
day from T = exfm.teacher_days on) into `data/augmented/day=D/` (lrm.exfm.augment): the
sessions layout plus `teacher_logit`, the teacher version in the Parquet metadata and in a
per-day manifest. A day already augmented by the same teacher from the same input is
skipped (dvc.yaml keeps the folder with `persist: true` so that this matters). The teacher
version is its content hash plus, when the MLflow registry has it, the registered version
whose `lrm.content_hash` tag matches.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import typer

from lrm import registry
from lrm.config import AugmentConfig, ExFMConfig, TrackingConfig
from lrm.errors import LrmError
from stages._common import ParamsOption, fail, load_config, section, stage

OUT = Path("data/augmented")
METRICS = Path("metrics/augment.json")
log = logging.getLogger("lrm")


def registry_version(name: str, content_hash: str, cfg: TrackingConfig | None = None
                     ) -> str | None:
    """"NAME/VERSION" of the registered teacher with this content hash, None if unknown."""
    try:
        v = registry.find_model_version(name, registry.HASH_TAG, content_hash, cfg=cfg)
    except Exception as e:  # noqa: BLE001  (the registry is optional metadata here)
        log.warning("augment: MLflow registry not reachable (%s): recording the hash only", e)
        return None
    return f"{name}/{v}" if v is not None else None


def run(cfg: AugmentConfig, exfm: ExFMConfig, data: Path, teacher: Path, out: Path = OUT, *,
        force: bool = False, registry_name: str | None = "lrm-teacher",
        tracking_cfg: TrackingConfig | None = None) -> dict[str, Any]:
    from lrm.data.schema import day_files  # pyarrow import: only when a stage runs
    from lrm.exfm.augment import augment_dataset, teacher_hash

    days = list(cfg.days) or [d for d in day_files(data) if d >= exfm.teacher_days]
    content = teacher_hash(teacher)  # hashed once: the registry lookup and the manifests
    reg = registry_version(registry_name, content, tracking_cfg) if registry_name else None
    return augment_dataset(teacher, data, out, days, batch_size=cfg.batch_size, registry=reg,
                           force=force, content_hash=content)


def command(
    data: Path = typer.Option(Path("data/sessions"), "--data", help="dataset to augment"),
    teacher: Path = typer.Option(Path("models/teacher"), "--teacher", help="teacher model"),
    out: Path = typer.Option(OUT, "--out", help="augmented dataset folder"),
    force: bool = typer.Option(False, "--force", help="rewrite days already augmented"),
    params: Path = ParamsOption,
    metrics: Path = typer.Option(METRICS, help="stage metrics file"),
) -> None:
    """Log the teacher's prediction beside every impression of the students' days."""
    cfg, p = load_config(params, "augment", AugmentConfig)
    try:
        exfm = section(p, "exfm", ExFMConfig)
        tcfg = section(p, "tracking", TrackingConfig)
        registry_name = (p.get("teacher") or {}).get("registry_name", "lrm-teacher")
    except LrmError as e:
        raise fail(e) from None
    extra = {"data": str(data), "teacher": str(teacher), "exfm": dataclasses.asdict(exfm)}
    with stage("augment", cfg, p, metrics, extra_params=extra) as m:
        m.update(run(cfg, exfm, data, teacher, out, force=force, registry_name=registry_name,
                     tracking_cfg=tcfg))


if __name__ == "__main__":
    typer.run(command)
