"""Stage `augment` (ExFM's data augmentation system): the teacher's logit per impression.

    lrm augment [--data data/sessions --teacher models/teacher --out data/augmented]

Each day some version of the foundation model serves (models/teacher/versions.json: the
version trained through `exfm.teacher_lag` days before it, lrm.exfm.schedule) is scored by
that version into `data/augmented/day=D/` (lrm.exfm.augment): the sessions layout plus
`teacher_logit`, the teacher version in the Parquet metadata and in a per-day manifest with
the teacher's NE per vertical. `--teacher` may also be one model folder (the stream's
champion), which then logs `augment.days`. A day already augmented by the same teacher from
the same input is skipped (dvc.yaml keeps the folder with `persist: true` so that this
matters); `--rewrite` redoes it. The teacher version is its content hash plus, when the
MLflow registry has it, the registered version whose content-hash tag matches.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lrm.config import AugmentConfig, TrackingConfig
from stagekit import Arg, Stage, main

NAME = "augment"
log = logging.getLogger("lrm")


@dataclass(frozen=True)
class Augmented:
    """The stage's result: the days written and skipped (the stream's record), the report."""

    written: list[int]
    skipped: list[int]
    report: dict[str, Any]  # lrm.exfm.augment.augment_dataset's: the metrics file

    @classmethod
    def of(cls, report: dict[str, Any]) -> Augmented:
        return cls(written=list(report["written"]), skipped=list(report["skipped"]),
                   report=report)

    def metrics(self) -> dict[str, Any]:
        return self.report


def run(*, cfg: AugmentConfig, registry_name: str, tracking: TrackingConfig,
        data: Path = Path("data/sessions"), teacher: Path = Path("models/teacher"),
        out: Path = Path("data/augmented"), metrics: Path | None = Path("metrics/augment.json"),
        rewrite: bool = False) -> Augmented:
    """Log the teacher's prediction beside every impression of the students' days."""
    from lrm import registry
    from lrm.data.schema import day_files
    from lrm.exfm import fm
    from lrm.exfm.augment import augment_dataset
    from lrm.models.saved import CARD

    def registered(content: str) -> str | None:
        if not registry_name:
            return None
        try:
            v = registry.find_model_version(registry_name, registry.HASH_TAG, content,
                                            cfg=tracking)
        except Exception as e:  # noqa: BLE001  (the registry is optional metadata here)
            log.warning("MLflow registry not reachable (%s): recording the hash only", e)
            return None
        return f"{registry_name}/{v}" if v is not None else None

    if (Path(teacher) / CARD).is_file():  # one model logs the days asked for
        days = list(cfg.days) or sorted(day_files(data))
        return Augmented.of(augment_dataset(teacher, data, out, days,
                                            batch_size=cfg.batch_size, registry=registered,
                                            force=rewrite))
    teachers = fm.teachers_by_day(teacher, list(cfg.days) or sorted(day_files(data)))
    # the FM's schedule is the whole dataset: a previous schedule's days, left in `out`,
    # would pass for this FM's with the students
    return Augmented.of(augment_dataset(teachers, data, out, batch_size=cfg.batch_size,
                                        registry=registered, force=rewrite, prune=True))


STAGE = Stage(
    name=NAME, run=run, short=("augment",),
    reads={"cfg": "augment", "registry_name": "teacher.registry_name", "tracking": "tracking"},
    args={"data": Arg("--data", "dataset to augment (sessions layout)", "in"),
          "teacher": Arg("--teacher", "the foundation model's versions (lrm teacher), or one "
                         "model folder", "in"),
          "out": Arg("--out", "augmented dataset folder", "out", persist=True),
          "metrics": Arg("--metrics", "stage metrics file", "metrics"),
          "rewrite": Arg("--rewrite", "augment again the days already augmented by this "
                                      "teacher")},
)

if __name__ == "__main__":
    main(STAGE)
