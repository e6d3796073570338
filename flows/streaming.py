"""The streaming retraining flow: `python -m flows.streaming --days N` runs the next N days now;
`lrm serve` (flows/deployments.py) runs it on a cron schedule.

One run processes the stream's next days (`streaming.days`, or --days; --day D: that day
only), each as a subflow `day D` whose steps are tasks: get the day, dedup, collisions,
teacher (on its own cadence), augment, the evaluation split, one task per student, the
report. Dedup, teacher, augment and students (with register) are their stages, run through
the stage runner as every stage is (stagekit.execute: outputs checked and locked, one-line
errors, an MLflow run each, nested under the day's `stream_day_D`); the teacher and the
students are carried from day to day by the one procedure (lrm.train.days) the ExFM stage
uses too. The params are loaded once per run and passed to every task. This module orders
the steps, names them for the Prefect UI, publishes the day's report as a markdown artifact
(`lrm-stream-day-D`) and writes the day's record last.

A day already done (its record holds the same key: the content of its raw days and the
params) is a no-op: no MLflow run, no artifact, nothing written. A failed day's next run
goes on from where it stopped: the failure moves no champion and leaves the days before it
as they were (the day's finished steps stay, to go on from). Days run in order. An inbox
file that cannot be a day fails the run after the days before it. One run of a stream at a
time (its root is locked).
"""

# No `from __future__ import annotations` here: `lrm serve` runs a flow in a spawned process
# from a cloudpickled copy, whose functions keep only the globals their bodies use, so a
# flow parameter annotated by name ("ParamsConfig") could not be resolved there.

import dataclasses
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import typer
from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.states import Failed

from lrm import io, lock, registry, tracking
from lrm.config import ParamsConfig
from lrm.errors import ConfigError, DataError, LrmError
from lrm.data.schema import read_schema
# nothing imported here may import fbgemm (lrm.exfm.students does): its import logs through
# the root logger before Prefect sets logging up in `lrm serve`'s spawned runs, and every
# line then came out as "INFO:prefect.task_runs:..." (see flows/cli.py)
from lrm.streaming import days as sdays
from lrm.streaming import ledger, models, report, sources
from lrm.streaming.layout import STAGE, StreamPaths
from flows import vm_pool
from flows.vm_day import Judged, vm_day, vm_day_in_worker, worker_threads
from flows.vm_day import champion_after as _champion_after
from flows.vm_day import run_stage as _stage
from stagekit import OFF, PARAMS, load_params
from stagekit.cli import terminated_as_exit
from stages import augment, dedup
from stages import teacher as teacher_stage
from stages import train as train_stage

ARTIFACT = "lrm-stream-day-{day}"


def settings(params: list[str] | None, root: str | None) -> tuple[ParamsConfig, StreamPaths]:
    """The validated params (files laid over each other; `root` overrides streaming.root)."""
    files = [Path(p) for p in params] if params else ([PARAMS] if PARAMS.exists() else None)
    cfg = load_params(files, {"streaming.root": root} if root else None)
    return cfg, StreamPaths(Path(cfg.streaming.root))


# ---------------------------------------------------------------------------- tasks
# Every task takes the params loaded once by the flow (`cfg`) and the stream's folders.

@task(task_run_name="get day {day}", cache_policy=NO_CACHE)
def get_day(cfg: ParamsConfig, paths: StreamPaths, day: int) -> dict[str, Any]:
    """Raw days 0..D: the synthetic source makes the missing ones; the folder source's are
    there already (ingested when the run started)."""
    made = []
    for d in range(day + 1):
        if sources.read_source(paths.raw, d) is not None:
            continue
        if cfg.streaming.source != "synthetic":
            raise ConfigError(f"stream: no raw day {d} in {paths.raw} (drop a file for it in "
                              f"the inbox)")
        sources.synthetic_day(cfg.generate, d, paths.raw)
        made.append(d)
    return {"generated": made}


@task(task_run_name="dedup day {day}", cache_policy=NO_CACHE)
def dedup_days(cfg: ParamsConfig, paths: StreamPaths, day: int, next_day: bool
               ) -> dict[str, Any]:
    """sessions/day=d for every raw day up to D (and D + 1 when it is there): the dedup
    stage, which skips the days it made from the same raw files."""
    return _stage(dedup.STAGE, {
        "src": paths.raw, "out": paths.sessions,
        "days": list(range(day + 2 if next_day else day + 1)),
        "metrics": paths.reports / f"dedup_day={day}.json"}, cfg, day).metrics()


