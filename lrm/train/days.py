"""A model carried from day to day: each day goes on from the day before's model and the
optimizers' state. The one procedure for a long-lived model, used by the ExFM students
(stage student) and the stream's models (teacher and students) alike.

    CHAIN/day=D/     day D's checkpoints (lrm.checkpoint's chain format)
        _seed.json   which checkpoints came from the day before (links)
        _done.json   written once day D's model is saved: the day is over

Day D trains in its own folder, seeded with hard links to the newest checkpoint (its chain)
of the newest finished day before it (a committed checkpoint's files are written once and
never changed, so a link is a copy that costs no bytes; a copy where links cannot be). It
starts from them as a "carry" (lrm.train.job: the model and the optimizers' state come back,
the day counts its own steps over its own data). A run of day D that stopped leaves day D's
own checkpoints in its folder: the next run finds one newer than the seeds and resumes it
whole (same data: it goes on where it stopped). The finished days' folders are only read,
so a failure leaves them as they were; folders older than the newest `KEEP` finished days
are removed (lrm's own, marked).

Why the optimizers' state carries over, rather than fresh optimizers on the day before's
weights: MEASURE-ME.
Tables keep the rows of `model.tables` from day to day (`fit_tables` off: a day's distinct
ids would give each day other table sizes, and the next day could not carry the model);
arriving ids hash into them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from lrm import io
from lrm.checkpoint.store import Store
from lrm.train.job import TrainJob
from lrm.train.loop import LogFn, TrainResult, train

SEED, DONE = "_seed.json", "_done.json"
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


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links not allowed: a plain copy
        shutil.copy2(src, dst)


def day_folder(chain: Path, day: int, owner: str) -> tuple[Path, bool]:
    """(day D's checkpoint folder, new_data): whether the newest restorable checkpoint in
    it is a seed (the day before's: a carry) or D's own or none (a resume).

    The folder is made on first use (marked as `owner`'s), seeded from the newest finished
    day before D (none: empty, the model starts fresh).
    """
    chain = Path(chain)
    folder = chain / f"day={day}"
    if not folder.is_dir():
        io.claim_dir(chain, owner)
        prev = finished(chain, before=day)
        names: list[str] = []
        tmp = chain / f".day={day}.seed-{uuid.uuid4().hex[:8]}"
        io.claim_dir(tmp, owner)
        try:
            if prev:
                lineage, _ = Store(chain / f"day={prev[-1]}").newest_restorable()
                for entry in lineage or []:  # its baseline and deltas: what a restore reads
                    (tmp / entry.name).mkdir()
                    for f in entry.path.iterdir():
                        _link_or_copy(f, tmp / entry.name / f.name)
                    names.append(entry.name)
            io.write_json({"from_day": prev[-1] if prev else None, "checkpoints": names},
                          tmp / SEED, stage=owner)
            os.replace(tmp, folder)  # the folder appears whole, or not at all
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    seeds = set(json.loads((folder / SEED).read_text())["checkpoints"])
    lineage, _ = Store(folder).newest_restorable()
    return folder, lineage is not None and lineage[-1].name in seeds


def finish(chain: Path, day: int, info: dict[str, object], owner: str) -> None:
    """Day D's model is saved: mark its folder over; remove the folders before the newest
    `KEEP` finished days (and seed folders of runs that stopped while seeding)."""
    chain = Path(chain)
    folder = chain / f"day={day}"
    if not folder.is_dir() or (folder / DONE).is_file():
        return  # nothing trained here, or marked already (a run that stopped after it)
    io.write_json(info, folder / DONE, stage=owner)
    keep = set(finished(chain)[-KEEP:])
    newest = max(keep)
    for d, p in _days(chain).items():
        if d < newest and d not in keep and io.owned_by_lrm(p) == owner:
            shutil.rmtree(p)
    for p in chain.glob(".day=*.seed-*"):
        if io.owned_by_lrm(p) == owner:
            shutil.rmtree(p)


def newest(chain: Path) -> Path | None:
    """The newest finished day's newest checkpoint (what the next day starts from)."""
    days = finished(Path(chain))
    if not days:
        return None
    lineage, _ = Store(Path(chain) / f"day={days[-1]}").newest_restorable()
    return None if lineage is None else lineage[-1].path


def train_day(job: TrainJob, chain: Path, day: int, *, owner: str,
              log_fn: LogFn | None = None) -> TrainResult:
    """Train `job` (day D's data: its split, held-out day and out) as day D of the model
    whose days live in `chain`: carried from the newest finished day before D, or resumed
    where a stopped run of D left off; the day's folder is then marked finished."""
    folder, new_data = day_folder(chain, day, owner)
    run = job.but(checkpoints=folder, start="carry" if new_data else "resume",
                  train=dataclasses.replace(job.train, fit_tables=False))
    result = train(run, log_fn=log_fn)
    finish(chain, day, trained(result), owner)
    return result


def trained(result: TrainResult) -> dict[str, Any]:
    """What a day's training did: steps, and what it started from (the day before's
    checkpoint, this day's own after a stopped run, or None: a fresh start)."""
    return {"steps": result.steps, "resumed_from": result.resumed_from,
            "resumed": {"carry": "previous day", "resume": "this day (a run that stopped)"}
            .get(result.start),
            "checkpoint": str(result.checkpoint) if result.checkpoint else None,
            "eval": result.eval}


__all__ = ["DONE", "KEEP", "SEED", "day_folder", "finish", "finished", "newest", "train_day",
           "trained"]
