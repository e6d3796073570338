"""The repo code a stage runs, read from its imports (lazy ones too, transitively): the code
deps dvc.yaml lists for it (flows/dvc_yaml.py), so a change to that code re-runs the stage."""

from __future__ import annotations

import ast
from pathlib import Path

from stagekit import Stage

ROOT = Path(__file__).resolve().parents[1]  # the repository: dvc.yaml's paths are its


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
