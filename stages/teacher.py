"""Stage `teacher` (ExFM): the foundation model (Wukong on every vertical), version after
version -> models/teacher, each registered.

    lrm teacher [--data data/sessions --out models/teacher]
    lrm teacher --days 5 --days 6 --eval-day 8 --carry --out DIR   (one version: the stream's)

The FM trains on every vertical's days (several times any vertical model's data) and is
retrained on its own cadence (lrm.exfm.schedule: its first version on days [0, T), a new one
every `exfm.teacher_every` days, each going on from the one before with fresh optimizers,
lrm.train.days), written as models/teacher/until=C/ with models/teacher/versions.json saying
which version logs which day (`exfm.teacher_lag`: the FM lags the students). Each version is
scored on day C (the day after its last one, every vertical) and registered as a new version
of `teacher.registry_name` (lrm-teacher), tagged with its content hash, as @challenger;
@champion moves to it only when its NE beats the champion's on the same day by
`registry.margin`. Training values are `train`'s with `teacher.train`'s overrides
(ParamsConfig.train_for); the shape is `model.teacher` and `model.tables`.

With `--days` and `--carry` it trains one version as the streaming flow does: the days given,
carried on from the newest version in `--checkpoints` (one folder per version), scored on
`--eval-day`, its model in `--out`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lrm import plots, tracking
from lrm.config import (
    CheckpointConfig,
    ExFMConfig,
    LoaderConfig,
    ModelConfig,
    TableConfig,
    TeacherModelConfig,
    TeacherStageConfig,
    TrackingConfig,
    TrainConfig,
)
from stagekit import Arg, Metrics, Stage, main

if TYPE_CHECKING:
    from lrm.registry import Decision

NAME = "teacher"


@dataclass(frozen=True)
class Version:
    """One version trained as the stream trains it (--carry): what the flow reads of it."""

    summary: dict[str, Any]  # the run's (TrainResult.summary; a version trained before: kind)
    train: dict[str, Any]  # what the day's training did (lrm.train.days.trained), or skipped
    content_hash: str  # lrm.models.saved.model_hash of the version's folder
    decision: Decision | None  # the registry's (None: not registered)

    def metrics(self) -> dict[str, Any]:
        m = {**self.summary, "train": self.train, "content_hash": self.content_hash}
        if self.decision is not None:
            m["registry"] = self.decision.as_dict()
        return m


def run(*, cfg: TeacherStageConfig, train: TrainConfig, exfm: ExFMConfig,
        checkpoint: CheckpointConfig, loader: LoaderConfig, tables: TableConfig,
        model: TeacherModelConfig, margin: float, tracking_cfg: TrackingConfig,
        data: Path = Path("data/sessions"),
        days: list[int] | None = None, eval_day: int | None = None, carry: bool = False,
        defer: bool = False, plan: Path | None = None,
        out: Path = Path("models/teacher"), checkpoints: Path = Path("checkpoints/teacher"),
        metrics: Path | None = Path("metrics/teacher.json"),
        plot: Path | None = Path("plots/teacher.csv"), force: bool = False
        ) -> Version | Metrics:
    """Train the foundation model (Wukong on every vertical), version after version, and
    register each as lrm-teacher."""
    from lrm import io
    from lrm.data.schema import day_files
    from lrm.exfm import fm
    from lrm.exfm.schedule import schedule
    from lrm.fp8.dispatch import transform
    from lrm.train import build_job

    job = build_job("teacher", train=train, model=ModelConfig(tables=tables, teacher=model),
                    data=data, loader=loader, checkpoint=checkpoint, plan=plan,
                    transform=transform(train.fp8, "teacher"))
    log_fn = tracking.log_metrics if tracking.active() else None
    if carry:  # one version, as the stream trains it
        if not days or eval_day is None:
            from lrm.errors import ConfigError
            raise ConfigError("teacher --carry: give the version's --days and --eval-day")
        return _one_version(cfg, job, data, days, eval_day, out, checkpoints, margin,
                            tracking_cfg, log_fn, defer)
    sched = fm.trainable(job, schedule(list(day_files(data)), exfm))
    io.start_over(checkpoints, NAME)  # another run's versions: this run starts over
    with io.atomic_dir(out, stage=NAME, force=force) as tmp:
        results = fm.train_versions(job, sched, tmp, checkpoints, owner=NAME, log_fn=log_fn)
    m = {"kind": "teacher", **fm.summary(sched, results)}
    history = [{**h, "version": c} for c, r in zip(sched.cuts, results, strict=True)
               for h in r.history]
    if plot is not None and history:
        steps = [dict(h, step=i) for i, h in enumerate(history)]
        plots.write_lines(steps, "step", plots.TRAINING, plot,
                          title="teacher: per logged step, version after version", stage=NAME,
                          force=force)
    if tracking.active() and cfg.registry_name:
        m["registry"] = {str(c): _register(cfg, fm.version_dir(out, c), data, c, margin,
                                           tracking_cfg).as_dict() for c in sched.cuts}
    elif tracking.active() and sched.cuts:  # not registered: the newest version on the run
        from lrm.serving import pyfunc
        pyfunc.log_model(fm.version_dir(out, sched.cuts[-1]), data, sched.cuts[-1])
    return Metrics(m)


def _one_version(cfg: TeacherStageConfig, job: Any, data: Path, days: list[int],
                 eval_day: int, out: Path, checkpoints: Path, margin: float,
                 tracking_cfg: TrackingConfig, log_fn: Any, defer: bool) -> Version:
    from lrm.config import SplitConfig as Split
    from lrm.models.saved import CARD, model_hash
    from lrm.train import days as carried

    if eval_day in carried.finished(checkpoints) and (out / CARD).is_file():
        summary: dict[str, Any] = {"kind": "teacher"}  # a run that stopped after training
        train: dict[str, Any] = {"skipped": True}  # it: registered below
    else:
        r = carried.train_day(job.but(split=Split(days=days, eval_day=eval_day), out=out,
                                      info={"stream_day": eval_day}),
                              checkpoints, eval_day, owner=NAME, log_fn=log_fn)
        summary, train = r.summary("teacher"), carried.trained(r)
    content_hash = model_hash(out)
    decision = None
    if tracking.active():
        if cfg.registry_name:
            decision = _register(cfg, out, data, eval_day, margin, tracking_cfg,
                                 promote=not defer)
        else:
            from lrm.serving import pyfunc
            pyfunc.log_model(out, data, eval_day)
    return Version(summary=summary, train=train, content_hash=content_hash, decision=decision)


def _register(cfg: TeacherStageConfig, folder: Path, data: Path, day: int, margin: float,
              tracking_cfg: TrackingConfig, promote: bool = True) -> Decision:
    """A version of the FM as a new registered version, promoted on NE on `day`."""
    from lrm import registry

    return registry.challenge(folder, cfg.registry_name, eval_data=data, eval_day=day,
                              margin=margin, evaluated_on=f"day {day}", cfg=tracking_cfg,
                              promote=promote)


STAGE = Stage(
    name=NAME, run=run, short=("teacher", "exfm"), trains="teacher",
    reads={"cfg": "teacher", "exfm": "exfm", "checkpoint": "checkpoint",
           "loader": "loader", "tables": "model.tables", "model": "model.teacher",
           "margin": "registry.margin", "tracking_cfg": "tracking"},
    args={"data": Arg("--data", "dataset folder", "in"),
          "days": Arg("--days", "with --carry: the version's train days (repeat for more)"),
          "eval_day": Arg("--eval-day", "with --carry: the day it is scored on"),
          "carry": Arg("--carry", "one version, carried on from the newest in --checkpoints "
                       "(the stream's): --days, --eval-day, its model in --out"),
          "defer": Arg("--defer", "judge it but leave @champion where it is (the stream "
                       "moves it once the day is complete: lrm.registry.complete)"),
          "plan": Arg("--plan", "sharding plan (lrm shard-plan, its entry teacher) "
                      "[default: torchrec's planner]", "in"),
          "out": Arg("--out", "the FM's versions (with --carry: the version's model folder)",
                     "out"),
          "checkpoints": Arg("--checkpoints", "the versions' checkpoint folders, one per "
                             "version", "state"),
          "metrics": Arg("--metrics", "stage metrics file", "metrics"),
          "plot": Arg("--plot", "loss and NE per logged step (CSV; a PNG beside it)", "plot")},
)

if __name__ == "__main__":
    main(STAGE)
