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

The serving variant (`registry.variant: auto`) is picked by measurement on the validation
days (the evaluation days before the last, pooled), so that noise does not pick it
(lrm.exfm.pick: a prior for the variant that distils, paired intervals, the foundation
model's own prediction where no VM beats it); the last evaluation day is held out for the
table. A VM with no model (every day of its vertical too small to train on) serves the
foundation model's prediction.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lrm import progress
from lrm.config import DistillConfig, PickConfig, SplitConfig, default_variants
from lrm.data.schema import FeatureSchema, day_files
from lrm.errors import ConfigError
from lrm.exfm.augment import TEACHER_COLUMN, read_manifest
from lrm.exfm.pick import FM, Pick, Scores, choose, day_scores, pool, prior_of
from lrm.train.days import model_of, newest, too_small, train_day
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
PICK_DAYS = PickConfig().days  # registry.pick.days' default (one place: lrm.config)


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


@dataclass
class VMRun:
    """What training a VM's variants day by day gave."""

    rows: dict[str, list[dict[str, Any]]]  # variant -> its per-day rows
    # validation day -> every variant's logits on the VM's rows of that day (and the FM's,
    # logged in the augmented data): what the served variant is picked on (lrm.exfm.pick)
    scores: dict[int, Scores] = field(default_factory=dict)


def train_vm(vm: VerticalModel, variants: Mapping[str, DistillConfig], job_for: JobFor, *,
             sessions: Path, augmented: Path, days: Sequence[int], first_served: int,
             chains: Path, owner: str, log_fn: LogFn | None = None,
             validation: Sequence[int] = ()) -> VMRun:
    """Every variant of `vm`, day by day (module docstring): `days` [0, last) each scored on
    the next; the days before `first_served` from `sessions` (labels only, one chain), the
    rest from `augmented` per variant, each going on from the labels-only model of the last
    day trained before. Returns variant -> its per-day rows (the shared days' rows in every
    variant), and on each `validation` day (an evaluation day of the augmented data) every
    variant's and the FM's logits on the VM's rows (`VMRun.scores`). A day of the vertical
    too small to train on (a partial first day of an export, a small surface's day) is said
    in one line and skipped (its row says why): the model goes on from the day before it.
    Each variant's last model is its chain's newest finished day's (lrm.train.days.newest;
    None: no day of it trained)."""
    before = [d for d in days if d < first_served]
    after = [d for d in days if d >= first_served]
    labels = DistillConfig(distill=False)
    with progress.context(student=vm.name):
        shared = _days(job_for(vm, labels, sessions), vm, before, chains / PREFIX, owner,
                       log_fn)
    seed = newest(chains / PREFIX)
    out = {}
    per: dict[int, dict[str, Scores]] = {}
    for name, variant in variants.items():
        with progress.context(student=vm.name, variant=name):
            out[name] = shared + _days(job_for(vm, variant, augmented), vm, after,
                                       chains / name, owner, log_fn, seed=seed,
                                       score=(name, validation, per))
    return VMRun(out, {d: merged(parts) for d, parts in sorted(per.items())})


def merged(parts: Mapping[str, Scores]) -> Scores:
    """One day's scores of several variants, each scored on its own pass over the same rows,
    as one Scores (the labels must agree row for row: the same rows, in the same order)."""
    first = next(iter(parts.values()))
    logits: dict[str, torch.Tensor] = {}
    for name, p in parts.items():
        if not torch.equal(p.labels, first.labels):
            raise RuntimeError(f"validation scores of {name} are not on the same rows as "
                               f"{next(iter(parts))}'s")
        logits.update(p.logits)
    return Scores(first.labels, logits)


def last_model(chains: Path, variant: str) -> Path | None:
    """The newest model of a VM's `variant` (its chain, else the labels-only days before the
    teacher served; None: no day of the VM trained)."""
    return newest(Path(chains) / variant) or newest(Path(chains) / PREFIX)


def _days(job: TrainJob, vm: VerticalModel, days: Sequence[int], chain: Path, owner: str,
          log_fn: LogFn | None, seed: Path | None = None,
          score: tuple[str, Sequence[int], dict[int, dict[str, Scores]]] | None = None
          ) -> list[dict[str, Any]]:
    """Train `days` of the chain; with `score` (variant, validation days, into), the day's
    model's logits on each validation day (and the FM's, from the augmented data) go into
    `into[day][variant]`."""
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
        if score is not None and d + 1 in score[1]:
            name, _, into = score
            into.setdefault(d + 1, {})[name] = day_scores(
                {name: model_of(chain, d)}, job.data, d + 1, vm.verticals or None,
                teacher_column=TEACHER_COLUMN)
    return rows


@dataclass
class Students:
    """The student stage's procedure over every VM (`train_students`): what it trained, what
    it picked and what each VM serves."""

    results: dict[str, dict[str, list[dict[str, Any]]]]  # VM -> variant -> per-day rows
    picks: dict[str, Pick]  # VM -> the pick (registry.variant auto, a VM with a model)
    served: dict[str, str]  # VM -> its served variant, or FM (VMs with nothing to serve: out)
    not_trained: dict[str, str]  # VM -> why it has no model of its own (a small surface)
    validation: list[int]  # the evaluation days the picks may pool
    # VM -> evaluation day -> every candidate's logits on its rows (`score_all`: every day
    # the teacher served, the held-out last too; else the days the pick pooled)
    scores: dict[str, dict[int, Scores]] = field(default_factory=dict)


def train_students(vms: Sequence[VerticalModel], variants: Mapping[str, DistillConfig],
                   job_for: JobFor, *, sessions: Path, augmented: Path, days: Sequence[int],
                   chains: Path, owner: str, rule: str, prior: str = "",
                   pick_days: int = PICK_DAYS,
                   fm: bool = True, fm_ties: bool = False,
                   small: Mapping[int, str] | None = None,
                   log_fn: LogFn | None = None,
                   done: Callable[[VerticalModel, Path], None] | None = None,
                   score_all: bool = False) -> Students:
    """Every VM of `vms` day by day in every variant (`train_vm`, each in chains/VM), then
    what it serves (`served_variant`): registry.variant `rule`, with auto chosen on the
    last `pick_days` evaluation days before the held-out last (lrm.exfm.pick, against
    `prior`, the FM a candidate when `fm`, a tie to the FM with `fm_ties`). A VM of a
    `small` surface is not trained and serves the FM. `done(vm, chains)`: called once a
    VM's days are over (the stage links its models). `score_all`: every candidate scored on
    every evaluation day the teacher served, the held-out last included (`Students.scores`;
    bench/exfm.py judges the pick on each held-out day from them); the pick still sees only
    the validation days."""
    small = small or {}
    first_served = min(day_files(augmented))
    evals = [d + 1 for d in days]
    # the evaluation days the variants were scored on, but the held-out last
    validation = [e for e in evals[:-1] if e - 1 >= first_served]
    distils = {n: v.distill for n, v in variants.items()}
    prior = prior_of(list(variants), distils, prior)
    if prior not in variants:
        raise ConfigError(f"registry.pick.prior: {prior!r} is not one of students.variants "
                          f"{sorted(variants)}")
    out = Students({}, {}, {}, {}, validation)
    scored = ([e for e in evals if e - 1 >= first_served] if score_all else
              validation[-pick_days:] if rule == "auto" else [])
    for vm in vms:
        if vm.vertical is not None and vm.vertical in small and fm:
            out.not_trained[vm.name] = small[vm.vertical]
            out.results[vm.name] = {}
            out.served[vm.name] = FM
            log.info("%s: no vertical model (%s): serves the foundation model",
                     vm.name, small[vm.vertical])
            continue
        run = train_vm(vm, variants, job_for, sessions=sessions, augmented=augmented,
                       days=days, first_served=first_served, chains=chains / vm.name,
                       owner=owner, log_fn=log_fn, validation=scored)
        out.results[vm.name] = run.rows
        out.scores[vm.name] = run.scores
        models = [v for v in variants if last_model(chains / vm.name, v) is not None]
        pk = None
        if rule == "auto" and prior in models:
            cands = models + ([FM] if fm else [])
            seen = {d: x for d, x in run.scores.items() if d in validation}  # never the last
            pooled, used = pool(seen, cands, pick_days)
            pk = choose(pooled, prior, days=used, fm_ties=fm_ties)
            out.picks[vm.name] = pk
            log.info("%s serves %s: %s", vm.name, pk.served, pk.reason)
        served = served_variant(rule, pk, models, fm)
        if served is not None:
            out.served[vm.name] = served
        if done is not None:
            done(vm, chains / vm.name)
    return out


def vertical_rows(data: Path, days: Sequence[int]) -> dict[int, int]:
    """vertical id -> its impressions over `days` of `data` (one pass over two columns)."""
    import pyarrow.compute as pc

    from lrm.data import parquet
    from lrm.data.schema import LABEL, day_files, read_schema

    schema, layout = read_schema(data)
    files = day_files(data)
    out: dict[int, int] = {}
    if schema.vertical is None:
        return out
    for d in days:
        for f in files.get(d, []):
            t = parquet.read_table(f, columns=[LABEL, schema.vertical])
            n = (pc.list_value_length(t.column(LABEL)) if layout == "sessions"
                 else pc.cast(pc.is_valid(t.column(LABEL)), "int64"))
            v = t.column(schema.vertical)
            for k, c in zip(v.to_pylist(), n.to_pylist(), strict=True):
                if k is not None:
                    out[k] = out.get(k, 0) + int(c or 0)
    return out


def small_surfaces(schema: FeatureSchema, counts: Mapping[int, int], *,
                   verticals: Sequence[str] = (), min_share: float = 0.0) -> dict[int, str]:
    """vertical id -> why it gets no VM of its own (students.verticals, students.min_share:
    it serves the foundation model's prediction); {} on data of one vertical."""
    names = schema.verticals()
    if len(names) <= 1:
        return {}
    if verticals:
        unknown = sorted(set(verticals) - set(names.values()))
        if unknown:
            raise ConfigError(f"students.verticals: {unknown} are not verticals of the data "
                              f"({sorted(names.values())})")
        return {k: "not in students.verticals" for k, v in names.items()
                if v not in verticals}
    total = sum(counts.values()) or 1
    return {k: f"{counts.get(k, 0)} of {total} impressions ({counts.get(k, 0) / total:.2%}), "
               f"under students.min_share {min_share:g}"
            for k in names if counts.get(k, 0) / total < min_share}


def served_variant(rule: str, pick: Pick | None, models: Sequence[str], fm: bool) -> str | None:
    """What a VM serves: registry.variant `rule` (auto: `pick`'s choice), among the variants
    that have a model (`models`; FM when `fm`, the foundation model's prediction, is at
    hand); a VM with no model serves the FM. None: nothing to serve (no model, no FM)."""
    if rule == FM:
        return FM if fm else None
    want = (pick.served if pick is not None else None) if rule == "auto" else rule
    if want == FM and fm:
        return FM
    if want in models:
        return want
    if rule == "auto" and LABELS_ONLY in models:
        return LABELS_ONLY  # (a pick made without the models: never)
    return FM if fm else (models[0] if models else None)


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
           teacher: Mapping[int, Mapping[str, Any]], *, served: Mapping[str, str],
           picks: Mapping[str, Pick] | None = None, serving: str = "auto",
           trained: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ExFM table on the last evaluation day, per vertical (the FM's NE on it, and every
    VM's variants, the FM's own prediction as `fm`), the served variant per VM, and NE per
    day (for the plot).

    results: VM name -> variant -> per-day rows (a VM with none: not trained, it serves
    the FM); teacher: day -> metrics (augment's); served: VM name -> its served variant
    (or FM); picks: VM name -> the pick that chose it (registry.variant auto); serving: the
    rule, for the report; trained: VM name -> why it was not trained (a small surface).
    """
    picks, trained = picks or {}, trained or {}
    last = max((r["day"] for per in results.values() for rows in per.values() for r in rows),
               default=max(teacher))
    names = schema.verticals()
    t = teacher[last]
    verticals: dict[str, Any] = {}
    table = []
    for vm in vms:
        per = results.get(vm.name, {})
        vname = names.get(vm.vertical, "all") if vm.vertical is not None else "all"
        fm = t["by_vertical"].get(vname, t) if vm.vertical is not None else t
        vert = verticals.setdefault(vname, {"teacher": {k: fm.get(k) for k in
                                                        ("ne", "auc", "calibration")},
                                            "students": {}})
        final = {v: next(r for r in per[v] if r["day"] == last) for v in _ordered(per)}
        final[FM] = {k: fm.get(k, math.nan) for k in ("ne", "auc", "calibration", "rows")}
        chosen = served[vm.name]
        pk = picks.get(vm.name)
        base = final[LABELS_ONLY]["ne"] if LABELS_ONLY in final else None
        vert["students"][vm.size] = {
            "model": vm.name, "serving": chosen,
            "validation_ne": pk.ne if pk is not None else {},
            "pick": pk.as_dict() if pk is not None else None,
            "variants": {v: {k: r.get(k) for k in ("ne", "auc", "calibration", "rows")}
                         for v, r in final.items()},
            "gain_vs_labels_only": {v: base / r["ne"] for v, r in final.items()
                                    if base is not None and v != LABELS_ONLY},
            "teacher_gain": (base / fm["ne"]) if base is not None and fm.get("ne") else None,
            **({"not_trained": trained[vm.name]} if vm.name in trained else {})}
        if len(table) == 0 or table[-1]["vertical"] != vname:
            table.append({"vertical": vname, "model": "foundation model (teacher)",
                          "ne": fm.get("ne"), "auc": fm.get("auc")})
        if chosen == FM:
            why = " (no VM: a small surface)" if vm.name in trained else ""
            table.append({"vertical": vname, "model": f"{vm.size}: serves the foundation "
                          f"model{why}", "ne": fm.get("ne"), "auc": fm.get("auc")})
        for v, r in final.items():
            if v != FM:
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
    valid = sorted({d for p in picks.values() for d in p.days})
    return {"eval_day": last, "validation_days": valid,
            "validation_day": valid[-1] if valid else None, "serving_rule": serving,
            "teacher": {"ne": t["ne"], "auc": t["auc"], "calibration": t.get("calibration"),
                        "version": t.get("teacher")},
            "verticals": verticals, "table": table, "per_day": per_day,
            "serving": dict(served)}


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


__all__ = ["LABELS", "LABELS_ONLY", "VARIANTS", "Students", "VMRun", "VerticalModel",
           "markdown", "mean_spread", "merged", "report", "last_model", "safe_names",
           "served_variant", "small_surfaces", "teacher_per_day", "train_students", "train_vm",
           "vertical_models", "vertical_rows"]
