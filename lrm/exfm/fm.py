"""The foundation model's versions: trained one after another, each logging its days.

    FM/until=C/        version C: the FM trained on days [0, C) of every vertical
                       (lrm.models.saved's model folder)
    FM/versions.json   {"cuts": [...], "lag": L}: which version logs which day
                       (lrm.exfm.schedule)

`train_versions` trains them in order as one model carried from version to version
(lrm.train.days: each version starts from the one before with fresh optimizers and trains
on the days since), so the FM is long-lived like the students, on its own, slower cadence.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lrm import io
from lrm.config import SplitConfig
from lrm.errors import DataError
from lrm.exfm.schedule import Schedule, joined
from lrm.train.days import too_small, train_day
from lrm.train.job import TrainJob
from lrm.train.loop import LogFn, TrainResult

INDEX = "versions.json"
log = logging.getLogger("lrm")


def version_dir(fm: Path, cut: int) -> Path:
    return Path(fm) / f"until={cut}"


def trainable(job: TrainJob, sched: Schedule) -> Schedule:
    """`sched` with each version whose days are too small to train on joined to the next
    (lrm.exfm.schedule.joined, by lrm.train.days.too_small on `job`'s data), each said in
    one line."""
    out, lines = joined(sched, lambda window: too_small(job, window))
    for line in lines:
        log.info("%s", line)
    return out


def train_versions(job: TrainJob, sched: Schedule, fm: Path, chain: Path, *, owner: str,
                   log_fn: LogFn | None = None) -> list[TrainResult]:
    """Every version of `sched` (each scored on its cut day, every vertical) into `fm`
    (a folder the caller writes atomically), then its index."""
    results = []
    for cut, window in sched.windows():
        results.append(train_day(job.but(split=SplitConfig(days=window, eval_day=cut),
                                         out=version_dir(fm, cut)),
                                 chain, cut, owner=owner, log_fn=log_fn))
    io.write_json({"cuts": list(sched.cuts), "lag": sched.lag}, Path(fm) / INDEX)
    return results


def read_schedule(fm: Path) -> Schedule:
    """The schedule of an FM folder (its versions.json)."""
    path = Path(fm) / INDEX
    try:
        doc = json.loads(path.read_text())
        return Schedule(tuple(int(c) for c in doc["cuts"]), int(doc["lag"]))
    except FileNotFoundError:
        raise DataError(fm, None, None, f"not a model folder, nor a foundation model's "
                        f"versions (no model.json, no {INDEX}: run lrm teacher)") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(path, None, None, f"unreadable ({e})") from None


def teachers_by_day(fm: Path, days: Sequence[int]) -> dict[int, Path]:
    """day -> the version folder that logs it, for the `days` some version serves."""
    sched = read_schedule(fm)
    out = {}
    for d in days:
        cut = sched.serving(d)
        if cut is not None:
            out[d] = version_dir(fm, cut)
    return out


def summary(sched: Schedule, results: Sequence[TrainResult]) -> dict[str, Any]:
    """The versions as the teacher stage reports them."""
    return {"cuts": list(sched.cuts), "lag": sched.lag, "first_served": sched.first_served,
            "versions": {str(c): {"train_days": r.train_days, "steps": r.steps,
                                  "eval_day": r.eval_day, "eval": r.eval}
                         for c, r in zip(sched.cuts, results, strict=True)}}


__all__ = ["INDEX", "read_schedule", "summary", "teachers_by_day", "train_versions",
           "trainable", "version_dir"]
