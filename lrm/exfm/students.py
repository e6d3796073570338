"""The vertical models (VMs): long-lived students, one per vertical and size, and the table
that compares how they learn from the foundation model.

A VM trains on its vertical only (split.verticals), every day from the first, each day
starting from the day before's model (lrm.train.days: the one procedure, the stream's too),
and is scored on the next day of its vertical with its serving head. Until the first day a
foundation-model version logs (lrm.exfm.schedule.first_served) it learns from labels alone;
from then on every variant of the ablation ("labels only", distillation on the serving head,
auxiliary head, auxiliary head + adapter: lrm.exfm.distill) goes on from that same model,
growing the parts it trains (its heads and adapter start fresh), so the variants differ only
in how they learn from the FM. The labels-only variant is the user's real alternative: the
VM trained on every day of its vertical without a foundation model.

The serving variant (`registry.variant: auto`) is picked by measurement: the variant with
the lowest NE on the validation day (the evaluation day before the last), and never one
worse than labels only (`pick`); the last evaluation day is held out for the table.

The teacher's NE on each day needs no model run: the augment manifests carry it, over the
day and per vertical.
"""

from __future__ import annotations

import logging
import math
import re
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lrm import progress
from lrm.config import DistillConfig, SplitConfig, default_variants
from lrm.data.schema import FeatureSchema
from lrm.errors import ConfigError
from lrm.exfm.augment import read_manifest
from lrm.train.days import newest, too_small, train_day
from lrm.train.job import TrainJob
from lrm.train.loop import LogFn

log = logging.getLogger("lrm")

VARIANTS = default_variants()  # the ablation of the issue, in table order
LABELS_ONLY = "labels_only"
LABELS = {
    "labels_only": "labels only",
    "distill_serving": "distillation on the serving head",
    "aux_head": "auxiliary head",
    "aux_adapter": "auxiliary head + adapter",
}
PREFIX = "_labels"  # the chain of a VM's days before the teacher serves


@dataclass(frozen=True)
class VerticalModel:
    """One student: a vertical and a size."""

    name: str  # "search-small"; the size alone when the data is one vertical
    vertical: int | None  # the vertical's id (None: every row, the data is one vertical)
    size: str  # a key of students.models

    @property
    def verticals(self) -> list[int]:
        return [] if self.vertical is None else [self.vertical]


def vertical_models(schema: FeatureSchema, sizes: Sequence[str]) -> list[VerticalModel]:
    """A VM for every vertical of the data and every size, vertical by vertical, named
    after the vertical's name (`safe_names`) and the size: tab1-small."""
    names = safe_names(schema.verticals())
    if len(names) <= 1:
        return [VerticalModel(s, None, s) for s in sizes]
    return [VerticalModel(f"{v}-{s}", k, s) for k, v in names.items() for s in sizes]


UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
NAME_CHARS = 64  # of a vertical's part of a VM's name


def safe_names(names: Mapping[int, str]) -> dict[int, str]:
    """id -> a name of the vertical that is safe as a folder name, an MLflow registered
    model's name and a metric key: a raw value (a log's tab column) may hold '/', ':', a
    quote, spaces or nothing at all. Runs of other characters become '_', leading and
    trailing dots and dashes go (no '..', no hidden folder, no option-like name); an empty
    result is v{id}; a name another vertical took already gets _v{id}."""
    out: dict[int, str] = {}
    for k, raw in names.items():
        name = UNSAFE.sub("_", str(raw)).strip("._-")[:NAME_CHARS] or f"v{k}"
        while name in out.values():
            name = f"{name}_v{k}"
        out[k] = name
    return out


# (the VM, its variant, the data) -> the day's job (its split is set per day)
JobFor = Callable[[VerticalModel, DistillConfig, Path], TrainJob]


