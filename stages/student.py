"""Stage `student` (ExFM): every vertical model x variant, day by day -> the ExFM table.

    lrm student [--data data/augmented --sessions data/sessions --out models/students]
    lrm student --day D --name search-small --eval-data DIR --eval-day E   (the stream's day)

A vertical model (VM) is a student size of `students.models` on one vertical of the data
(`search-small`; the size alone when the data is one vertical). Each trains on its
vertical's days from the first (every day but the last), each day starting from the day
before's model (lrm.train.days, the procedure the stream runs), scored on the next day of
its vertical: labels only until the foundation model first logs a day (the first day of
`--data`), then in every variant of `students.variants` (labels only, distillation on the
serving head, auxiliary head, auxiliary head + adapter: lrm.exfm.distill), each going on
from that labels-only model (lrm.exfm.students). Training values are `train`'s with
`students.train`'s overrides (ParamsConfig.train_for); tables are `model.tables`. The serving variant of each VM is
`registry.variant`, or with `auto` the variant with the lowest NE on the validation day (the
evaluation day before the last), never one worse than labels only. Writes

    models/students/VM/VARIANT/     the last day's model of every variant
    models/students/serving.json    VM -> its serving variant and vertical (stage register)
    metrics/exfm.json               per vertical: the FM's NE and every VM variant's on the
                                    last day, the validation NEs, the pick, NE per day
    metrics/exfm.md                 the table as markdown
    plots/exfm_ne.csv (+ .png)      NE per evaluation day: teacher and every VM/variant

With `--day D` it is one day of the same procedure, as the streaming flow runs it: each VM
(or `--name`'s) carried on to day D from its chain (`--checkpoints`/VM/VARIANT), scored on
`--eval-day` of `--eval-data`: its serving variant, or with `auto` every variant, the one
served being the best on the day before (never one worse than labels only; labels only on
the first day). A day already trained is not trained again.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lrm import io, plots, progress, tracking
from lrm.config import (
    CheckpointConfig,
    DistillConfig,
    LoaderConfig,
    ModelConfig,
    SplitConfig,
    StudentStageConfig,
    TableConfig,
    TrainConfig,
)
from stagekit import Arg, Metrics, Stage, main

NAME = "student"
SERVING = "serving.json"  # in --out: VM -> {variant, vertical}


@dataclass(frozen=True)
class VMDay:
    """A vertical model's stream day: the variant it serves, and how each variant trained."""

    serving: str  # the variant served (the day before's best with registry.variant auto)
    validation_ne: dict[str, float]  # each variant's NE of the day before: the pick's
    variants: dict[str, dict[str, Any]]  # variant -> what its day's training did, its model

    def as_dict(self) -> dict[str, Any]:
        return {"serving": self.serving, "validation_ne": self.validation_ne,
                "variants": self.variants}


@dataclass(frozen=True)
class Day:
    """The stage's result with --day (the stream's): each vertical model's day."""

    day: int
    eval_day: int
    serving_rule: str  # registry.variant
    students: dict[str, VMDay]

    def metrics(self) -> dict[str, Any]:
        return {"day": self.day, "eval_day": self.eval_day, "serving_rule": self.serving_rule,
                "students": {k: v.as_dict() for k, v in self.students.items()}}


