"""The DAG, defined once: every stage run of a pipeline, in order, with its arguments.

From this table come both front doors:

* `dvc.yaml` (and `pipelines/criteo/dvc.yaml`), rendered by `python -m flows.dag`: each
  node's command line, its deps (input paths and every repo module its stage imports,
  found by reading the imports), the dotted params keys its stage reads, and its outs,
  metrics and plots. tests/flows/test_dag.py fails when a committed dvc.yaml differs from
  the rendering, so neither can drift;
* the Prefect flows (flows/pipeline.py), which call each node's stage through
  `stagekit.execute` with exactly these arguments, as a task named after the node.

A node's arguments are its stage's `run` arguments (paths as strings). Nodes are listed in
an order where every input is produced by an earlier node or exists before the pipeline.
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from stages import (
    augment,
    dedup,
    evaluate,
    fp8_probe,
    generate,
    ingest,
    register,
    shard_plan,
    student,
    summary,
    teacher,
    train,
)
from stagekit import Stage

ROOT = Path(__file__).resolve().parents[1]
STAGES: dict[str, Stage] = {s.name: s for s in (
    generate.STAGE, ingest.STAGE, ingest.LOGS_STAGE, dedup.STAGE, shard_plan.STAGE, train.STAGE, evaluate.STAGE,
    teacher.STAGE, augment.STAGE, student.STAGE, register.STAGE, summary.STAGE, fp8_probe.STAGE)}


@dataclass(frozen=True)
class Node:
    """One run of a stage in a pipeline."""

    name: str  # the DVC stage name, e.g. "train_student"
    stage: Stage
    args: Mapping[str, Any] = field(default_factory=dict)
    desc: str = ""

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
                                        "plan": "plans/sharding.json", "out": "models/students"},
         desc="ExFM: a long-lived student per vertical and size, day by day, in every variant."),
    Node("register", STAGES["register"], {"models": "models/students", "data": "data/augmented"},
         desc="Each vertical model's serving variant -> lrm-student-VM; @champion moves on NE."),
    Node("summary", STAGES["summary"], {}),
))

# -- real logs: the user's Criteo TSV files in data/criteo/tsv/ ---------------------------

def _baselines(log: str) -> tuple[Node, ...]:
    """A real log's baselines: the student and the teacher on every day of
    data/LOG/sessions but the last, then both scored on the last."""
    def p(kind: str, what: str) -> str:
        return f"{what}/{log}/{kind}"

    return (*(Node(f"train_{kind}", STAGES["train"], {
        "kind": kind, "data": f"data/{log}/sessions", "out": p(kind, "models"),
        "checkpoints": p(kind, "checkpoints"), "metrics": f"metrics/{log}/train_{kind}.json",
        "plot": f"plots/{log}/train_{kind}.csv"},
        desc=f"Baseline {kind}: every day but the last, scored on the last.")
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
    *_baselines("logs"),
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


# -- rendering dvc.yaml ----------------------------------------------------------------

def _module_file(mod: str) -> Path | None:
    p = ROOT / Path(*mod.split("."))
    for c in (p.with_suffix(".py"), p / "__init__.py"):
        if c.is_file():
            return c
    return None


def _imports(path: Path) -> set[str]:
    """Repo modules (lrm.*, stages.*) imported anywhere in `path`, lazy imports included."""
    found: set[str] = set()
    pkg = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join([p for p in parts if p] + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m.split(".")[0] in ("lrm", "stagekit", "stages")}


def code_deps(stage: Stage) -> list[str]:
    """The repo code the stage's module runs (its imports, transitively, with the
    `__init__` of each package on the way), as paths relative to the repo root: a package
    whose modules it mostly runs as its folder (`by_folder`), other modules one by one."""
    return by_folder(code_files(stage))


def by_folder(files: list[str]) -> list[str]:
    """`files` with those of a package folder the stage mostly runs (more than half its
    modules) replaced by the folder: dvc.yaml reads in one screen, and a change to the
    package's other modules re-runs the stage too (the price of it). Only packages without
    subpackages fold (a folder dep covers everything under it)."""
    out, folded = [], set()
    for f in files:
        folder = (ROOT / f).parent
        if folder == ROOT or not (folder / "__init__.py").is_file() or any(
                (sub / "__init__.py").is_file() for sub in folder.iterdir() if sub.is_dir()):
            out.append(f)
            continue
        used = [g for g in files if (ROOT / g).parent == folder]
        if 2 * len(used) > len(list(folder.glob("*.py"))):
            folded.add(str(folder.relative_to(ROOT)))
        else:
            out.append(f)
    return sorted(out + list(folded))


def code_files(stage: Stage) -> list[str]:
    """Every repo file the stage's module runs (its imports, transitively, with the
    `__init__` of each package on the way), as paths relative to the repo root."""
    start = _module_file(stage.run.__module__)
    assert start is not None
    seen: set[Path] = set()
    todo = [start]
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        for m in _imports(f):
            parts = m.split(".")
            for i in range(1, len(parts) + 1):
                mf = _module_file(".".join(parts[:i]))
                if mf is not None and mf not in seen:
                    todo.append(mf)
    return sorted(str(f.relative_to(ROOT)) for f in seen)


def params_keys(stage: Stage, args: Mapping[str, Any]) -> list[str]:
    """The dotted params keys the stage reads: a top-level section as its keys, so that a
    change re-runs only the stages that read it."""
    from lrm.config import section_type

    keys: list[str] = []
    for key in stage.read_keys(args):
        tp = section_type(key)
        if "." not in key and dataclasses.is_dataclass(tp):
            keys += [f"{key}.{f.name}" for f in dataclasses.fields(tp)]
        else:
            keys.append(key)
    return sorted(dict.fromkeys(keys))


def _defined(key: str, doc: Mapping[str, Any]) -> bool:
    for part in key.split("."):
        if not isinstance(doc, Mapping) or part not in doc:
            return False
        doc = doc[part]
    return True


def command(stage: Stage, args: Mapping[str, Any], params_files: Iterable[str] = ()) -> str:
    """The command line that runs the stage with exactly `args` (`python -m stages.NAME`)."""
    words = ["python", "-m", stage.run.__module__]
    if stage.group:
        words.append(stage.group)
    for k, a in stage.args.items():
        v = args.get(k)
        if v is None:
            continue
        if isinstance(v, bool):
            words.append(a.flag if v else f"--no-{a.flag[2:]}")
            continue
        values = [str(x) for x in (v if isinstance(v, (list, tuple)) else [v])]
        words += values if not a.flag else [w for x in values for w in (a.flag, x)]
    for f in params_files:
        words += ["--params", f]
    return " ".join(words)


def render(pipe: Pipeline) -> str:
    """The dvc.yaml text of a pipeline."""
    files = {f: yaml.safe_load((ROOT / f).read_text()) or {} for f in pipe.params}
    rel = Path(*[".."] * len(pipe.dvc_file.parent.parts)) if pipe.dvc_file.parent.parts \
        else None
    stages: dict[str, Any] = {}
    plots: list[Any] = []
    for node in pipe.nodes:
        st, args = node.stage, node.full_args()
        explicit = [] if pipe.params == ("params.yaml",) else list(pipe.params)
        body: dict[str, Any] = {}
        if node.desc:
            body["desc"] = node.desc
        # every file the run writes is named on its command line: a stage run by hand
        # puts what is not named beside its output (Stage.beside_outputs), DVC's where the
        # DAG says
        own = {k: args[k] for k, a in st.args.items() if args.get(k) is not None and (
            a.role in ("metrics", "summary", "plot", "state") or (a.role == "out" and a.file))}
        body["cmd"] = command(st, {**node.args, **own}, explicit)
        if rel is not None:
            body["wdir"] = str(rel)
        ins = [str(p) for p in st.paths(args, "in")]
        body["deps"] = ins + code_deps(st)
        by_file: dict[str, list[str]] = {}
        for key in params_keys(st, args):
            owner = next((f for f in reversed(pipe.params) if _defined(key, files[f])),
                         "params.yaml")
            by_file.setdefault(owner, []).append(key)
        if by_file:
            body["params"] = [k for k in by_file.pop("params.yaml", [])] + \
                [{f: keys} for f, keys in by_file.items()]
        outs: list[Any] = []
        metrics: list[Any] = []
        for k, a in st.args.items():
            for p in st.paths({k: args.get(k)}, "out", "metrics", "summary", "plot"):
                if a.role == "summary":
                    metrics.append({str(p): {"cache": False}})
                elif a.role == "plot":
                    outs += [{str(p): {"cache": False}}, {str(p.with_suffix(".png")):
                                                          {"cache": False}}]
                    # top-level plots resolve against the dvc.yaml's folder, not wdir
                    png = p.with_suffix(".png")
                    if pipe.plots:
                        plots.append(str(rel / png if rel is not None else png))
                elif a.role == "metrics" or not a.cache:
                    outs.append({str(p): {"cache": False}})
                elif a.persist:
                    outs.append({str(p): {"persist": True}})
                else:
                    outs.append(str(p))
        if outs:
            body["outs"] = outs
        if metrics:
            body["metrics"] = metrics
        stages[node.name] = body
    doc: dict[str, Any] = {"stages": stages}
    if plots:
        doc["plots"] = plots
    head = "".join(f"# {line}\n" for line in pipe.header.splitlines())
    head += ("# GENERATED by `python -m flows.dag` from flows/dag.py (the one definition of the\n"
             "# DAG, which the Prefect flows run too): edit that table, not this file.\n")
    return head + yaml.safe_dump(doc, sort_keys=False, width=100)


def main(argv: list[str] | None = None) -> int:
    """Write every pipeline's dvc.yaml (`--check`: only say which differ, exit 1 if any)."""
    argv = sys.argv[1:] if argv is None else argv
    stale = []
    for pipe in PIPELINES.values():
        text, path = render(pipe), ROOT / pipe.dvc_file
        if path.exists() and path.read_text() == text:
            continue
        stale.append(str(pipe.dvc_file))
        if "--check" not in argv:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    verb = "differ from flows/dag.py" if "--check" in argv else "written"
    print(f"{', '.join(stale)}: {verb}" if stale else "dvc.yaml files are up to date")
    return 1 if stale and "--check" in argv else 0


if __name__ == "__main__":
    sys.exit(main())