def train_vm(vm: VerticalModel, variants: Mapping[str, DistillConfig], job_for: JobFor, *,
             sessions: Path, augmented: Path, days: Sequence[int], first_served: int,
             chains: Path, owner: str, log_fn: LogFn | None = None
             ) -> dict[str, list[dict[str, Any]]]:
    """Every variant of `vm`, day by day (module docstring): `days` [0, last) each scored on
    the next; the days before `first_served` from `sessions` (labels only, one chain), the
    rest from `augmented` per variant, each going on from the labels-only model of the last
    day trained before. Returns variant -> its per-day rows (the shared days' rows in every
    variant). A day of the vertical too small to train on (a partial first day of an export,
    a small surface's day) is said in one line and skipped (its row says why): the model
    goes on from the day before it. Each variant's last model is its chain's newest
    finished day's (lrm.train.days.newest; None: no day of it trained)."""
    before = [d for d in days if d < first_served]
    after = [d for d in days if d >= first_served]
    labels = DistillConfig(distill=False)
    with progress.context(student=vm.name):
        shared = _days(job_for(vm, labels, sessions), vm, before, chains / PREFIX, owner,
                       log_fn)
    seed = newest(chains / PREFIX)
    out = {}
    for name, variant in variants.items():
        with progress.context(student=vm.name, variant=name):
            out[name] = shared + _days(job_for(vm, variant, augmented), vm, after,
                                       chains / name, owner, log_fn, seed=seed)
    return out


def last_model(chains: Path, variant: str) -> Path | None:
    """The newest model of a VM's `variant` (its chain, else the labels-only days before the
    teacher served; None: no day of the VM trained)."""
    return newest(Path(chains) / variant) or newest(Path(chains) / PREFIX)


