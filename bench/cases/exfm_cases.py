"""ExFM benchmark cases (bench/exfm.py): the foundation model's lead, each vertical model's gain
from it, and augment's throughput.

The world and the procedure are the pipeline's: params.yaml's `generate` world (its
verticals), the foundation model's versions on their cadence and lag (lrm.exfm.fm, the
teacher stage's), every day augmented by the version that served it, and each vertical
model trained by the student stage's procedure (lrm.exfm.students.train_vm: labels only
until the teacher serves, then every variant), scored on each vertical's last day. A seed
is the whole procedure's: seed s trains the FM (its versions' init and data order) with
`train.seed` s mod the FM seeds, augments the days with it, and trains every vertical model
with seed s from those logits (the world is the same). The FM's NE moves by tenths of a
percent per vertical from one FM seed to the next on the default world (the README's ExFM
table), so one FM for every student seed would hide that part of the spread. --quick: a
small world of two verticals, one size, two variants, one seed (under a minute); --smoke:
the same with a few hundred sessions a day (seconds).
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import yaml

from bench.common import emit, smoke
from lrm.config import (
    DistillConfig,
    LogsConfig,
    ModelConfig,
    ParamsConfig,
    VerticalConfig,
    from_dict,
)
from lrm.data import dedup, synthetic
from lrm.data.loader import BatchLoader
from lrm.data.schema import day_files, read_schema
from lrm.dist import quiet_libraries
from lrm.exfm import fm
from lrm import metrics
from lrm.exfm import pick as P
from lrm.exfm import students as S
from lrm.exfm.augment import augment_dataset, teacher_logits
from lrm.exfm.distill import distillation
from lrm.exfm.schedule import schedule
from lrm.models.flops import flops_per_example
from lrm.models.saved import load_model
from lrm.train import build_job

REPO = Path(__file__).resolve().parents[2]
QUICK = {
    "generate": {"days": 5, "sessions_per_day": 3000, "users": 5000, "ads": 1000,
                 "verticals": [{"name": "north", "share": 0.6},
                               {"name": "south", "share": 0.4, "base_ctr": 0.05}]},
    "exfm": {"teacher_days": 2, "teacher_every": 2, "teacher_lag": 2},
    "model": {"teacher": {"embedding_dim": 16, "layers": 2, "fm_mlp": [64],
                          "top_mlp": [64, 32]}},
    "teacher": {"train": {"batch_size": 512}},
    "students": {"train": {"batch_size": 512},
                 "models": {"small": {"embedding_dim": 8, "bottom_mlp": [32],
                                      "top_mlp": [64, 32]}},
                 "variants": {"labels_only": {"distill": False},
                              "aux_adapter": {"aux_head": True, "adapter": True}}},
}

# on top of QUICK: few sessions, and every run a few steps (not the schedule's floor of 50)
SMOKE = {"generate": {"sessions_per_day": 400}, "train": {"steps": 6, "warmup_steps": 0},
         "teacher": {"train": {"batch_size": 256}}, "students": {"train": {"batch_size": 256}}}


def _params(quick: bool) -> dict[str, Any]:
    path = REPO / "params.yaml"
    p = yaml.safe_load(path.read_text()) if path.exists() else {}
    if quick or smoke():
        _merge(p, QUICK)
    if smoke():
        _merge(p, SMOKE)
    return p


def _merge(into: dict[str, Any], over: dict[str, Any]) -> None:
    for k, v in over.items():  # QUICK's models and variants are the whole sets
        if isinstance(v, dict) and isinstance(into.get(k), dict) and k not in ("models",
                                                                               "variants"):
            _merge(into[k], v)
        else:
            into[k] = v


# a world with a tiny surface where the truth is that distillation helps: the default
# world's three surfaces and two more, "tiny" (1.2% of the sessions: a VM of its own, its
# variants picked on a few thousand impressions a validation day) and "speck" (0.3%: under
# students.min_share, it serves the FM)
TINY_VERTICALS = [{"name": "tiny", "share": 0.012, "base_ctr": 0.04, "position": 1.0,
                   "own": 0.4},
                  {"name": "speck", "share": 0.003, "base_ctr": 0.03, "position": 1.0,
                   "own": 0.4}]


def params_of(quick: bool, tiny: bool = False, files: list[Path] | None = None
              ) -> ParamsConfig:
    """params.yaml (and `files` laid over it), --quick's small world, --world tiny's
    surfaces added to the world's."""
    p = _params(quick)
    for f in files or []:
        _merge(p, yaml.safe_load(Path(f).read_text()) or {})
    pc = from_dict(ParamsConfig, p, "params")
    if tiny:
        more = [from_dict(VerticalConfig, v, "tiny") for v in TINY_VERTICALS]
        pc = dataclasses.replace(pc, generate=dataclasses.replace(
            pc.generate, verticals=[*pc.generate.verticals, *more]))
    return pc


