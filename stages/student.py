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
`students.train`'s overrides (ParamsConfig.train_for); tables are `model.tables`. The
serving variant of each VM is `registry.variant`, or with `auto` lrm.exfm.pick's choice on
the last `registry.pick.days` validation days pooled (docs/exfm.md); a surface under
`students.min_share` (or not in `students.verticals`) has no VM and serves the FM. Writes

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
import logging
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
    PickConfig,
    SplitConfig,
    StudentStageConfig,
    TableConfig,
    TrainConfig,
)
from stagekit import Arg, Metrics, Stage, main

NAME = "student"
SERVING = "serving.json"  # in --out: VM -> {variant, vertical}
SCORES = "_scores"  # in a VM's checkpoints (the stream): each day's validation scores
log = logging.getLogger("lrm")


@dataclass(frozen=True)
class VMDay:
    """A vertical model's stream day: the variant it serves, and how each variant trained."""

    serving: str | None  # the variant served (fm: the FM's prediction; None: nothing yet)
    validation_ne: dict[str, float]  # each candidate's pooled NE: the pick's evidence
    variants: dict[str, dict[str, Any]]  # variant -> what its day's training did, its model
    pick: dict[str, Any] | None = None  # lrm.exfm.pick's choice (an ablation day's), if any
    ablation: bool = False  # every variant trained today (students.ablation_every)
    skipped: str | None = None  # why the surface's day trained nothing (too small)
    not_trained: str | None = None  # why the surface has no VM (students.min_share)

    def as_dict(self) -> dict[str, Any]:
        extra = {k: v for k, v in (("skipped", self.skipped),
                                   ("not_trained", self.not_trained)) if v is not None}
        return {"serving": self.serving, "validation_ne": self.validation_ne,
                "variants": self.variants, "pick": self.pick, "ablation": self.ablation,
                "trained_today": bool(self.variants), **extra}


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
        tables: TableConfig, checkpoint: CheckpointConfig, serving: str, pick: PickConfig,
        data: Path = Path("data/augmented"), sessions: Path = Path("data/sessions"),
        teacher: Path | None = Path("models/teacher"),
        plan: Path | None = None, out: Path = Path("models/students"),
        checkpoints: Path = Path("checkpoints/students"), day: int | None = None,
        name: str | None = None, eval_data: Path | None = None, eval_day: int | None = None,
        metrics: Path | None = Path("metrics/exfm.json"),
        table: Path | None = Path("metrics/exfm.md"),
        plot: Path | None = Path("plots/exfm_ne.csv"), force: bool = False) -> Day | Metrics:
    """Train every vertical model's variants day by day and write the ExFM table."""
    from lrm.data.schema import day_files, read_schema
    from lrm.errors import ConfigError
    from lrm.exfm import fm as F
    from lrm.exfm import students as S
    from lrm.exfm.distill import distillation
    from lrm.exfm.pick import FM
    from lrm.fp8.dispatch import transform
    from lrm.train import build_job

    if serving not in ("auto", FM) and serving not in cfg.variants:
        raise ConfigError(f"registry.variant: {serving!r} is neither auto, {FM} nor one of "
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
        return _one_day(cfg, serving, pick, vms, job_for, data, out, checkpoints, day, name,
                        eval_day, teacher, log_fn, eval_data=eval_data, sessions=sessions)
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
    # the FM's own prediction for a surface: the version that logs the last day (the one the
    # table's FM row scores), registered under the surface's model when it serves
    if teacher is not None and not Path(teacher).exists():  # run on its own, no FM at hand
        log.info("student: no foundation model at %s: its own prediction is no candidate",
                 teacher)
        teacher = None
    fm_dir = (F.teachers_by_day(teacher, [evals[-1]]).get(evals[-1])
              if teacher is not None and pick.fm else None)
    small = S.small_surfaces(schema, S.vertical_rows(sessions, days),
                             verticals=cfg.verticals, min_share=cfg.min_share)

    with io.atomic_dir(out, stage=NAME, force=force) as tmp:
        def done(vm: S.VerticalModel, chains: Path) -> None:
            for v in cfg.variants:
                if (last := S.last_model(chains, v)) is not None:
                    _link(last, tmp / vm.name / v)

        for vm in vms:  # another run's days: this run starts over
            io.start_over(checkpoints / vm.name, NAME)
        run_ = S.train_students(
            vms, cfg.variants, job_for, sessions=sessions, augmented=data, days=days,
            chains=checkpoints, owner=NAME, rule=serving, prior=pick.prior,
            pick_days=pick.days, fm=fm_dir is not None, fm_ties=pick.fm_ties, small=small,
            log_fn=log_fn,
            done=done)
        if FM in run_.served.values():
            assert fm_dir is not None
            for vm in vms:
                if run_.served.get(vm.name) == FM:
                    _link(fm_dir, tmp / vm.name / FM)
        rep = S.report(run_.results, vms, schema,
                       S.teacher_per_day(data, [d for d in evals if d in served]),
                       served=run_.served, picks=run_.picks, serving=serving,
                       trained=run_.not_trained)
        io.write_json({vm.name: {"variant": run_.served[vm.name], "vertical": vm.vertical}
                       for vm in vms if vm.name in run_.served}, tmp / SERVING)
    rep["days"] = {"train": days, "eval": evals, "first_served": served[0]}
    rep["fm_served"] = str(fm_dir) if fm_dir is not None else None
    rep["per_day_detail"] = run_.results
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


def _one_day(cfg: StudentStageConfig, serving: str, pick: PickConfig, vms: list[Any],
             job_for: Any, data: Path, out: Path, checkpoints: Path, day: int, name: str | None,
             eval_day: int | None, teacher: Path | None, log_fn: Any,
             eval_data: Path | None = None, sessions: Path | None = None) -> Day:
    """Day `day` of each VM (or `name`), as the stream runs it (module docstring)."""
    from lrm.errors import ConfigError
    from lrm.exfm import pick as P
    from lrm.exfm import students as S
    from lrm.exfm.augment import TEACHER_COLUMN
    from lrm.train import days as carried

    chosen = [vm for vm in vms if name is None or vm.name == name]
    if not chosen:
        raise ConfigError(f"--name: {name!r} is not one of the vertical models "
                          f"{[vm.name for vm in vms]}")
    held = day + 1 if eval_day is None else eval_day
    fm = teacher is not None and pick.fm and (Path(teacher) / "model.json").is_file()
    if serving == P.FM and not fm:
        raise ConfigError("registry.variant fm: the stream's day has no foundation model "
                          "folder (--teacher)")
    done: dict[str, VMDay] = {}
    picks: dict[str, Any] = {}
    small: dict[int, str] = {}
    if fm and sessions is not None:  # a surface under students.min_share serves the FM
        counts = S.vertical_rows(sessions, [d for d in _days_of(sessions) if d <= day])
        small = S.small_surfaces(_schema(data), counts, verticals=cfg.verticals,
                                 min_share=cfg.min_share)
    prior = P.prior_of(list(cfg.variants), {n: v.distill for n, v in cfg.variants.items()},
                       pick.prior)
    for vm in chosen:
        chains = checkpoints / vm.name
        io.claim_dir(out / vm.name, NAME)  # the VM's day models: this stage's, replaceable
        yesterday = _served(chains, before=day)
        if vm.vertical is not None and vm.vertical in small:
            pick_ = P.FM
            _link_fm(teacher, out / vm.name / P.FM)
            picks[vm.name] = {"variant": pick_, "vertical": vm.vertical}
            _record_served(chains, out / vm.name, day, picks[vm.name], vm.name)
            done[vm.name] = VMDay(serving=pick_, validation_ne={}, variants={},
                                  not_trained=small[vm.vertical])
            continue
        # which variants train today: the whole ablation every `ablation_every` days, else
        # the served one and labels only (the control); where the FM serves, the prior (the
        # variant that distils) in its place, so the VM that would replace it stays current
        daily = {prior if yesterday in (None, P.FM) else yesterday, S.LABELS_ONLY} \
            & set(cfg.variants)
        others = [max(carried.finished(chains / v, before=day), default=-1)
                  for v in cfg.variants if v not in daily]
        ablation = serving == "auto" and (not others or min(others) < 0
                                          or max(others) <= day - cfg.ablation_every)
        variants = (list(cfg.variants) if ablation else
                    [v for v in cfg.variants if v in daily] if serving == "auto" else
                    [] if serving == P.FM else [serving])
        trained: dict[str, Any] = {}
        why = None
        if variants and (why := carried.too_small(job_for(vm, cfg.variants[variants[0]], data)
                                                   .but(split=SplitConfig(
                                                       days=[day], eval_day=held,
                                                       verticals=vm.verticals)), [day])):
            log.info("%s day %d: skipped, %s", vm.name, day, why)
            variants = []
        for v in variants:
            chain = chains / v
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
        pk = None
        if serving == "auto" and ablation and trained:  # the evidence of the days before
            cands = list(cfg.variants) + ([P.FM] if fm else [])
            pooled, used = P.pool(P.load_scores(chains / SCORES, before=day), cands,
                                  pick.days)
            pk = P.choose(pooled, prior, days=used, fm_ties=pick.fm_ties)
        if trained and serving == "auto":  # today's scores: the next days' evidence
            P.save_scores(chains / SCORES, day, P.day_scores(
                {v: out / vm.name / v for v in trained}, eval_data or data, held,
                vm.verticals or None, teacher_column=TEACHER_COLUMN if fm else None), NAME)
        if trained:  # the pick's choice; between ablation days yesterday's goes on
            rule = serving if serving != "auto" or pk is not None else (yesterday or prior)
            pick_ = S.served_variant(rule, pk, list(trained), fm)
        else:  # nothing trained today (the surface's day too small): as yesterday
            pick_ = yesterday if yesterday is not None else (P.FM if fm else None)
        if pick_ == P.FM:
            _link_fm(teacher, out / vm.name / P.FM)
        if pick_ is not None:
            picks[vm.name] = {"variant": pick_, "vertical": vm.vertical}
            _record_served(chains, out / vm.name, day, picks[vm.name], vm.name)
        done[vm.name] = VMDay(serving=pick_, validation_ne=pk.ne if pk else {},
                              variants=trained, pick=pk.as_dict() if pk else None,
                              ablation=ablation, skipped=why)
    if name is None:  # every VM of the day in this run: the day's serving file too
        io.claim_dir(out, NAME)
        io.write_json(picks, out / SERVING, stage=NAME)
    return Day(day=day, eval_day=held, serving_rule=serving, students=done)


SERVED = "_served.json"  # in a VM's checkpoints (the stream): what it served, day by day


def _served(chains: Path, before: int) -> str | None:
    """What the VM served on its newest day before `before` (None: none yet)."""
    try:
        doc = json.loads((chains / SERVED).read_text())
    except (OSError, ValueError):
        return None
    days = [int(d) for d in doc if d.isdigit() and int(d) < before]
    return doc[str(max(days))]["variant"] if days else None


def _record_served(chains: Path, folder: Path, day: int, entry: dict[str, Any],
                   name: str) -> None:
    """The VM's served variant of day `day`: in its chain (the next days read it) and in
    its day folder (`serving.json` there, what the register stage reads for it)."""
    try:
        doc = json.loads((chains / SERVED).read_text())
    except (OSError, ValueError):
        doc = {}
    doc[str(day)] = entry
    io.claim_dir(chains, NAME)
    io.write_json(doc, chains / SERVED, stage=NAME)
    io.write_json({name: entry}, folder / SERVING, stage=NAME)


def _schema(data: Path) -> Any:
    from lrm.data.schema import read_schema

    return read_schema(data)[0]


def _days_of(data: Path) -> list[int]:
    from lrm.data.schema import day_files

    return sorted(day_files(data))


def _link_fm(teacher: Path | None, dst: Path) -> None:
    """The foundation model's folder as the VM's served model (FM: its own prediction),
    replacing an older copy (another day's teacher). Its files are checked against the
    hashes the FM's stage recorded, then recorded again in the copy (what loads it checks)."""
    assert teacher is not None
    src = Path(teacher)
    io.verify_recorded(src, [f.name for f in src.iterdir()
                             if f.is_file() and not f.name.startswith(".")])
    if dst.is_dir():
        shutil.rmtree(dst)
    _link(src, dst)
    io.record_dir(dst, NAME)


STAGE = Stage(
    name=NAME, run=run, short=("students",), label=("name",), per_label=("out", "checkpoints"),
    trains="students",
    reads={"cfg": "students", "loader": "loader", "tables": "model.tables",
           "checkpoint": "checkpoint", "serving": "registry.variant", "pick": "registry.pick"},
    args={"data": Arg("--data", "augmented dataset (the days the teacher logs)", "in"),
          "sessions": Arg("--sessions", "the sessions dataset (every day: the days before "
                          "the teacher's are trained from here)", "in"),
          "teacher": Arg("--teacher", "the foundation model's versions (lrm teacher; with "
                         "--day: the model folder that augmented the day): its own "
                         "prediction serves a surface no VM beats", "in"),
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