def _days(job: TrainJob, vm: VerticalModel, days: Sequence[int], chain: Path, owner: str,
          log_fn: LogFn | None, seed: Path | None = None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for d in days:
        t0 = time.perf_counter()
        split = SplitConfig(days=[d], eval_day=d + 1, verticals=vm.verticals)
        day_job = job.but(split=split)
        if (why := too_small(day_job, [d])) is not None:
            log.info("%s day %d: skipped, %s", vm.name, d, why)
            rows.append({"train_day": d, "day": d + 1, "skipped": why, "ne": math.nan,
                         "auc": math.nan, "calibration": math.nan, "rows": 0})
            continue
        with progress.context(day=d):
            res = train_day(day_job, chain, d, owner=owner, log_fn=log_fn, seed=seed)
        rows.append({"train_day": d, "day": d + 1, "steps": res.steps,
                     "seconds": round(time.perf_counter() - t0, 2),
                     **{k: res.eval[k] for k in ("ne", "auc", "calibration", "rows")}})
        log.info("%s day %d -> eval day %d: NE %.4f AUC %.4f", vm.name, d, d + 1,
                 res.eval["ne"], res.eval["auc"])
    return rows


def pick(ne: Mapping[str, float]) -> str:
    """The serving variant: the lowest NE (on the validation day), and never one worse than
    labels only (labels only itself when none beats it, or when it is not in `ne`)."""
    if LABELS_ONLY in ne:
        best = min(ne, key=lambda v: (ne[v], v != LABELS_ONLY))
        return best if ne[best] < ne[LABELS_ONLY] else LABELS_ONLY
    raise ConfigError("registry.variant auto: the variants must include labels_only (the "
                      "served variant never does worse than it)")


def teacher_per_day(augmented: Path, days: Sequence[int]) -> dict[int, dict[str, Any]]:
    """The teacher's metrics on each augmented day, from the day manifests: over the day,
    and per vertical name (`by_vertical`)."""
    out = {}
    for d in days:
        m = read_manifest(Path(augmented) / f"day={d}")
        if m is None:
            raise ConfigError(f"students: day {d} of {augmented} is not augmented (no manifest); "
                              f"run the augment stage for it")
        out[d] = {**m["teacher_metrics"], "teacher": m["teacher"],
                  "by_vertical": m.get("teacher_metrics_by_vertical", {})}
    return out


def report(results: Mapping[str, Mapping[str, list[dict[str, Any]]]],
           vms: Sequence[VerticalModel], schema: FeatureSchema,
           teacher: Mapping[int, Mapping[str, Any]], *, validation_day: int | None,
           serving: str) -> dict[str, Any]:
    """The ExFM table on the last evaluation day, per vertical (the FM's NE on it, and every
    VM's variants), the serving pick per VM, and NE per day (for the plot).

    results: VM name -> variant -> per-day rows; teacher: day -> metrics (augment's).
    serving: registry.variant ("auto": picked on `validation_day`, see `pick`).
    """
    last = max(r["day"] for per in results.values() for rows in per.values() for r in rows)
    names = schema.verticals()
    t = teacher[last]
    verticals: dict[str, Any] = {}
    table = []
    for vm in vms:
        per = results[vm.name]
        vname = names.get(vm.vertical, "all") if vm.vertical is not None else "all"
        fm = t["by_vertical"].get(vname, t) if vm.vertical is not None else t
        vert = verticals.setdefault(vname, {"teacher": {k: fm.get(k) for k in
                                                        ("ne", "auc", "calibration")},
                                            "students": {}})
        final = {v: next(r for r in per[v] if r["day"] == last) for v in _ordered(per)}
        valid = {v: next((r["ne"] for r in per[v] if r["day"] == validation_day), math.nan)
                 for v in final} if validation_day is not None else {}
        chosen = (pick(valid) if serving == "auto" and valid else
                  LABELS_ONLY if serving == "auto" else serving)
        base = final[LABELS_ONLY]["ne"] if LABELS_ONLY in final else None
        vert["students"][vm.size] = {
            "model": vm.name, "serving": chosen, "validation_ne": valid,
            "variants": {v: {k: r[k] for k in ("ne", "auc", "calibration", "rows")}
                         for v, r in final.items()},
            "gain_vs_labels_only": {v: base / r["ne"] for v, r in final.items()
                                    if base is not None and v != LABELS_ONLY},
            "teacher_gain": (base / fm["ne"]) if base is not None and fm.get("ne") else None}
        if len(table) == 0 or table[-1]["vertical"] != vname:
            table.append({"vertical": vname, "model": "foundation model (teacher)",
                          "ne": fm.get("ne"), "auc": fm.get("auc")})
        for v, r in final.items():
            table.append({"vertical": vname, "model": f"{vm.size}, {LABELS.get(v, v)}"
                          + (" (served)" if v == chosen else ""), "ne": r["ne"],
                          "auc": r["auc"]})
    per_day = []
    days = sorted({r["day"] for per in results.values() for rows in per.values() for r in rows})
    for d in days:
        point: dict[str, Any] = {"day": d}
        if d in teacher:
            point["teacher"] = teacher[d]["ne"]
        for s, per in results.items():
            for v, rows in per.items():
                point[f"{s}/{v}"] = next((r["ne"] for r in rows if r["day"] == d), math.nan)
        per_day.append(point)
    return {"eval_day": last, "validation_day": validation_day, "serving_rule": serving,
            "teacher": {"ne": t["ne"], "auc": t["auc"], "calibration": t.get("calibration"),
                        "version": t.get("teacher")},
            "verticals": verticals, "table": table, "per_day": per_day,
            "serving": {vm.name: verticals[names.get(vm.vertical, "all")
                                           if vm.vertical is not None else "all"]
                        ["students"][vm.size]["serving"] for vm in vms}}


def _ordered(variants: Mapping[str, Any]) -> list[str]:
    """Variant names in the issue's order (labels only first), then any others as given."""
    return [v for v in VARIANTS if v in variants] + [v for v in variants if v not in VARIANTS]


def markdown(table: Sequence[Mapping[str, Any]]) -> str:
    """The table as GitHub markdown."""
    lines = ["| vertical | model | NE | AUC |", "|---|---|---|---|"]
    lines += [f"| {r['vertical']} | {r['model']} | {_f(r['ne'])} | {_f(r['auc'])} |"
              for r in table]
    return "\n".join(lines) + "\n"


def _f(x: Any) -> str:
    return "n/a" if x is None else f"{float(x):.4f}"


def mean_spread(values: Sequence[float]) -> dict[str, float]:
    """{mean, spread (max - min), std} of a few numbers (e.g. over seeds)."""
    vals = list(values)
    return {"mean": statistics.fmean(vals), "spread": max(vals) - min(vals),
            "std": statistics.stdev(vals) if len(vals) > 1 else 0.0}


__all__ = ["LABELS", "LABELS_ONLY", "VARIANTS", "VerticalModel", "markdown", "mean_spread",
           "pick", "report", "last_model", "safe_names", "teacher_per_day", "train_vm",
           "vertical_models"]