@contextmanager
def world(quick: bool, fm_seeds: int = 1, *, tiny: bool = False,
          log: list[Path] | None = None, mapping: Path | None = None,
          params: list[Path] | None = None) -> Iterator[dict[str, Any]]:
    """Data, then per FM seed its versions and the days augmented by them, in a temporary
    folder: `fms[k]` is FM seed k's {teachers, augmented, seconds}. The data: the params'
    synthetic world (with `tiny`, its tiny surfaces added), or a click `log` ingested
    through its column `mapping` (lrm ingest logs --map: the logs pipeline's procedure)."""
    quiet_libraries()
    pc = params_of(quick, tiny, params)
    with tempfile.TemporaryDirectory(prefix="lrm-bench-exfm-") as tmp:
        root = Path(tmp)
        source = "synthetic"
        if log:
            from lrm.data.logs.ingest import ingest
            from stagekit.cli import read_config_file

            cfg = from_dict(LogsConfig, {**dataclasses.asdict(pc.ingest.logs),
                                         **(read_config_file(mapping, "ingest.logs")
                                            if mapping else {})},
                            "ingest.logs")
            ingest(list(log), root / "raw", cfg, chunk_rows=pc.ingest.chunk_rows,
                   max_history=pc.generate.max_history)
            source = ", ".join(str(f) for f in log)
        else:
            synthetic.generate(pc.generate, root / "raw")
        dedup.dedup_dataset(root / "raw", root / "sessions", pc.dedup)
        sched = schedule(list(day_files(root / "sessions")), pc.exfm)
        fms = []
        for k in range(fm_seeds):
            train = dataclasses.replace(pc.train_for("teacher"), seed=k)
            job = build_job("teacher", train=train, model=pc.model, data=root / "sessions",
                            loader=pc.loader, checkpoint=pc.checkpoint)
            sched = fm.trainable(job, sched)
            t0 = time.perf_counter()
            (root / f"fm{k}").mkdir()
            fm.train_versions(job, sched, root / f"fm{k}", root / "chains" / f"fm{k}",
                              owner="bench")
            seconds = time.perf_counter() - t0
            # the versions are in fm{k}; their chain is for resuming only, and 3 FMs' chains
            # and the students' fill a small /tmp (a full run held 4.4 GB of them near its end)
            shutil.rmtree(root / "chains" / f"fm{k}")
            teachers = fm.teachers_by_day(root / f"fm{k}", list(day_files(root / "sessions")))
            augment_dataset(teachers, root / "sessions", root / f"augmented{k}",
                            batch_size=pc.augment.batch_size)
            fms.append({"teachers": teachers, "augmented": root / f"augmented{k}",
                        "seconds": seconds})
        yield {"root": root, "params": pc, "sched": sched, "fms": fms, "quick": quick,
               "source": source, "tiny": tiny}


