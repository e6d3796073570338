"""The DAG, defined once: every stage run of a pipeline, in order, with its arguments.

From this table come both front doors:

* `dvc.yaml` (and pipelines/*/dvc.yaml), rendered from it by flows/dvc_yaml.py (`make dag`:
  each node's command line, deps, params, outs); tests/flows/test_dag.py fails when a
  committed dvc.yaml differs from the rendering, so neither can drift;
* the Prefect flows (flows/pipeline.py), which call each node's stage through
  `stagekit.execute` with exactly these arguments, as a task named after the node.

A node's arguments are its stage's `run` arguments (paths as strings). Nodes are listed in
an order where every input is produced by an earlier node or exists before the pipeline.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stages import (
    augment,
    dedup,
    evaluate,
    fp8_probe,
    generate,
    ingest,
    ingest_logs,
    register,
    shard_plan,
    student,
    summary,
    teacher,
    train,
    tune,
)
from stagekit import Stage

STAGES: dict[str, Stage] = {s.name: s for s in (
    generate.STAGE, ingest.STAGE, ingest_logs.STAGE, dedup.STAGE, shard_plan.STAGE, train.STAGE,
    evaluate.STAGE, teacher.STAGE, augment.STAGE, student.STAGE, register.STAGE, summary.STAGE,
    fp8_probe.STAGE, tune.STAGE)}


@dataclass(frozen=True)
class Node:
    """One run of a stage in a pipeline."""

    name: str  # the DVC stage name, e.g. "train_student"
    stage: Stage
    args: Mapping[str, Any] = field(default_factory=dict)
    desc: str = ""
    # params files laid over the pipeline's for this node alone, made by an earlier node
    # (a tune node's params file): on its command line (--params) and among its deps
    params: tuple[str, ...] = ()

    def full_args(self) -> dict[str, Any]:
        return self.stage.complete(self.args)

    @property
    def title(self) -> str:
        return self.stage.title(self.full_args())


@dataclass(frozen=True)
class Pipeline:
    """A DAG of nodes and where its dvc.yaml lives (`wdir`: the repo root, relative)."""

    name: str
    nodes: tuple[Node, ...]
    dvc_file: Path  # relative to the repo root
    params: tuple[str, ...] = ("params.yaml",)  # params files, later ones win
    header: str = ""
    # its PNGs as dvc.yaml's top-level plots. DVC warns of every declared plot that is
    # missing, so a pipeline a user may never run (your own logs) declares none: its PNGs
    # show with `dvc plots show plots/logs/*.png`
    plots: bool = True


# -- the default pipeline: synthetic data, baselines, ExFM ------------------------------

SYNTHETIC = Pipeline("lrm", dvc_file=Path("dvc.yaml"), header=(
    "The default pipeline: synthetic sessions -> RecD dedup -> baselines (student and teacher,\n"
    "held-out last day) -> ExFM (teacher on days [0, T), augmented data, students day by\n"
    "day) -> headline metrics. Real Criteo logs: pipelines/criteo/dvc.yaml."), nodes=(
    Node("generate", STAGES["generate"], {"out": "data/raw"}),
    Node("dedup", STAGES["dedup"], {"src": "data/raw", "out": "data/sessions"}),
    Node("shard_plan", STAGES["shard_plan"], {"data": "data/sessions",
                                              "calibration": "lrm/sharding/calibration",
                                              "out": "plans/sharding.json"},
         desc="Table statistics -> cost model -> where every model's tables go."),
    *(Node(f"train_{kind}", STAGES["train"], {
        "kind": kind, "data": "data/sessions", "plan": "plans/sharding.json",
        "out": f"models/baseline/{kind}", "checkpoints": f"checkpoints/baseline/{kind}",
        "metrics": f"metrics/train_{kind}.json", "plot": f"plots/train_{kind}.csv"},
        desc=f"Baseline {kind}: every synthetic day but the last, scored on the last.")
      for kind in ("student", "teacher")),
    Node("evaluate", STAGES["evaluate"], {
        "models": ["student=models/baseline/student", "teacher=models/baseline/teacher"],
        "data": "data/sessions", "out": "metrics/eval.json"}),
    Node("fp8_probe", STAGES["fp8_probe"], {
        "models": ["student=models/baseline/student", "teacher=models/baseline/teacher"],
        "data": "data/sessions", "out": "reports/fp8_probe.json", "table": "reports/fp8_probe.md",
        "metrics": "metrics/fp8_probe.json"},
         desc="LoKA: per layer of the baselines, FP8 error and speed; the layers train.fp8 may "
              "run in FP8."),
    Node("teacher", STAGES["teacher"], {"data": "data/sessions", "plan": "plans/sharding.json",
                                        "out": "models/teacher"},
         desc="ExFM: the foundation model (Wukong on every vertical), version after version "
              "on its own cadence (exfm.teacher_every), lagging the students."),
    Node("augment", STAGES["augment"], {"data": "data/sessions", "teacher": "models/teacher",
                                        "out": "data/augmented"}),
    Node("student", STAGES["student"], {"data": "data/augmented", "sessions": "data/sessions",
                                        "teacher": "models/teacher",
                                        "plan": "plans/sharding.json", "out": "models/students"},
         desc="ExFM: a long-lived student per vertical and size, day by day, in every variant."),
    Node("register", STAGES["register"], {"models": "models/students", "data": "data/augmented"},
         desc="Each vertical model's serving variant -> lrm-student-VM; @champion moves on NE."),
    Node("summary", STAGES["summary"], {}),
))

# -- real logs: the user's Criteo TSV files in data/criteo/tsv/ ---------------------------

def _tuned(log: str, kind: str) -> str:
    """The params file a log's tune node writes for `kind`."""
    return f"models/{log}/tune_{kind}.yaml"


