"""Stage `register`: each vertical model's serving variant -> the MLflow registry, promoted on NE.

    lrm register [--models models/students --data data/augmented]

For every vertical model VM the student stage trained (`models/students/serving.json`: its
serving variant, picked by `registry.variant` or, with auto, on the validation days), the
model of that variant (models/students/VM/VARIANT, trained through the last student day;
VM/fm: the foundation model's own folder, where it serves the surface) registers as a new
version of lrm-student-VM with @challenger (tagged with its variant and vertical), and
becomes @champion only when its NE on the last day of `--data`, on its vertical, beats the
champion's there by `registry.margin` (lrm.registry: the decision, its reason and both NEs
are version tags). A model already registered is not registered again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lrm.config import RegistryConfig, TrackingConfig
from stagekit import Arg, Stage, main

if TYPE_CHECKING:
    from lrm.registry import Decision

NAME = "register"
SERVING = "serving.json"  # the student stage's: VM -> {variant, vertical}


@dataclass(frozen=True)
class Registered:
    """The stage's result: each vertical model's decision and the variant it registered."""

    eval_day: int
    decisions: dict[str, Decision]  # VM -> the registry's decision on its serving variant
    variants: dict[str, str]  # VM -> that variant

    def metrics(self) -> dict[str, Any]:
        return {"eval_day": self.eval_day,
                "students": {vm: {**d.as_dict(), "variant": self.variants[vm]}
                             for vm, d in self.decisions.items()}}


def run(*, reg: RegistryConfig, tracking: TrackingConfig,
        models: Path = Path("models/students"),
        data: Path = Path("data/augmented"), day: int | None = None, name: str | None = None,
        evaluated_on: str | None = None, defer: bool = False,
        metrics: Path | None = Path("metrics/register.json")) -> Registered:
    """Register each vertical model's serving variant; @champion moves only when NE
    improves."""
    from lrm import registry
    from lrm.data.schema import day_files, pick_day
    from lrm.errors import ConfigError, DataError

    day = pick_day(list(day_files(data)), -1 if day is None else day, "--day")
    # a vertical model's day (the stream's): its own serving file, beside its models
    src = Path(models) / name / SERVING if name is not None and \
        (Path(models) / name / SERVING).is_file() else Path(models) / SERVING
    try:
        serving = json.loads(src.read_text())
    except (OSError, ValueError) as e:
        raise DataError(src, None, None, f"not the student stage's "
                        f"output ({e.__class__.__name__}): run lrm student") from None
    names = list(serving) if name is None else [name]
    if name is not None and name not in serving:
        raise ConfigError(f"--name: {name!r} is not one of the vertical models "
                          f"{sorted(serving)} in {models}")
    decisions, variants = {}, {}
    for vm in names:
        variants[vm] = variant = serving[vm]["variant"]
        decisions[vm] = registry.challenge(
            Path(models) / vm / variant, registry.student_model(vm, reg), eval_data=data,
            eval_day=day, margin=reg.margin, evaluated_on=evaluated_on or f"day {day}",
            cfg=tracking, version_tags={registry.VARIANT_TAG: variant},
            promote=not defer, verticals=None if serving[vm].get("vertical") is None
            else [serving[vm]["vertical"]])
    return Registered(eval_day=day, decisions=decisions, variants=variants)


STAGE = Stage(
    name=NAME, run=run, short=("registry",), label=("name",),
    reads={"reg": "registry", "tracking": "tracking"},
    args={"models": Arg("--models", "folder of the students' models (stage student)", "in"),
          "data": Arg("--data", "dataset whose last day both models are scored on", "in"),
          "day": Arg("--day", "score on this day of --data instead of its last"),
          "name": Arg("--name", "register this vertical model only [default: every one]"),
          "evaluated_on": Arg("--evaluated-on", "what the scores are of, for the version's "
                              "tags [default: day DAY]"),
          "defer": Arg("--defer", "judge each but leave @champion where it is (the stream "
                       "moves it once the day is complete: lrm.registry.complete)"),
          "metrics": Arg("--metrics", "stage metrics file: one decision per vertical model",
                         "metrics")},
)

if __name__ == "__main__":
    main(STAGE)
