"""Students trained day by day on augmented data, and the table that compares them.

Streaming: a student trains on one day at a time after the teacher's cut-off T, each day
carried on from the day before (lrm.train.days: the model and the optimizers' state, the
procedure the stream's students follow too), and is evaluated on the next day with its
serving head. Every student size runs every configuration ("variant": labels only,
distillation on the serving head, auxiliary head, auxiliary head + adapter), each from the
same initialization, so the variants differ only in how they learn from the teacher. A
day's training is a job (lrm.train.job) with ExFM's loss (lrm.exfm.distill).

The teacher's NE on each day needs no model run: the augmented data holds its logit for
every impression, and the augment manifest of the day already carries its NE and AUC.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lrm import progress
from lrm.config import SplitConfig, default_variants
from lrm.data.schema import day_files
from lrm.errors import ConfigError
from lrm.exfm.augment import read_manifest
from lrm.train.days import train_day
from lrm.train.job import TrainJob
from lrm.train.loop import LogFn

log = logging.getLogger("lrm")

VARIANTS = default_variants()  # the ablation of the issue, in table order
LABELS = {
    "labels_only": "labels only",
    "distill_serving": "distillation on the serving head",
    "aux_head": "auxiliary head",
    "aux_adapter": "auxiliary head + adapter",
}


def student_days(data: Path, teacher_days: int, days: Sequence[int] = ()) -> list[int]:
    """The days students train on: `days`, or every day from T to the day before the last.

    Each is evaluated on the next day, which must exist.
    """
    available = sorted(day_files(data))
    chosen = sorted(days) if days else [d for d in available if teacher_days <= d < available[-1]]
    if not chosen:
        raise ConfigError(f"students: no day to train on after the teacher's days [0, "
                          f"{teacher_days}) with a next day to evaluate on (days: {available})")
    missing = sorted({d for d in chosen if d not in available}
                     | {d + 1 for d in chosen if d + 1 not in available})
    if missing:
        raise ConfigError(f"students.days: {chosen} need days {missing}, absent from {data} "
                          f"(days: {available}); every train day is evaluated on the next")
    early = [d for d in chosen if d < teacher_days]
    if early:
        raise ConfigError(f"students.days: {early} are before T = {teacher_days} (the teacher's "
                          f"days); students train on the days after the teacher's")
    return chosen


def stream_student(job: TrainJob, days: Sequence[int], chain: Path, *, owner: str,
                   log_fn: LogFn | None = None) -> list[dict[str, Any]]:
    """Train one student configuration (`job`: its model, loss, data and out) day by day
    as a model carried through `chain`; `job.out` ends as the last day's model.

    Day d trains on d and is evaluated on d + 1. Returns one row per day:
    {train_day, day, steps, seconds, ne, auc, calibration, rows}.
    """
    rows: list[dict[str, Any]] = []
    for d in days:
        t0 = time.perf_counter()
        with progress.context(day=d):
            res = train_day(job.but(split=SplitConfig(days=[d], eval_day=d + 1)), chain, d,
                            owner=owner, log_fn=log_fn)
        rows.append({"train_day": d, "day": d + 1, "steps": res.steps,
                     "seconds": round(time.perf_counter() - t0, 2),
                     **{k: res.eval[k] for k in ("ne", "auc", "calibration", "rows")}})
        log.info("student day %d -> eval day %d: NE %.4f AUC %.4f", d, d + 1,
                 res.eval["ne"], res.eval["auc"])
    return rows


def teacher_per_day(augmented: Path, days: Sequence[int]) -> dict[int, dict[str, Any]]:
    """The teacher's metrics on each augmented day, from the day manifests."""
    out = {}
    for d in days:
        m = read_manifest(Path(augmented) / f"day={d}")
        if m is None:
            raise ConfigError(f"students: day {d} of {augmented} is not augmented (no manifest); "
                              f"run the augment stage for it")
        out[d] = {**m["teacher_metrics"], "teacher": m["teacher"]}
    return out


def report(results: Mapping[str, Mapping[str, list[dict[str, Any]]]],
           teacher: Mapping[int, Mapping[str, Any]], teacher_days: int) -> dict[str, Any]:
    """The ExFM table on the last evaluation day, and NE per day (for the plot).

    results: student -> variant -> per-day rows (stream_student); teacher: day -> metrics.
    """
    last = max(r["day"] for per in results.values() for rows in per.values() for r in rows)
    t = teacher[last]
    table = [{"model": f"teacher (stale: trained to day {teacher_days})",
              "ne": t["ne"], "auc": t["auc"]}]
    students: dict[str, Any] = {}
    for s, per in results.items():
        students[s] = {}
        for v in _ordered(per):
            rows = per[v]
            final = next(r for r in rows if r["day"] == last)
            students[s][v] = {"ne": final["ne"], "auc": final["auc"],
                              "calibration": final["calibration"]}
            table.append({"model": f"student {s}, {LABELS.get(v, v)}", "ne": final["ne"],
                          "auc": final["auc"]})
    per_day = []
    days = sorted({r["day"] for per in results.values() for rows in per.values() for r in rows})
    for d in days:
        point: dict[str, Any] = {"day": d, "teacher": teacher[d]["ne"]}
        for s, per in results.items():
            for v, rows in per.items():
                point[f"{s}/{v}"] = next((r["ne"] for r in rows if r["day"] == d), math.nan)
        per_day.append(point)
    gains = {}
    for s, per in students.items():
        if "labels_only" in per:
            base = per["labels_only"]["ne"]
            gains[s] = {v: base / m["ne"] for v, m in per.items() if v != "labels_only"}
    return {"eval_day": last, "teacher_days": teacher_days,
            "teacher": {"ne": t["ne"], "auc": t["auc"], "calibration": t.get("calibration")},
            "students": students, "gain_vs_labels_only": gains, "table": table,
            "per_day": per_day}


def _ordered(variants: Mapping[str, Any]) -> list[str]:
    """Variant names in the issue's order (labels only first), then any others as given."""
    return [v for v in VARIANTS if v in variants] + [v for v in variants if v not in VARIANTS]


def markdown(table: Sequence[Mapping[str, Any]]) -> str:
    """The table as GitHub markdown."""
    lines = ["| model | NE | AUC |", "|---|---|---|"]
    lines += [f"| {r['model']} | {r['ne']:.4f} | {r['auc']:.4f} |" for r in table]
    return "\n".join(lines) + "\n"


def mean_spread(values: Sequence[float]) -> dict[str, float]:
    """{mean, spread (max - min), std} of a few numbers (e.g. over seeds)."""
    vals = list(values)
    return {"mean": statistics.fmean(vals), "spread": max(vals) - min(vals),
            "std": statistics.stdev(vals) if len(vals) > 1 else 0.0}