@task(task_run_name="collisions day {day}", cache_policy=NO_CACHE)
def collisions(cfg: ParamsConfig, paths: StreamPaths, day: int) -> dict[str, Any]:
    return sdays.collision_report(paths, day, cfg.model.tables)


@task(task_run_name="teacher day {day}", cache_policy=NO_CACHE)
def teacher(cfg: ParamsConfig, paths: StreamPaths, day: int) -> Judged:
    """When due: the teacher stage carries the teacher on over the days since its last window,
    scores it on day D, registers it and promotes it on NE."""
    name = models.registry_name(cfg)
    window = models.teacher_due(paths, cfg, day)
    if window is None:
        return Judged(models.not_due(paths, cfg))
    m = _stage(teacher_stage.STAGE, {
        "data": paths.sessions, "days": window, "eval_day": day, "carry": True,
        "defer": True, "checkpoints": paths.teacher_chain(), "out": paths.teacher_model(day),
        "plan": cfg.streaming.plan or None,
        "metrics": paths.reports / f"teacher_day={day}.json", "plot": OFF}, cfg, day)
    assert isinstance(m, teacher_stage.Version), m  # --carry: one version
    decision = m.decision
    if decision is None:  # the stream runs under an MLflow run: the stage registers
        raise ConfigError(f"stream day {day}: the teacher was not registered")
    models.record_teacher(paths, day, window, decision.version)
    champion = _champion_after(decision, name, cfg)
    return Judged({"due": True, "window": window, "train": m.train,
                   "decision": decision.as_dict(), "champion": champion}, decision, champion)


@task(task_run_name="augment day {day}", cache_policy=NO_CACHE)
def augment_days(cfg: ParamsConfig, paths: StreamPaths, day: int, next_day: bool,
                 champion: str | None) -> dict[str, Any]:
    """Day D (and D + 1) augmented by the teacher's champion of the day (`champion`: the
    version the day's decision makes champion; None: the registry's): the augment stage."""
    version, folder = models.teacher_champion(paths, cfg, champion)
    want = [day, day + 1] if next_day else [day]
    run_cfg = dataclasses.replace(cfg, augment=dataclasses.replace(cfg.augment, days=want))
    m = _stage(augment.STAGE, {
        "data": paths.sessions, "teacher": folder, "out": paths.augmented,
        "metrics": paths.reports / f"augment_day={day}.json"}, run_cfg, day)
    assert isinstance(m, augment.Augmented), m
    return {"teacher": f"{cfg.teacher.registry_name} v{version}", "written": m.written,
            "skipped": m.skipped, "folder": str(folder)}


@task(task_run_name="evaluation data day {day}", cache_policy=NO_CACHE)
def evaluation_data(cfg: ParamsConfig, paths: StreamPaths, day: int) -> dict[str, Any]:
    """Day D + 1, or D cut into its fit part and its held-out last slice."""
    p = sdays.plan(paths, day, cfg.streaming.holdout)
    split = {} if p.next_day else sdays.split_day(paths, day, cfg.streaming.holdout)
    return {"label": p.label, "next_day": p.next_day, "split": split}


@contextmanager
def workers(cfg: ParamsConfig, vms: int) -> Iterator[bool]:
    """streaming.workers processes for the day's vertical models (fewer when the day has
    fewer), each with its share of the cores; none (False) with 1."""
    n = min(cfg.streaming.workers, vms)
    if n <= 1:
        yield False
        return
    threads = max(1, len(os.sched_getaffinity(0)) // n)
    with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"),
                             initializer=worker_threads, initargs=(threads,)) as pool, \
            vm_pool.using(pool):
        yield True


@task(task_run_name="student {name} day {day}", cache_policy=NO_CACHE)
def student(cfg: ParamsConfig, paths: StreamPaths, name: str, day: int,
            teacher: str | None = None, parent: str | None = None) -> Judged:
    """Vertical model `name`'s day (`vm_day`), in a worker process when the day has them."""
    pool = vm_pool.current()
    if pool is None:
        return vm_day(cfg, paths, name, day, teacher, parent)
    return pool.submit(vm_day_in_worker, cfg, paths, name, day, teacher, parent).result()


