"""dvc.yaml rendered from the DAG table (flows/dag.py): `python -m flows.dvc_yaml` (`make dag`)
writes dvc.yaml and pipelines/*/dvc.yaml; `--check` only says which differ.

Each node becomes a DVC stage: its command line (`python -m stages.NAME` with the node's
arguments), its deps (input paths and the repo code its stage runs, flows/code_deps.py),
the dotted params keys its stage reads, and its outs, metrics and plots.
tests/flows/test_dag.py fails when a committed dvc.yaml differs from the rendering.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from flows.code_deps import ROOT, code_deps
from flows.dag import PIPELINES, Pipeline
from stagekit import Stage


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
        explicit = [] if pipe.params == ("params.yaml",) and not node.params else \
            [*pipe.params, *node.params]
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
        ins = [str(p) for p in st.paths(args, "in")] + list(node.params)
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
    head += ("# GENERATED by `make dag` (python -m flows.dvc_yaml) from flows/dag.py (the one\n"
             "# definition of the DAG, which the Prefect flows run too): edit that table, not\n"
             "# this file.\n")
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