def run(*, cfg: StudentStageConfig, train: TrainConfig, loader: LoaderConfig,
        tables: TableConfig, checkpoint: CheckpointConfig, serving: str,
        data: Path = Path("data/augmented"), sessions: Path = Path("data/sessions"),
        plan: Path | None = None, out: Path = Path("models/students"),
        checkpoints: Path = Path("checkpoints/students"), day: int | None = None,
        name: str | None = None, eval_data: Path | None = None, eval_day: int | None = None,
        metrics: Path | None = Path("metrics/exfm.json"),
        table: Path | None = Path("metrics/exfm.md"),
        plot: Path | None = Path("plots/exfm_ne.csv"), force: bool = False) -> Day | Metrics:
    """Train every vertical model's variants day by day and write the ExFM table."""
    from lrm.data.schema import day_files, read_schema
    from lrm.errors import ConfigError
    from lrm.exfm import students as S
    from lrm.exfm.distill import distillation
    from lrm.fp8.dispatch import transform
    from lrm.train import build_job

    if serving != "auto" and serving not in cfg.variants:
        raise ConfigError(f"registry.variant: {serving!r} is neither auto nor one of "
                          f"students.variants {sorted(cfg.variants)}")
    log_fn = tracking.log_metrics if tracking.active() else None
    schema, _ = read_schema(sessions if day is None else data)
    vms = S.vertical_models(schema, list(cfg.models))

    fp8 = transform(train.fp8, "student")

    def job_for(vm: S.VerticalModel, variant: DistillConfig, dataset: Path) -> Any:
        d = distillation(ModelConfig(tables=tables, student=cfg.models[vm.size]), variant)
        return build_job("student", train=train, model=d.model, data=dataset,
                         loader=loader, checkpoint=checkpoint, plan=plan,
                         plan_entry=f"students.{vm.size}", transform=fp8, loss=d.loss,
                         teacher_column=d.teacher_column, growth=d.growth,
                         eval_data=eval_data if day is not None else None)

    if day is not None:
        return _one_day(cfg, serving, vms, job_for, data, out, checkpoints, day, name,
                        eval_day, log_fn)
    all_days = sorted(day_files(sessions))
    served = sorted(day_files(data))
    days = sorted(cfg.days) if cfg.days else all_days[:-1]  # each scored on the next
    bad = [d for d in days if d + 1 not in all_days]
    if bad:
        raise ConfigError(f"students.days: {bad} have no next day in {sessions} to be scored "
                          f"on (days: {all_days})")
    if not served or days[-1] < served[0]:
        raise ConfigError(f"students: no train day is logged by the teacher ({data} holds "
                          f"days {served}); the students distill from its days on")
    evals = [d + 1 for d in days]
    validation = evals[-2] if len(evals) >= 2 and evals[-2] > served[0] else None
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with io.atomic_dir(out, stage=NAME, force=force) as tmp:
        for vm in vms:
            chains = checkpoints / vm.name
            io.start_over(chains, NAME)  # another run's days: this run starts over
            results[vm.name] = S.train_vm(
                vm, cfg.variants, job_for, sessions=sessions, augmented=data, days=days,
                first_served=served[0], chains=chains, owner=NAME, log_fn=log_fn)
            for v in cfg.variants:
                if (last := S.last_model(chains, v)) is not None:
                    _link(last, tmp / vm.name / v)
        rep = S.report(results, vms, schema,
                       S.teacher_per_day(data, [d for d in evals if d in served]),
                       validation_day=validation, serving=serving)
        io.write_json({vm.name: {"variant": rep["serving"][vm.name], "vertical": vm.vertical}
                       for vm in vms}, tmp / SERVING)
    rep["days"] = {"train": days, "eval": evals, "first_served": served[0]}
    rep["per_day_detail"] = results
    if table is not None:
        io.write_text(S.markdown(rep["table"]), table, stage=NAME, force=force)
    ys = [k for k in rep["per_day"][0] if k != "day"] if rep["per_day"] else []
    if plot is not None:
        plots.write_lines(rep["per_day"], "day", {plots.NE: ys}, plot,
                          title="ExFM: NE per evaluation day", stage=NAME, force=force)
    for point in rep["per_day"]:
        tracking.log_metrics({f"ne_per_day/{k}": v for k, v in point.items() if k != "day"},
                             step=point["day"])
    return Metrics(rep)


def _link(src: Path, dst: Path) -> None:
    """A copy of model folder `src` at `dst` inside the stage's output (hard links)."""
    import os

    dst.mkdir(parents=True)
    for f in src.iterdir():
        if not f.name.startswith("."):  # lrm's marker and ledger are the chain's
            try:
                os.link(f, dst / f.name)
            except OSError:
                shutil.copy2(f, dst / f.name)