@task(task_run_name="promote day {day}", cache_policy=NO_CACHE)
def promote(cfg: ParamsConfig, day: int, decisions: list[registry.Decision]) -> list[str]:
    """The day's decisions carried out, once every step of the day is done: @champion moves
    to each promoted version (a failed day moves none; a day run again moves them once)."""
    moved = []
    for d in decisions:
        registry.complete(d, cfg.tracking)
        if d.promoted:
            moved.append(f"{d.name} v{d.version}")
    return moved


@task(task_run_name="report day {day}", cache_policy=NO_CACHE)
def publish(paths: StreamPaths, day: int, record: dict[str, Any]) -> str:
    """The day's report: a file under reports/ and the Prefect markdown artifact."""
    md = report.markdown(record)
    io.write_text(md, paths.report(day), stage=STAGE)
    create_markdown_artifact(markdown=md, key=ARTIFACT.format(day=day),
                             description=report.summary(record))
    return str(paths.report(day))


# ---------------------------------------------------------------------------- flows

@flow(name="lrm-stream-day", flow_run_name="day {day}", log_prints=True)
def stream_day(day: int, cfg: ParamsConfig, paths: StreamPaths) -> dict[str, Any]:
    """Process day `day` of the stream (a no-op when it is done with the same key)."""
    get_day(cfg, paths, day)
    params_digest = ledger.digest(cfg)
    key = ledger.day_key(paths, day, params_digest)
    found = ledger.done(paths, day, key, params_digest)
    if found is not None:
        print(f"day {day}: already done (key {key[7:19]}): nothing to do")
        return {**found, "already_done": True}
    t0 = time.perf_counter()
    next_day = sdays.has_next_day(paths, day)
    with tracking.run(f"stream_day_{day}", cfg=cfg.tracking,
                      tags={"lrm.pipeline": "stream", "lrm.stream.day": str(day)}):
        dedup_days(cfg, paths, day, next_day)
        coll = collisions(cfg, paths, day)
        tracking.log_metrics({f"collisions/{f}": c["lookup_collisions"] for f, c in coll.items()})
        t = teacher(cfg, paths, day)
        aug = augment_days(cfg, paths, day, next_day, t.champion)
        ev = evaluation_data(cfg, paths, day)
        from lrm.exfm.students import vertical_models  # see the module's imports

        vms = vertical_models(read_schema(paths.sessions)[0], list(cfg.students.models))
        # one task a VM, submitted at once; with streaming.workers > 1 each trains in a
        # worker process (a model's training holds process-wide state: torch's threads, its
        # process group), else one after another here
        parent, teacher_dir = tracking.active_run_id(), aug.get("folder")
        with workers(cfg, len(vms)) as pool:
            if pool:
                futures = {vm.name: student.submit(cfg, paths, vm.name, day, teacher_dir,
                                                   parent) for vm in vms}
                students = {n: f.result() for n, f in futures.items()}
            else:
                students = {vm.name: student(cfg, paths, vm.name, day, teacher_dir)
                            for vm in vms}
        record = {"day": day, "key": key, "params": params_digest,
                  "evaluated_on": ev["label"], "next_day": ev["next_day"], "split": ev["split"],
                  "teacher": t.record, "augmented_by": aug["teacher"], "augment": aug,
                  "students": {n: s.record for n, s in students.items()}, "collisions": coll,
                  "seconds": round(time.perf_counter() - t0, 2)}
        record["report"] = publish(paths, day, record)
        decisions = {n: s.decision for n, s in students.items() if s.decision is not None}
        for name, d in decisions.items():
            tracking.log_metrics({f"{name}/challenger_ne": d.challenger["ne"],
                                  f"{name}/promoted": float(d.promoted)})
        # last but the record: the champions move only once every step of the day is done
        promote(cfg, day, ([t.decision] if t.decision is not None else [])
                + list(decisions.values()))
    ledger.write(paths, day, record)  # last: the day is done
    sdays.prune_work(paths, ledger.recorded_days(paths))
    for name, s in students.items():
        if s.decision is None:
            print(f"day {day}: {name} registered nothing: {s.record['skipped']}")
    for d in decisions.values():
        print(f"day {day}: {d.name} v{d.version} "
              f"{'promoted' if d.promoted else 'kept'}: {d.reason}")
    return record


