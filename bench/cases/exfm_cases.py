"""ExFM benchmark cases (bench/exfm.py): augment throughput, and the student's NE gain.

The world: the synthetic log with params.yaml's `generate` section (drift on), the teacher
trained by the ordinary loop on days [0, T) with the `teacher` section, the students' days
augmented by it. --quick: 4 days of 4,000 sessions, T = 2, smaller teacher and student.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import yaml

from bench.common import emit
from lrm.config import (
    DedupConfig,
    ParamsConfig,
    SplitConfig,
    StudentStageConfig,
    from_dict,
    with_overrides,
)
from lrm.data import dedup, synthetic
from lrm.data.loader import BatchLoader
from lrm.exfm import students as S
from lrm.exfm.augment import augment_dataset, teacher_logits
from lrm.train import TrainJob, train
from lrm.dist import quiet_libraries
from lrm.train.export import load_model

REPO = Path(__file__).resolve().parents[2]
QUICK = {
    "generate": {"days": 4, "sessions_per_day": 4000},
    "exfm": {"teacher_days": 2},
    "model": {"teacher": {"embedding_dim": 16, "layers": 2, "fm_mlp": [128],
                          "top_mlp": [128, 32]}},
    "teacher": {"train": {"batch_size": 512}},
    "students": {"train": {"batch_size": 512},
                 "models": {"small": {"embedding_dim": 8, "bottom_mlp": [32],
                                      "top_mlp": [64, 32]}}},
}


def _params(quick: bool) -> dict[str, Any]:
    path = REPO / "params.yaml"
    p = yaml.safe_load(path.read_text()) if path.exists() else {}
    if quick:
        _merge(p, QUICK)
    return p


def _merge(into: dict[str, Any], over: dict[str, Any]) -> None:
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


@contextmanager
def world(quick: bool) -> Iterator[dict[str, Any]]:
    """Data, teacher and augmented days in a temporary folder (see the module docstring)."""
    quiet_libraries()
    p = _params(quick)
    pc = from_dict(ParamsConfig, p, "params")
    gen, exfm, mcfg, acfg, loader = pc.generate, pc.exfm, pc.model, pc.augment, pc.loader
    scfg = pc.students
    teacher_train = with_overrides(pc.train, pc.teacher.train)
    student_train = with_overrides(pc.train, scfg.train)
    with tempfile.TemporaryDirectory(prefix="lrm-bench-exfm-") as tmp:
        root = Path(tmp)
        synthetic.generate(gen, root / "raw")
        dedup.dedup_dataset(root / "raw", root / "sessions", DedupConfig())
        T = exfm.teacher_days
        t0 = time.perf_counter()
        res = train(TrainJob(kind="teacher", train=teacher_train, model=mcfg,
                             data=root / "sessions",
                             split=SplitConfig(days=list(range(T)), eval_day=T), loader=loader,
                             out=root / "teacher"))
        teacher_s = time.perf_counter() - t0
        days = [d for d in range(gen.days) if d >= T]
        aug = augment_dataset(root / "teacher", root / "sessions", root / "augmented", days,
                              batch_size=acfg.batch_size)
        yield {"root": root, "sessions": root / "sessions", "augmented": root / "augmented",
               "teacher": root / "teacher", "teacher_eval": res.eval, "teacher_s": teacher_s,
               "augment": aug, "days": days, "exfm": exfm, "students": scfg, "loader": loader,
               "student_train": student_train,
               "augment_cfg": acfg, "generate": gen, "tables": mcfg.tables, "quick": quick}


def run_augment(w: dict[str, Any]) -> dict[str, Any]:
    """Augment rows/s vs the teacher's bare forward over the same batches (best of 2)."""
    model, card = load_model(w["teacher"])
    batch = w["augment_cfg"].batch_size
    days = w["days"]

    def bare() -> int:
        loader = BatchLoader(w["sessions"], batch, days=days, hash_sizes=card.hash_sizes)
        return sum(len(x) for x in teacher_logits(model, loader))

    best_bare = best_aug = float("inf")
    rows = 0
    for _ in range(2):
        t0 = time.perf_counter()
        rows = bare()
        best_bare = min(best_bare, time.perf_counter() - t0)
        t0 = time.perf_counter()
        augment_dataset(w["teacher"], w["sessions"], w["root"] / "aug-bench", days,
                        batch_size=batch, force=True)
        best_aug = min(best_aug, time.perf_counter() - t0)
    # the skip path: every day current, only the hashing is paid
    t0 = time.perf_counter()
    skipped = augment_dataset(w["teacher"], w["sessions"], w["root"] / "aug-bench", days,
                              batch_size=batch)
    skip_s = time.perf_counter() - t0
    assert skipped["written"] == []
    return emit("exfm.augment", "augment_vs_bare_teacher_forward", "rows/s",
                candidate=round(rows / best_aug, 1), baseline=round(rows / best_bare, 1),
                better="higher", rows=rows, days=days, batch_size=batch,
                seconds_augment=round(best_aug, 3), seconds_bare=round(best_bare, 3),
                seconds_rerun_skipped=round(skip_s, 3), threads=torch.get_num_threads(),
                quick=w["quick"])