def _one_day(cfg: StudentStageConfig, serving: str, vms: list[Any], job_for: Any, data: Path,
             out: Path, checkpoints: Path, day: int, name: str | None, eval_day: int | None,
             log_fn: Any) -> Day:
    """Day `day` of each VM (or `name`): its serving variant, or with auto every variant
    and the pick of the day before (module docstring)."""
    from lrm.errors import ConfigError
    from lrm.exfm import students as S
    from lrm.train import days as carried

    chosen = [vm for vm in vms if name is None or vm.name == name]
    if not chosen:
        raise ConfigError(f"--name: {name!r} is not one of the vertical models "
                          f"{[vm.name for vm in vms]}")
    held = day + 1 if eval_day is None else eval_day
    io.claim_dir(out, NAME)  # the day's models: lrm's, replaceable by this stage's next run
    done: dict[str, VMDay] = {}
    picks = json.loads((out / SERVING).read_text()) if (out / SERVING).is_file() else {}
    for vm in chosen:
        variants = list(cfg.variants) if serving == "auto" else [serving]
        yesterday: dict[str, float] = {}
        trained: dict[str, Any] = {}
        for v in variants:
            chain = checkpoints / vm.name / v
            before = carried.finished(chain, before=day)
            if before:  # the variant's NE on the day before: the pick's validation
                ne = carried.done_info(chain, before[-1]).get("eval", {}).get("ne")
                if ne is not None:
                    yesterday[v] = ne
            dst = out / vm.name / v
            if day in carried.finished(chain) and carried.model_of(chain, day).is_dir() \
                    and (dst / "model.json").is_file():
                trained[v] = {"skipped": True, "model": str(dst)}  # a run that stopped after
                continue
            job = job_for(vm, cfg.variants[v], data)
            split = SplitConfig(days=[day], eval_day=held, verticals=vm.verticals)
            with progress.context(student=vm.name, variant=v, day=day):
                r = carried.train_day(job.but(split=split, out=dst), chain, day, owner=NAME,
                                      log_fn=log_fn)
            trained[v] = {**carried.trained(r), "model": str(dst)}
        pick = serving if serving != "auto" else (
            S.pick(yesterday) if S.LABELS_ONLY in yesterday else S.LABELS_ONLY)
        picks[vm.name] = {"variant": pick, "vertical": vm.vertical}
        done[vm.name] = VMDay(serving=pick, validation_ne=yesterday, variants=trained)
    io.write_json(picks, out / SERVING, stage=NAME)
    return Day(day=day, eval_day=held, serving_rule=serving, students=done)


STAGE = Stage(
    name=NAME, run=run, short=("students",), label=("name",), trains="students",
    reads={"cfg": "students", "loader": "loader", "tables": "model.tables",
           "checkpoint": "checkpoint", "serving": "registry.variant"},
    args={"data": Arg("--data", "augmented dataset (the days the teacher logs)", "in"),
          "sessions": Arg("--sessions", "the sessions dataset (every day: the days before "
                          "the teacher's are trained from here)", "in"),
          "plan": Arg("--plan", "sharding plan (lrm shard-plan, its entries students.NAME) "
                      "[default: torchrec's planner]", "in"),
          "out": Arg("--out", "folder of the students' models", "out"),
          "checkpoints": Arg("--checkpoints", "the students' per-day checkpoint folders "
                             "(VM/VARIANT)", "state"),
          "day": Arg("--day", "train this day only (the stream's)"),
          "name": Arg("--name", "with --day: this vertical model only [default: every one]"),
          "eval_data": Arg("--eval-data", "with --day: the dataset scored [default: --data]",
                           "in"),
          "eval_day": Arg("--eval-day", "with --day: the day scored [default: the next]"),
          "metrics": Arg("--metrics", "the ExFM report (JSON)", "metrics"),
          "table": Arg("--table", "the ExFM table (markdown)", "out", file=True, cache=False),
          "plot": Arg("--plot", "NE per day (CSV; a PNG beside it)", "plot")},
)

if __name__ == "__main__":
    main(STAGE)