def run_augment(w: dict[str, Any]) -> dict[str, Any]:
    """Augment rows/s vs the teacher's bare forward over the same batches (best of 2)."""
    teachers = w["fms"][0]["teachers"]
    day = max(teachers)
    folder = teachers[day]
    model, card = load_model(folder)
    batch = w["params"].augment.batch_size
    sessions = w["root"] / "sessions"

    def bare() -> int:
        loader = BatchLoader(sessions, batch, days=[day], hash_sizes=card.hash_sizes)
        return sum(len(x) for x in teacher_logits(model, loader))

    best_bare = best_aug = float("inf")
    rows = 0
    for _ in range(2):
        t0 = time.perf_counter()
        rows = bare()
        best_bare = min(best_bare, time.perf_counter() - t0)
        t0 = time.perf_counter()
        augment_dataset(folder, sessions, w["root"] / "aug-bench", [day], batch_size=batch,
                        force=True)
        best_aug = min(best_aug, time.perf_counter() - t0)
    t0 = time.perf_counter()  # the skip path: the day current, only the hashing is paid
    skipped = augment_dataset(folder, sessions, w["root"] / "aug-bench", [day],
                              batch_size=batch)
    skip_s = time.perf_counter() - t0
    assert skipped["written"] == []
    return emit("exfm.augment", "augment_vs_bare_teacher_forward", "rows/s",
                candidate=round(rows / best_aug, 1), baseline=round(rows / best_bare, 1),
                better="higher", rows=rows, day=day, batch_size=batch,
                seconds_augment=round(best_aug, 3), seconds_bare=round(best_bare, 3),
                seconds_rerun_skipped=round(skip_s, 3), threads=torch.get_num_threads(),
                quick=w["quick"])


def old_rule(ne: dict[str, float]) -> str:
    """The pick before issue 44 (the baseline of exfm.pick_regret): the lowest NE on one
    validation day (the evaluation day before the last), never worse than labels only."""
    best = min(ne, key=lambda v: (ne[v], v != S.LABELS_ONLY))
    return best if ne[best] < ne[S.LABELS_ONLY] else S.LABELS_ONLY


def students(w: dict[str, Any], seeds: int, keep: Path | None = None
             ) -> list[dict[str, Any]]:
    """The student stage's procedure for each seed (lrm.exfm.students.train_students: every
    vertical model, every variant, the pick), seed s distilled from FM seed s mod
    len(w["fms"]): its report, with `old_rule`'s pick beside the served one and the pick
    judged on each held-out day (`held_out`). `keep`: every candidate's logits per VM and
    day written there (seed=S/VM/day=D.pt, lrm.exfm.pick.save_scores), to replay a rule."""
    pc: ParamsConfig = w["params"]
    root = w["root"]
    sessions = root / "sessions"
    schema, _ = read_schema(sessions)
    vms = S.vertical_models(schema, list(pc.students.models))
    days = sorted(day_files(sessions))[:-1]
    evals = [d + 1 for d in days]
    small = S.small_surfaces(schema, S.vertical_rows(sessions, days),
                             verticals=pc.students.verticals, min_share=pc.students.min_share)
    reports = []
    for seed in range(seeds):
        augmented = w["fms"][seed % len(w["fms"])]["augmented"]
        served = sorted(day_files(augmented))
        cfg = dataclasses.replace(pc.train_for("students"), seed=seed)

        def job_for(vm: S.VerticalModel, variant: DistillConfig, data: Path) -> Any:
            d = distillation(ModelConfig(tables=pc.model.tables,
                                         student=pc.students.models[vm.size]), variant)
            return build_job("student", train=cfg,  # noqa: B023 (this seed's)
                             model=d.model, data=data, loader=pc.loader,
                             checkpoint=pc.checkpoint, loss=d.loss,
                             teacher_column=d.teacher_column, growth=d.growth)

        run = S.train_students(vms, pc.students.variants, job_for, sessions=sessions,
                               augmented=augmented, days=days,
                               chains=root / "chains" / f"seed{seed}", owner="bench",
                               rule="auto", prior=pc.registry.pick.prior,
                               pick_days=pc.registry.pick.days, fm=pc.registry.pick.fm,
                               fm_ties=pc.registry.pick.fm_ties,
                               small=small, score_all=True)
        rep = S.report(run.results, vms, schema,
                       S.teacher_per_day(augmented, [d for d in evals if d in served]),
                       served=run.served, picks=run.picks, trained=run.not_trained)
        one_day = evals[-2]  # the old rule's one validation day
        rep["old_served"] = {
            name: old_rule({v: next(r["ne"] for r in rows if r["day"] == one_day)
                            for v, rows in per.items()}) if per else S.FM
            for name, per in run.results.items()}
        prior = P.prior_of(list(pc.students.variants),
                           {n: v.distill for n, v in pc.students.variants.items()},
                           pc.registry.pick.prior)
        full = full_days(sessions)
        rep["held_out"] = {name: held_out(sc, prior, pc.registry.pick.days,
                                          fm=pc.registry.pick.fm, full=full,
                                          fm_ties=pc.registry.pick.fm_ties)
                           for name, sc in run.scores.items() if sc}
        if keep is not None:
            for name, sc in run.scores.items():
                for d, x in sc.items():
                    P.save_scores(keep / f"seed={seed}" / name, d, x, owner="bench")
        reports.append(rep)
        shutil.rmtree(root / "chains" / f"seed{seed}")  # the seed's rows are in its report
    return reports


