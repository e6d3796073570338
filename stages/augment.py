"""Stage `augment` (ExFM's data augmentation system): the teacher's logit per impression.

    lrm augment [--data data/sessions --teacher models/teacher --out data/augmented]

The teacher scores every impression of the students' days (augment.days, default every
day from T = exfm.teacher_days on) into `data/augmented/day=D/` (lrm.exfm.augment): the
sessions layout plus `teacher_logit`, the teacher version in the Parquet metadata and in a
per-day manifest. A day already augmented by the same teacher from the same input is
skipped (dvc.yaml keeps the folder with `persist: true` so that this matters); `--rewrite`
redoes it. The teacher version is its content hash plus, when the MLflow registry has it,
the registered version whose content-hash tag matches.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lrm.config import AugmentConfig, ExFMConfig, TrackingConfig
from stagekit import Arg, Stage, main

NAME = "augment"
log = logging.getLogger("lrm")


def run(*, cfg: AugmentConfig, exfm: ExFMConfig, registry_name: str,
        tracking: TrackingConfig, data: Path = Path("data/sessions"),
        teacher: Path = Path("models/teacher"), out: Path = Path("data/augmented"),
        metrics: Path | None = Path("metrics/augment.json"), rewrite: bool = False
        ) -> dict[str, Any]:
    """Log the teacher's prediction beside every impression of the students' days."""
    from lrm import registry
    from lrm.data.schema import day_files
    from lrm.exfm.augment import augment_dataset
    from lrm.train.export import model_hash

    days = list(cfg.days) or [d for d in day_files(data) if d >= exfm.teacher_days]
    content = model_hash(teacher)  # hashed once: the registry lookup and the manifests
    version = None
    if registry_name:
        try:
            v = registry.find_model_version(registry_name, registry.HASH_TAG, content,
                                            cfg=tracking)
            version = f"{registry_name}/{v}" if v is not None else None
        except Exception as e:  # noqa: BLE001  (the registry is optional metadata here)
            log.warning("MLflow registry not reachable (%s): recording the hash only", e)
    return augment_dataset(teacher, data, out, days, batch_size=cfg.batch_size,
                           registry=version, force=rewrite, content_hash=content)


STAGE = Stage(
    name=NAME, run=run, short=("augment",),
    reads={"cfg": "augment", "exfm": "exfm", "registry_name": "teacher.registry_name",
           "tracking": "tracking"},
    args={"data": Arg("--data", "dataset to augment (sessions layout)", "in"),
          "teacher": Arg("--teacher", "the teacher's model folder", "in"),
          "out": Arg("--out", "augmented dataset folder", "out", persist=True),
          "metrics": Arg("--metrics", "stage metrics file", "metrics"),
          "rewrite": Arg("--rewrite", "augment again the days already augmented by this "
                                      "teacher")},
)

if __name__ == "__main__":
    main(STAGE)
