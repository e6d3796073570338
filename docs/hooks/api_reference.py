"""MkDocs hook: the API reference of `lrm`, one page per package, found by walking the package.

Every public module (a name without a leading underscore) of every package under `lrm/` gets
a `::: lrm.pkg.module` block that mkdocstrings renders from its docstrings, so the reference
follows the code: a module that moves shows up under its new name, one that is added needs
no edit here. What can drift is prose that names an object (`[lrm.train.build_job][]`): such a
cross-reference to a function that no longer exists is a warning of mkdocs-autorefs, which
the strict build turns into a failure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "lrm"
FOLDER = "reference/api"


def packages(root: Path = ROOT, name: str = PACKAGE) -> dict[str, list[str]]:
    """Every package under `root/name` (dotted name) -> its public modules (dotted), in
    name order; a folder without `__init__.py` is not a package."""
    out: dict[str, list[str]] = {}
    for init in sorted((root / name).rglob("__init__.py")):
        folder = init.parent
        rel = folder.relative_to(root)
        if any(p.startswith(("_", ".")) for p in rel.parts):
            continue
        dotted = ".".join(rel.parts)
        out[dotted] = [f"{dotted}.{f.stem}" for f in sorted(folder.glob("*.py"))
                       if not f.stem.startswith("_")]
    return out


def _page(package: str, modules: list[str]) -> str:
    lines = [f"# `{package}`", "",
             f"::: {package}", "    options:", "      members: false",
             "      show_root_heading: false", ""]
    for mod in modules:
        lines += [f"::: {mod}", ""]
    return "\n".join(lines)


# Where a reader of the library starts: each a cross-reference the strict build resolves, so
# one that moves or goes fails the build until this list (and the prose that names it) follows
START = {
    "lrm.config.ParamsConfig": "every section of params.yaml, typed and checked",
    "lrm.data.synthetic.generate": "the synthetic world's days",
    "lrm.data.criteo.ingest": "Criteo TSV -> the impressions layout",
    "lrm.data.logs.ingest.ingest": "any click log through a column mapping",
    "lrm.data.dedup.dedup_dataset": "RecD: impressions -> sessions",
    "lrm.train.build_job": "a training job, the one way one is made",
    "lrm.train.train": "run a job: build, run, finish",
    "lrm.train.evaluate": "score a saved model on a held-out day",
    "lrm.metrics.normalized_entropy": "the one NE",
    "lrm.registry.promote": "@champion moves when NE improves",
    "lrm.registry.load": "the @champion as an MLflow pyfunc",
}


def _index(found: dict[str, list[str]]) -> str:
    lines = ["# API reference", "",
             "Generated at build time from the docstrings of `lrm`, the library (it knows "
             "nothing of DVC or Prefect; the stages, flows and the `lrm` command are in the "
             "[CLI reference](../cli.md)).", "", "Where to start:", ""]
    lines += [f"- [`{obj}`][{obj}]: {what}" for obj, what in START.items()]
    lines += ["", "One page per package:", "", "| package | modules |", "|---|---|"]
    for pkg, mods in found.items():
        short = ", ".join(f"`{m.rsplit('.', 1)[-1]}`" for m in mods)
        lines.append(f"| [`{pkg}`]({pkg}.md) | {short} |")
    return "\n".join(lines) + "\n"


def on_config(config: Any) -> Any:
    """Put one nav entry per package under the nav's "API" entry."""
    found = packages()

    def fill(items: list[Any]) -> None:
        for i, item in enumerate(items):
            if isinstance(item, dict):
                (title, value), = item.items()
                if value == f"{FOLDER}/index.md":
                    items[i] = {title: [{"Overview": value}] +
                                [{pkg: f"{FOLDER}/{pkg}.md"} for pkg in found]}
                elif isinstance(value, list):
                    fill(value)

    fill(config["nav"] or [])
    return config


def on_files(files: Files, config: Any) -> Files:
    found = packages()
    files.append(File.generated(config, f"{FOLDER}/index.md", content=_index(found)))
    for pkg, mods in found.items():
        files.append(File.generated(config, f"{FOLDER}/{pkg}.md", content=_page(pkg, mods)))
    return files