@flow(name="lrm-streaming", log_prints=True)
def streaming(days: int | None = None, day: int | None = None,
              params: list[str] | None = None, root: str | None = None
              ) -> list[dict[str, Any]]:
    """Process the stream's next `days` new days (streaming.days), or day `day` only."""
    try:
        cfg, paths = settings(params, root)
        first = cfg.exfm.teacher_days
        if days is not None and days < 1:
            raise ConfigError(f"--days {days}: must be >= 1 (new days to process)")
        if day is not None and day < first:
            raise ConfigError(f"--day {day}: days before T = exfm.teacher_days = {first} are "
                              "the first teacher's; the stream's first day is T")
        with lock.exclusive(paths.root, purpose="lrm streaming"):
            ledger.claim(paths)
            if day is not None:
                ledger.check_in_order(paths, first, day)
            for run_id in tracking.close_dead_runs(cfg.tracking):  # a killed day's runs
                print(f"closed MLflow run {run_id}: left RUNNING by a process that is gone")
            available, refused = None, None
            inbox = Path(cfg.streaming.watch) if cfg.streaming.watch else paths.incoming
            if cfg.streaming.source == "folder":
                if cfg.streaming.watch and not inbox.is_dir():  # else runs find nothing, ever
                    raise ConfigError(f"streaming.watch: {inbox} is not a folder (the inbox "
                                      f"is read, never made: a typo?)")
                try:
                    sources.folder_days(inbox, paths.raw, cfg.ingest,
                                        cfg.generate.max_history,
                                        unfit=partial(sdays.unfit, cfg=cfg,
                                                      can_step=train_stage.can_step),
                                        settle=cfg.streaming.settle)
                except DataError as e:  # the days before the file run; the run fails after
                    refused = e
                available = sources.raw_days(paths.raw)
            todo = [day] if day is not None else ledger.next_days(
                paths, first, cfg.streaming.days if days is None else days, available)
            if not todo and refused is None:
                print(no_new_day(cfg, inbox, available, first))
            done = [stream_day(d, cfg, paths) for d in todo]
            if refused is not None:
                ran = f" (the days before it ran: {todo})" if todo else ""
                return Failed(message=f"{refused}{ran}")  # type: ignore[return-value]
            return done
    except LrmError as e:
        return Failed(message=f"{e}")  # type: ignore[return-value]


def no_new_day(cfg: ParamsConfig, inbox: Path, available: list[int] | None,
               first: int) -> str:
    """What a run with nothing to do says: where it looked, and what it left there."""
    if cfg.streaming.source != "folder":
        return "no new day to process"
    line = f"no new day to process (the inbox {inbox} holds no new file"
    if waiting := sources.settling(inbox, cfg.ingest, cfg.streaming.settle):
        line += f" that has settled: {', '.join(waiting)} changed within the last " \
                f"{cfg.streaming.settle:g} s (streaming.settle), taken once unchanged that long"
    if available and available[-1] < first:
        line += f"; its days {available} are the first teacher's: the stream starts at day " \
                f"{first}"
    if skipped := sources.not_taken(inbox, cfg.ingest):
        line += f"; no source reads {', '.join(skipped)}"
        if not sources.maps_logs(cfg.ingest):
            line += " (a click log needs the ingest.logs mapping: its label or explode)"
    return line + ")"


def main(days: int = typer.Option(None, "--days", help="new days to process now "
                                                      "(default: streaming.days)"),
         day: int = typer.Option(None, "--day", help="process this day only (a no-op when "
                                                    "it is done; the days before it must be)"),
         params: list[Path] = typer.Option(None, "--params", help="params files, later win"),
         root: str = typer.Option(None, "--root", help="the stream's folder "
                                                      "(default: streaming.root)")) -> None:
    """Run the streaming retraining flow now (no schedule): the next N days."""
    from lrm.progress import setup_logging

    setup_logging()
    with terminated_as_exit():  # SIGTERM exits through Prefect's teardown: its temporary
        # server is stopped (Python's default ends the process and leaves it running)
        state = streaming(days, day, [str(p) for p in params] if params else None, root,
                          return_state=True)
    if state.is_failed():
        print(f"error: {state.message}", file=sys.stderr)
        raise typer.Exit(2)
    for rec in state.result():
        print(f"day {rec['day']}: report {rec['report']}")


if __name__ == "__main__":
    typer.run(main)