def _tune(log: str) -> tuple[Node, ...]:
    """A log's tune nodes: each model's training params searched on the days before the
    held-out last day, where tune.in_pipeline says so (else a file that changes nothing)."""
    return tuple(Node(f"tune_{kind}", STAGES["tune"], {
        "kind": kind, "data": f"data/{log}/sessions", "out": _tuned(log, kind),
        "if_enabled": True, "metrics": f"metrics/{log}/tune_{kind}.json"},
        desc=f"The {kind}'s training params searched on the days before the held-out one "
             f"(Optuna; on where tune.in_pipeline is true): a params file the baseline "
             f"{kind} trains with.") for kind in ("student", "teacher"))


def _baselines(log: str, tuned: bool = False) -> tuple[Node, ...]:
    """A real log's baselines: the student and the teacher on every day of
    data/LOG/sessions but the last, then both scored on the last (`tuned`: each with
    its tune node's params file laid over the pipeline's)."""
    def p(kind: str, what: str) -> str:
        return f"{what}/{log}/{kind}"

    return (*(Node(f"train_{kind}", STAGES["train"], {
        "kind": kind, "data": f"data/{log}/sessions", "out": p(kind, "models"),
        "checkpoints": p(kind, "checkpoints"), "metrics": f"metrics/{log}/train_{kind}.json",
        "plot": f"plots/{log}/train_{kind}.csv"},
        desc=f"Baseline {kind}: every day but the last, scored on the last.",
        params=(_tuned(log, kind),) if tuned else ())
        for kind in ("student", "teacher")),
        Node("evaluate", STAGES["evaluate"], {
            "models": [f"{kind}={p(kind, 'models')}" for kind in ("student", "teacher")],
            "data": f"data/{log}/sessions", "out": f"metrics/{log}/eval.json"}))

CRITEO = Pipeline("lrm-criteo", dvc_file=Path("pipelines/criteo/dvc.yaml"),
                  params=("params.yaml", "pipelines/criteo/params.yaml"), header=(
    "Real logs: Criteo TSV files (label, I1..I13, C1..C26) put in data/criteo/tsv/ (one day\n"
    "per file, in name order; the last is held out). Run: dvc repro pipelines/criteo/dvc.yaml"),
    nodes=(
    Node("ingest", STAGES["ingest"], {"files": ["data/criteo/tsv"], "out": "data/criteo/raw",
                                      "metrics": "metrics/criteo/ingest.json"}),
    Node("dedup", STAGES["dedup"], {"src": "data/criteo/raw", "out": "data/criteo/sessions",
                                    "metrics": "metrics/criteo/dedup.json"}),
    *_baselines("criteo"),
))

# -- real logs: any click log in data/logs/in/, through the mapping in its params ----------

LOGS = Pipeline("lrm-logs", dvc_file=Path("pipelines/logs/dvc.yaml"), plots=False,
                params=("params.yaml", "pipelines/logs/params.yaml"), header=(
    "Real logs: any click log (Parquet, CSV/TSV, JSON lines) put in data/logs/in/, read through\n"
    "the column mapping `ingest.logs` of pipelines/logs/params.yaml (days, sessions and histories\n"
    "from the data) -> RecD dedup -> baselines (student and teacher, the last day held out) ->\n"
    "ExFM: the foundation model version after version, the augmented days, the vertical models\n"
    "day by day -> the registry. Run: dvc repro pipelines/logs/dvc.yaml; its plots: dvc plots\n"
    "show plots/logs/*.png (none declared here: DVC warns of declared plots not yet made)"), nodes=(
    Node("ingest", STAGES["ingest_logs"], {"files": ["data/logs/in"], "out": "data/logs/raw",
                                           "metrics": "metrics/logs/ingest.json"}),
    Node("dedup", STAGES["dedup"], {"src": "data/logs/raw", "out": "data/logs/sessions",
                                    "metrics": "metrics/logs/dedup.json"}),
    *_tune("logs"),
    *_baselines("logs", tuned=True),
    Node("exfm_teacher", STAGES["teacher"], {
        "data": "data/logs/sessions", "out": "models/logs/fm",
        "checkpoints": "checkpoints/logs/fm", "metrics": "metrics/logs/teacher.json",
        "plot": "plots/logs/teacher.csv"},
         desc="ExFM: the foundation model on every vertical, version after version."),
    Node("augment", STAGES["augment"], {"data": "data/logs/sessions",
                                        "teacher": "models/logs/fm",
                                        "out": "data/logs/augmented",
                                        "metrics": "metrics/logs/augment.json"}),
    Node("student", STAGES["student"], {"data": "data/logs/augmented",
                                        "sessions": "data/logs/sessions",
                                        "teacher": "models/logs/fm",
                                        "out": "models/logs/students",
                                        "checkpoints": "checkpoints/logs/students",
                                        "metrics": "metrics/logs/exfm.json",
                                        "table": "metrics/logs/exfm.md",
                                        "plot": "plots/logs/exfm_ne.csv"},
         desc="ExFM: a long-lived student per vertical and size, day by day, in every variant."),
    Node("register", STAGES["register"], {"models": "models/logs/students",
                                          "data": "data/logs/augmented",
                                          "metrics": "metrics/logs/register.json"},
         desc="Each vertical model's serving variant -> lrm-student-VM; @champion moves on NE."),
))

PIPELINES = {p.name: p for p in (SYNTHETIC, CRITEO, LOGS)}


if __name__ == "__main__":  # `python -m flows.dag`, as before: renders (make dag: flows.dvc_yaml)
    import runpy

    runpy.run_module("flows.dvc_yaml", run_name="__main__")