FULL = 0.75  # a day with under this share of the median day's rows is a partial day


def full_days(data: Path) -> list[int]:
    """The days of `data` with at least FULL of the median day's rows (every surface's: a
    small surface's own rows vary too much from day to day to tell a half day)."""
    import pyarrow.parquet as pq

    rows = {d: sum(pq.read_metadata(f).num_rows for f in files)
            for d, files in day_files(data).items()}
    median = sorted(rows.values())[len(rows) // 2] if rows else 0
    return [d for d, n in sorted(rows.items()) if n >= FULL * median]


def held_out(scores: dict[int, P.Scores], prior: str, pick_days: int, *, fm: bool = True,
             full: Sequence[int] | None = None,
             fm_ties: bool = False) -> dict[int, dict[str, Any]]:
    """The pick judged on held-out days (`scores`: a VM's candidates on every evaluation
    day the teacher served): for each full day H with `pick_days` scored days before it,
    what the pipeline would serve were H its last day (lrm.exfm.pick on those days), the old
    rule's choice (`old_rule` on the day before H), and every candidate's NE on H (the same
    rows). A partial day (an export's last, cut mid-day: under FULL of the median rows) is
    too noisy to judge on: left out. Where no day has the days before it (a short world),
    the last full day is judged on what there is."""
    days = sorted(scores)
    median = sorted(scores[d].rows for d in days)[len(days) // 2] if days else 0
    full = [d for d in days if (d in full if full is not None
                                else scores[d].rows >= FULL * median)]
    judged = ([d for d in full if sum(e < d for e in days) >= pick_days]
              or (full or days)[-1:])
    out = {}
    for h in judged:
        cands = [c for c in scores[h].logits if fm or c != P.FM]
        seen, used = P.pool({d: x for d, x in scores.items() if d < h}, cands, pick_days)
        served = P.choose(seen, prior, days=used, fm_ties=fm_ties).served
        ne = {c: metrics.normalized_entropy(scores[h].logits[c], scores[h].labels)
              for c in cands}
        if not all(math.isfinite(x) for x in ne.values()):
            continue  # no click that day: no NE to judge on
        before = [d for d in days if d < h]
        old = (old_rule({c: metrics.normalized_entropy(scores[before[-1]].logits[c],
                                                        scores[before[-1]].labels)
                         for c in cands if c != P.FM}) if before else S.LABELS_ONLY)
        out[h] = {"served": served, "old": old, "ne": ne, "rows": scores[h].rows,
                  "days": used}
    return out


def run_gains(w: dict[str, Any], seeds: int = 3, keep: Path | None = None
              ) -> list[dict[str, Any]]:
    """exfm.teacher_gain per vertical; per vertical x size exfm.student_gain,
    exfm.pick_regret and exfm.served_vs_labels; the held-out table (exfm.table)."""
    pc: ParamsConfig = w["params"]
    t0 = time.perf_counter()
    reports = students(w, seeds, keep)
    seconds = round(time.perf_counter() - t0, 1)
    schema, _ = read_schema(w["root"] / "sessions")
    flops = {"teacher": _flops("teacher", pc.model, schema),
             **{s: _flops("student", ModelConfig(tables=pc.model.tables, student=m), schema)
                for s, m in pc.students.models.items()}}
    n_fm = len(w["fms"])
    common = {"seeds": list(range(seeds)), "fm_seeds": list(range(n_fm)),
              "eval_day": reports[0]["eval_day"],
              "validation_days": reports[0]["validation_days"],
              "fm_cuts": list(w["sched"].cuts), "teacher_lag": w["sched"].lag,
              "flops_per_example": flops, "source": w["source"],
              "fm_seconds": [round(f["seconds"], 1) for f in w["fms"]],
              "students_seconds": seconds, "quick": w["quick"]}
    out = []
    for vname, v in reports[0]["verticals"].items():
        # the FM on the vertical's last day, over its seeds (report k holds FM k's for k <
        # n_fm): NE, AUC and calibration, as the variants' rows of the table below
        fms = [reports[k]["verticals"][vname]["teacher"] for k in range(min(n_fm, seeds))]
        fm_table = {k: S.mean_spread([t[k] for t in fms]) for k in ("ne", "auc", "calibration")
                    if all(t.get(k) is not None for t in fms)}
        fm_ne, f = [t["ne"] for t in fms], fm_table["ne"]
        held = [f["mean"]] + [x["ne"] for r in reports
                              for st in r["verticals"][vname]["students"].values()
                              for x in st["variants"].values()]
        if not all(x is not None and math.isfinite(x) for x in held):
            # a surface's held-out day without a click (a few rows): no NE to compare
            print(f"exfm: {vname}: no NE on the held-out day {common['eval_day']} for every "
                  "model (too few rows, no click): no line", file=sys.stderr)
            continue
        labels = {s: [r["verticals"][vname]["students"][s]["variants"]["labels_only"]["ne"]
                      for r in reports] for s in v["students"]
                  if "labels_only" in v["students"][s]["variants"]}
        if labels:
            best = min(labels, key=lambda s: S.mean_spread(labels[s])["mean"])
            b = S.mean_spread(labels[best])
            out.append(emit("exfm.teacher_gain", vname, "NE", candidate=round(f["mean"], 5),
                            baseline=round(b["mean"], 5), better="lower",
                            fm_per_seed=[round(x, 5) for x in fm_ne],
                            fm_spread=round(f["spread"], 5),
                            best_labels_only=best, labels_only_per_seed=labels[best],
                            labels_only_spread=round(b["spread"], 5), **common))
        for size in v["students"]:
            out += _size_lines(reports, vname, size, fm_table, common)
    return out


def _evidence(pick: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a seed's pick saw (lrm.exfm.pick.Pick): its pooled validation NEs, each
    candidate's paired interval against the prior (the FM's: against the VM chosen), the
    rows and days: why the served one served."""
    if not pick:
        return None
    return {"rows": pick["rows"], "days": pick["days"], "prior": pick["prior"],
            "ne": {k: round(v, 5) for k, v in pick["ne"].items()},
            "against": {k: [round(x, 5) for x in v] for k, v in pick["against"].items()}}


def _size_lines(reports: list[dict[str, Any]], vname: str, size: str,
                fm_table: dict[str, Any], common: dict[str, Any]) -> list[dict[str, Any]]:
    """A vertical model's lines: its held-out table, and where it has variants of its own
    student_gain (served against labels only), pick_regret (the served NE against the best
    candidate's, the old rule's beside it) and served_vs_labels."""
    per = [r["verticals"][vname]["students"][size] for r in reports]
    model = per[0]["model"]
    served = [p["serving"] for p in per]
    old = [r["old_served"][model] for r in reports]
    table = {var: {k: S.mean_spread([p["variants"][var][k] for p in per])
                   for k in ("ne", "auc", "calibration")}
             for var in per[0]["variants"] if all(p["variants"][var]["ne"] is not None
                                                  for p in per)}
    out = [emit("exfm.table", f"{vname}/{size}", "NE",
                candidate=round(S.mean_spread([p["variants"][s]["ne"]
                                               for p, s in zip(per, served, strict=True)])
                                ["mean"], 5),
                baseline=round(fm_table["ne"]["mean"], 5), better="lower",
                served=served, old_rule_served=old,
                variants={var: round(t["ne"]["mean"], 5) for var, t in table.items()},
                not_trained=per[0].get("not_trained"), pick=[_evidence(p.get("pick"))
                                                             for p in per], **common)]
    if "labels_only" not in per[0]["variants"]:
        return out  # a small surface: the FM serves, nothing to compare it with
    ne = [{var: p["variants"][var]["ne"] for var in p["variants"]} for p in per]
    best = [min(x.values()) for x in ne]
    # the data's last day alone (an export's is often partial: a noisy judge), per seed
    last = {"last_day_per_seed": [round(x[s] / b, 5) for x, s, b in
                                  zip(ne, served, best, strict=True)],
            "last_day_vs_labels_per_seed": [round(x["labels_only"] / x[s], 5)
                                            for x, s in zip(ne, served, strict=True)]}
    # judged on every held-out full day (held_out): the seed x day figures
    held = [r["held_out"][model] for r in reports]
    regret = [[j["ne"][j["served"]] / min(j["ne"].values()) for j in h.values()]
              for h in held]
    regret_old = [[j["ne"][j["old"]] / min(j["ne"].values()) for j in h.values()]
                  for h in held]
    vs = [[j["ne"]["labels_only"] / j["ne"][j["served"]] for j in h.values()] for h in held]
    vs_old = [[j["ne"]["labels_only"] / j["ne"][j["old"]] for j in h.values()] for h in held]
    days = {"held_out_days": [sorted(h) for h in held],
            "served_per_day": [[j["served"] for j in h.values()] for h in held],
            "old_rule_per_day": [[j["old"] for j in h.values()] for h in held],
            "best_per_day": [[min(j["ne"], key=j["ne"].get) for j in h.values()]
                             for h in held],
            "rows_per_day": [[j["rows"] for j in h.values()] for h in held]}
    out.append(emit("exfm.pick_regret", f"{vname}/{size}", "NE ratio",
                    candidate=round(_mean(regret), 5), baseline=round(_mean(regret_old), 5),
                    better="lower", aim=1.005, **_over(regret), **_over(regret_old, "old_rule_"),
                    **days, **last, **common))
    out.append(emit("exfm.served_vs_labels", f"{vname}/{size}", "NE ratio",
                    candidate=round(_mean(vs), 5), baseline=round(_mean(vs_old), 5),
                    better="higher", aim=1.0, **_over(vs), **_over(vs_old, "old_rule_"),
                    **days, **last, **common))
    base = [x["labels_only"] for x in ne]
    cand = [x[s] for x, s in zip(ne, served, strict=True)]
    spread = max(S.mean_spread(base)["spread"], S.mean_spread(cand)["spread"])
    paired = S.mean_spread([b_ - c for b_, c in zip(base, cand, strict=True)])
    gain = paired["mean"]
    out.append(emit("exfm.student_gain", f"{vname}/{size}", "NE",
                    candidate=round(S.mean_spread(cand)["mean"], 5),
                    baseline=round(S.mean_spread(base)["mean"], 5), better="lower",
                    served=served, candidate_per_seed=cand, baseline_per_seed=base,
                    gain_per_seed=[round(b_ / c, 5) for b_, c in zip(base, cand, strict=True)],
                    spread=round(spread, 5),
                    gain_over_spread=round(gain / spread, 2) if spread else None,
                    # a seed's variants share its init and data order: the spread of the
                    # gain itself, seed by seed (the stricter figure is above)
                    gain_spread=round(paired["spread"], 5),
                    gain_over_gain_spread=(round(gain / paired["spread"], 2)
                                           if paired["spread"] else None),
                    table={**table, "teacher": fm_table}, **common))
    return out


def _mean(per: list[list[float]]) -> float:
    return S.mean_spread([x for xs in per for x in xs])["mean"]


def _over(per: list[list[float]], prefix: str = "") -> dict[str, Any]:
    """Seed x held-out day figures: each seed's days, each seed's mean, the worst day, and
    the spread of the per-seed means and of every day (max - min)."""
    flat = [x for xs in per for x in xs]
    means = [S.mean_spread(xs)["mean"] for xs in per]
    return {f"{prefix}per_seed_day": [[round(x, 5) for x in xs] for xs in per],
            f"{prefix}per_seed": [round(x, 5) for x in means],
            f"{prefix}seed_spread": round(max(means) - min(means), 5),
            f"{prefix}day_min": round(min(flat), 5), f"{prefix}day_max": round(max(flat), 5),
            f"{prefix}day_std": round(S.mean_spread(flat)["std"], 5)}


def _flops(kind: str, cfg: ModelConfig, schema: Any) -> int:
    from lrm.models import build_model

    return round(flops_per_example(build_model(kind, schema, cfg), schema))  # type: ignore[arg-type]
