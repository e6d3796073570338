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

from lrm.config import DistillConfig, RegistryConfig, StudentModelConfig
from stages._common import Arg, Stage, main

NAME = "register"


def run(*, reg: RegistryConfig, students: dict[str, StudentModelConfig],
        variants: dict[str, DistillConfig], models: Path = Path("models/students"),
        data: Path = Path("data/augmented"), metrics: Path | None = Path("metrics/register.json")
        ) -> dict[str, Any]:
    """Register each student's serving model; @champion moves only when NE improves."""
    from lrm import registry
    from lrm.data.schema import day_files

    registry.serving_variant(reg, variants)  # registry.variant names one of them
    day = max(day_files(data))
    decisions = {}
    for name in students:
        folder = Path(models) / name / reg.variant
        decisions[name] = registry.challenge(
            folder, registry.student_model(name, reg), eval_data=data, eval_day=day,
            margin=reg.margin, evaluated_on=f"day {day}").as_dict()
    return {"eval_day": day, "variant": reg.variant, "students": decisions}


STAGE = Stage(
    name=NAME, run=run, short=("registry",),
    reads={"reg": "registry", "students": "students.models", "variants": "students.variants"},
    args={"models": Arg("--models", "folder of the students' models (stage student)", "in"),
          "data": Arg("--data", "dataset whose last day both models are scored on", "in"),
          "metrics": Arg("--metrics", "stage metrics file: one decision per student",
                         "metrics")},
)

if __name__ == "__main__":
    main(STAGE)
