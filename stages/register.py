"""Stage `register`: each student's serving model -> the MLflow registry, promoted on NE.

    lrm register [--models models/students --data data/augmented]

For every student NAME of `students.models`, the model of the serving variant
(`registry.variant`: models/students/NAME/VARIANT, trained through the last student day)
registers as a new version of lrm-student-NAME with @challenger, and becomes @champion only
when its NE on the last day of `--data` beats the champion's NE on that day by
`registry.margin` (lrm.registry: the decision, its reason and both NEs are version tags).
A model already registered is not registered again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lrm.config import DistillConfig, RegistryConfig, StudentModelConfig, TrackingConfig
from stagekit import Arg, Stage, main

NAME = "register"


def run(*, reg: RegistryConfig, students: dict[str, StudentModelConfig],
        variants: dict[str, DistillConfig], tracking: TrackingConfig,
        models: Path = Path("models/students"),
        data: Path = Path("data/augmented"), day: int | None = None, name: str | None = None,
        evaluated_on: str | None = None,
        metrics: Path | None = Path("metrics/register.json")) -> dict[str, Any]:
    """Register each student's serving model; @champion moves only when NE improves."""
    from lrm import registry
    from lrm.data.schema import day_files, pick_day
    from lrm.errors import ConfigError

    registry.serving_variant(reg, variants)  # registry.variant names one of them
    day = pick_day(list(day_files(data)), -1 if day is None else day, "--day")
    names = list(students) if name is None else [name]
    if name is not None and name not in students:
        raise ConfigError(f"--name: {name!r} is not one of students.models {sorted(students)}")
    decisions = {}
    for student in names:
        folder = Path(models) / student / reg.variant
        decisions[student] = registry.challenge(
            folder, registry.student_model(student, reg), eval_data=data, eval_day=day,
            margin=reg.margin, evaluated_on=evaluated_on or f"day {day}", cfg=tracking).as_dict()
    return {"eval_day": day, "variant": reg.variant, "students": decisions}


STAGE = Stage(
    name=NAME, run=run, short=("registry",), label=("name",),
    reads={"reg": "registry", "students": "students.models", "variants": "students.variants",
           "tracking": "tracking"},
    args={"models": Arg("--models", "folder of the students' models (stage student)", "in"),
          "data": Arg("--data", "dataset whose last day both models are scored on", "in"),
          "day": Arg("--day", "score on this day of --data instead of its last"),
          "name": Arg("--name", "register this student only [default: every one]"),
          "evaluated_on": Arg("--evaluated-on", "what the scores are of, for the version's "
                              "tags [default: day DAY]"),
          "metrics": Arg("--metrics", "stage metrics file: one decision per student",
                         "metrics")},
)

if __name__ == "__main__":
    main(STAGE)
