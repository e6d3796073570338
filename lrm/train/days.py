"""A model carried from day to day: each day starts from the day before's model, with fresh
optimizers. The one procedure for a long-lived model, used by the ExFM students (stage
student) and the stream's models (teacher and students) alike.

    CHAIN/day=D/          day D's checkpoints (lrm.checkpoint's chain format): a run of D
                          that stopped goes on from them, bit for bit
    CHAIN/day=D/model/    day D's model (lrm.models.saved): what day D + 1 starts from
    CHAIN/day=D/_done.json   written once the model is saved: the day is over

Day D is a warm start (lrm.train.job) from the model of the newest finished day before it:
its weights, the tables' rows, and new optimizers; the first day starts fresh. A run of D
that stopped resumes D's own newest checkpoint (same data: it goes on where it stopped).
The finished days' folders are only read, so a failure leaves them as they were; folders
older than the newest `KEEP` finished days are removed (lrm's own, marked).

Why fresh optimizers, not the day before's optimizer state: measured on the default
synthetic world (2 cores, the small student labels only, carried over days 0-4, each day
scored on the next, seeds 0 and 1), a warm start beat carrying the optimizers' state on
every day after the first: day 5 NE 0.9290 / 0.9304 against 0.9325 / 0.9321. Row-wise
Adagrad's accumulators only grow, so a model carried with them learns each new day at an
ever smaller rate, while the world drifts day by day. And a day's model is the state its
validation chose (lrm.train.early_stop; where it passed more than once, then the newest
rows once: lrm.train.loop's tail), which the next day should go on from, not the last
checkpoint's. (Measured while every day was still fitted to 500 small steps, below.)
A day after the first is not fitted to `train.fit_steps` (the many small steps a model's
first run takes on a small log): it goes on at `train.batch_size`. Measured on the default
world (2 cores, labels-only VMs carried over days 0-5, day 6 held out, 3 seeds): the next-day
NE went 0.946 -> 0.938 (feed, small), 0.908 -> 0.902 (search), 0.973 -> 0.964 (video), and
the spread over seeds fell 2-4x (feed small 0.010 -> 0.002): 500 steps of 128 impressions
on a trained model end wherever the last noisy steps left it.
Tables keep their rows from day to day (`fit_tables` off: a day's distinct ids would give
each day other table sizes, and the next day could not start from the model); arriving ids
hash into them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

from lrm import io
from lrm.checkpoint.store import Store
from lrm.train.data import scan_days
from lrm.train.job import TrainJob
from lrm.train.loop import LogFn, TrainResult, train
from lrm.train.schedule import can_step

DONE, MODEL = "_done.json", "model"
KEEP = 2  # finished day folders kept (the newest is what the next day starts from)


def _days(chain: Path) -> dict[int, Path]:
    if not chain.is_dir():
        return {}
    return {int(p.name[4:]): p for p in chain.iterdir()
            if p.is_dir() and p.name.startswith("day=") and p.name[4:].isdigit()}


def finished(chain: Path, before: int | None = None) -> list[int]:
    """The days whose folder is over (`_done.json`), in order; only those < `before`."""
    return sorted(d for d, p in _days(Path(chain)).items()
                  if (p / DONE).is_file() and (before is None or d < before))


def done_info(chain: Path, day: int) -> dict[str, Any]:
    """What a finished day recorded (`trained`: its steps, start and eval), or {}."""
    try:
        doc = json.loads((Path(chain) / f"day={day}" / DONE).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def model_of(chain: Path, day: int) -> Path:
    """Day `day`'s model folder in the chain."""
    return Path(chain) / f"day={day}" / MODEL


def newest(chain: Path, before: int | None = None) -> Path | None:
    """The model of the newest finished day (before `before`): what a day starts from."""
    days = finished(Path(chain), before)
    return model_of(chain, days[-1]) if days else None