def run_student_gain(w: dict[str, Any], seeds: int = 3) -> dict[str, Any]:
    """NE of aux head + adapter vs labels only, on the last eval day, over `seeds` seeds."""
    scfg: StudentStageConfig = w["students"]
    name, size = next(iter(scfg.models.items()))
    variants = scfg.variants
    if "labels_only" not in variants or "aux_adapter" not in variants:
        variants = S.VARIANTS
    days = S.student_days(w["augmented"], w["exfm"].teacher_days, scfg.days)
    eval_day = days[-1] + 1
    ne: dict[str, list[float]] = {v: [] for v in variants}
    auc: dict[str, list[float]] = {v: [] for v in variants}
    cal: dict[str, list[float]] = {v: [] for v in variants}
    t0 = time.perf_counter()
    for seed in range(seeds):
        train_cfg = dataclasses.replace(w["student_train"], seed=seed)
        for v, dcfg in variants.items():
            rows = S.stream_student(size, dcfg, train_cfg, w["augmented"], days,
                                    w["root"] / "students" / f"{v}-{seed}", tables=w["tables"],
                                    loader_cfg=w["loader"])
            ne[v].append(rows[-1]["ne"])
            auc[v].append(rows[-1]["auc"])
            cal[v].append(rows[-1]["calibration"])
    teacher = S.teacher_per_day(w["augmented"], [eval_day])[eval_day]
    table = {"teacher": {"ne": teacher["ne"], "auc": teacher["auc"],
                         "calibration": teacher["calibration"]}}
    table.update({v: {"ne": S.mean_spread(ne[v]), "auc": S.mean_spread(auc[v]),
                      "calibration": S.mean_spread(cal[v])} for v in variants})
    gains = [b / c for b, c in zip(ne["labels_only"], ne["aux_adapter"], strict=True)]
    diffs = [b - c for b, c in zip(ne["labels_only"], ne["aux_adapter"], strict=True)]
    base, cand = S.mean_spread(ne["labels_only"]), S.mean_spread(ne["aux_adapter"])
    return emit("exfm.student_gain", f"{name}_aux_adapter_vs_labels_only", "NE",
                candidate=round(cand["mean"], 5), baseline=round(base["mean"], 5),
                better="lower", seeds=list(range(seeds)),
                candidate_per_seed=[round(x, 5) for x in ne["aux_adapter"]],
                baseline_per_seed=[round(x, 5) for x in ne["labels_only"]],
                spread={"candidate": round(cand["spread"], 5),
                        "baseline": round(base["spread"], 5),
                        "ratio": round(max(gains) - min(gains), 5)},
                mean={"candidate": round(cand["mean"], 5), "baseline": round(base["mean"], 5),
                      "ratio": round(sum(gains) / len(gains), 5)},
                # seeds change the student's initialization and data order, and move every
                # variant alike: the per-seed (paired) NE differences are the sharper test
                paired_ne_diff={k: round(v, 5) for k, v in S.mean_spread(diffs).items()},
                wins=sum(d > 0 for d in diffs),
                gain_beyond_spread=(sum(diffs) / len(diffs)
                                    > max(cand["spread"], base["spread"])),
                gain_in_every_seed=min(diffs) > 0,
                table=table, eval_day=eval_day, train_days=days,
                teacher_days=w["exfm"].teacher_days, drift=w["generate"].drift,
                sessions_per_day=w["generate"].sessions_per_day,
                seconds=round(time.perf_counter() - t0, 1), quick=w["quick"])
