"""The one DAG: dvc.yaml is flows/dag.py's rendering (flows/dvc_yaml.py, its code deps from
flows/code_deps.py), its nodes are consistent, and imports flow one way."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from flows import code_deps, dag, dvc_yaml
from lrm.config import section_type
from tests.conftest import REPO


@pytest.mark.parametrize("name", sorted(dag.PIPELINES))
def test_committed_dvc_yaml_is_the_rendering_of_the_table(name):
    pipe = dag.PIPELINES[name]
    assert (REPO / pipe.dvc_file).read_text() == dvc_yaml.render(pipe), (
        f"{pipe.dvc_file} is stale: run `make dag`")


@pytest.mark.parametrize("name", sorted(dag.PIPELINES))
def test_every_input_is_made_by_an_earlier_node_or_given(name):
    made: set[Path] = set()
    given = {Path("data/criteo/tsv"), Path("data/logs/in"),  # the user's files
             Path("lrm/sharding/calibration")}  # the repo's cost-model calibrations
    for node in dag.PIPELINES[name].nodes:
        args = node.full_args()
        for p in node.stage.paths(args, "in"):
            assert p in made or p in given or any(m in p.parents for m in made), (
                f"{node.name} reads {p} before anything makes it")
        made |= set(node.stage.paths(args, "out", "metrics", "summary", "plot"))


@pytest.mark.parametrize("name", sorted(dag.PIPELINES))
def test_no_two_nodes_write_the_same_path(name):
    owner: dict[Path, str] = {}
    for node in dag.PIPELINES[name].nodes:
        args = node.full_args()
        for p in node.stage.paths(args, "out", "metrics", "summary", "plot", "state"):
            for q, other in owner.items():
                assert not (p == q or q in p.parents or p in q.parents), (
                    f"{node.name} and {other} both write {p if p == q else (p, q)}")
        owner.update({p: node.name for p in node.stage.paths(args, "out", "metrics",
                                                                  "summary", "plot", "state")})


def test_stage_lists_dotted_keys_that_params_yaml_defines():
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    doc = yaml.safe_load((REPO / "dvc.yaml").read_text())
    for name, body in doc["stages"].items():
        for key in body.get("params", []):
            assert isinstance(key, str) and "." in key, (name, key)
            node = params
            for part in key.split("."):
                assert part in node, f"{name}: params.yaml lacks {key}"
                node = node[part]
            section_type(key)  # and lrm.config knows it


def test_a_params_change_reruns_only_the_stages_that_read_it():
    doc = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    readers = {k: {n for n, b in doc.items() if k in b.get("params", [])}
               for k in ("model.teacher", "model.student", "train.lr", "generate.days",
                         "teacher.train", "students.train")}
    assert readers["model.teacher"] == {"train_teacher", "teacher"}
    # the teacher's training values (ParamsConfig.train_for): the baseline student's not
    assert readers["teacher.train"] == {"train_teacher", "teacher"}
    assert readers["students.train"] == {"student"}
    assert readers["model.student"] == {"train_student"}
    assert readers["train.lr"] == {"train_student", "train_teacher", "teacher", "student"}
    assert readers["generate.days"] == {"generate"}


def test_deps_cover_every_module_a_stage_imports():
    """Plant: drop a dep from dvc.yaml, or add an import to a stage, and this goes red."""
    doc = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    for name, body in doc.items():
        module = body["cmd"].split()[2]
        deps = set(body["deps"])
        stage = next(s for s in dag.STAGES.values() if s.run.__module__ == module)
        covered = lambda f: any(d == f or f.startswith(d + "/") for d in deps)  # noqa: E731
        for f in code_deps.code_files(stage):
            assert covered(f), f"{name}: imports {f} but its deps do not cover it"
        assert covered("lrm/io.py") and covered("stagekit/runner.py")
        assert "stagekit" in deps  # a package a stage mostly runs is listed as its folder


# -- import rules ------------------------------------------------------------------------

def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


def _files(pkg: str) -> list[Path]:
    return sorted((REPO / pkg).rglob("*.py"))


FORBIDDEN = {  # package -> module prefixes it must never import
    "lrm": ("stagekit", "stages", "flows", "dvc", "prefect"),
    "lrm/data": ("lrm.models", "lrm.train", "lrm.exfm", "lrm.checkpoint", "lrm.sharding",
                 "lrm.serving", "lrm.fp8", "torchrec.distributed"),
    "lrm/models": ("lrm.train", "lrm.checkpoint", "lrm.exfm.students", "lrm.serving"),
    # training knows nothing of its callers: ExFM hands a job its loss, column and grown
    # parts, FP8 its transform (lrm.train.job)
    "lrm/train": ("lrm.exfm", "lrm.fp8", "lrm.registry", "lrm.serving", "lrm.streaming"),
    "lrm/fp8": ("lrm.train", "lrm.exfm", "lrm.registry", "lrm.streaming"),  # beside the models
    "stagekit": ("stages", "flows", "dvc", "prefect"),
    "stages": ("flows", "prefect"),
}


@pytest.mark.parametrize("pkg", sorted(FORBIDDEN))
def test_imports_flow_one_way(pkg):
    bad = [(f.relative_to(REPO), m) for f in _files(pkg) for m in _imports(f)
           if any(m == p or m.startswith(p + ".") for p in FORBIDDEN[pkg])]
    assert not bad, f"{pkg} must not import these: {bad}"


def test_no_stage_imports_another_stage():
    names = {f.stem for f in (REPO / "stages").glob("*.py") if not f.stem.startswith("_")}
    for f in (REPO / "stages").glob("*.py"):
        for m in _imports(f):
            parts = m.split(".")
            if parts[0] == "stages" and len(parts) > 1 and parts[1] in names:
                assert parts[1] == f.stem, f"stages/{f.name} imports stages.{parts[1]}"