def too_small(job: TrainJob, days: list[int]) -> str | None:
    """Why `days` of the job's data (the sessions of its split's verticals) are too small to
    train on, in words; None when a run over them takes a step (lrm.train.schedule.can_step:
    the one rule). Exports start and end mid-day, and a small surface's day may hold a few
    impressions: the caller says so in one line and skips the day, or joins it to the next."""
    rows = scan_days(job.data, days, verticals=job.split.verticals or None).rows
    if can_step(job.train, rows):
        return None
    return (f"{rows} impressions, fewer than one step of the smallest batch "
            f"(train.min_batch_size {job.train.min_batch_size})")


def train_day(job: TrainJob, chain: Path, day: int, *, owner: str,
              log_fn: LogFn | None = None, seed: Path | None = None) -> TrainResult:
    """Train `job` (day D's data: its split, held-out day and out) as day D of the model
    whose days live in `chain` (module docstring); the day's model is saved in the chain and
    at `job.out`, and the day's folder is marked finished.

    seed: the model folder the chain's first day starts from (another chain's day: a VM's
    labels-only days before the teacher serves, lrm.exfm.students); None: fresh."""
    chain = Path(chain)
    io.claim_dir(chain, owner)
    folder = chain / f"day={day}"
    io.claim_dir(folder, owner)
    own, _ = Store(folder).newest_restorable()
    prev = newest(chain, before=day) or seed
    start: dict[str, Any] = {"start": "resume"} if own is not None or prev is None else \
        {"start": "warm", "init_from": prev}
    # A day after the first goes on from a fitted model: its steps are not fitted to the
    # day (train.fit_steps is for a model's first run), the batch stays train.batch_size
    # (train.min_steps still holds). Decided by the chain, not by `start`, so a resume of
    # the day takes the schedule its first run took.
    fit = {} if prev is None else {"fit_steps": 0}
    run = job.but(checkpoints=folder, out=model_of(chain, day),
                  train=dataclasses.replace(job.train, fit_tables=False, **fit), **start)
    result = train(run, log_fn=log_fn)
    if job.out is not None:
        _link_tree(model_of(chain, day), Path(job.out), owner)
    finish(chain, day, trained(result), owner)
    return result


def _link_tree(src: Path, dst: Path, owner: str) -> None:
    """A copy of model folder `src` at `dst` (hard links: the files are written once)."""
    with io.atomic_dir(dst, stage=owner) as tmp:
        for f in src.iterdir():
            if not f.name.startswith("."):  # lrm's marker and ledger: atomic_dir's own
                try:
                    os.link(f, tmp / f.name)
                except OSError:  # another file system, or links not allowed: a copy
                    shutil.copy2(f, tmp / f.name)


def finish(chain: Path, day: int, info: dict[str, object], owner: str) -> None:
    """Day D's model is saved: mark its folder over; remove the folders before the newest
    `KEEP` finished days."""
    chain = Path(chain)
    folder = chain / f"day={day}"
    if not folder.is_dir() or (folder / DONE).is_file():
        return  # nothing trained here, or marked already (a run that stopped after it)
    io.write_json(info, folder / DONE, stage=owner)
    keep = set(finished(chain)[-KEEP:])
    newest_day = max(keep)
    for d, p in _days(chain).items():
        if d < newest_day and d not in keep and io.owned_by_lrm(p) == owner:
            shutil.rmtree(p)


def trained(result: TrainResult) -> dict[str, Any]:
    """What a day's training did: steps, and what it started from (the day before's model:
    start "warm"; this day's own checkpoint after a stopped run: "resume", with its step;
    nothing: "fresh")."""
    return {"steps": result.steps, "start": result.start, "resumed_from": result.resumed_from,
            "init_from": str(result.init_from) if result.init_from else None,
            "checkpoint": str(result.checkpoint) if result.checkpoint else None,
            "eval": result.eval}


__all__ = ["DONE", "KEEP", "MODEL", "done_info", "finish", "finished", "model_of", "newest",
           "too_small", "train_day", "trained"]
