"""The documentation site: `mkdocs build --strict` (what `make docs` runs) passes, and the
parts the build generates are there: every `lrm` command and option in the CLI reference,
every package of `lrm` in the API reference, every figure drawn from its record.
tests/docs/test_site_strict.py plants what the strict build must refuse."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import typer

from flows.cli import app
from tests.docs._pages import REPO

DAGS = ("dag-dvc", "dag-criteo", "dag-logs")


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict` of `config` into `site`, as `make docs` runs it."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=REPO, capture_output=True, text=True, timeout=900,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def _commands(cmd: object, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    subs = getattr(cmd, "commands", {})
    out = [path] if path else []
    for name, sub in subs.items():
        out += _commands(sub, (*path, name))
    return out


def test_site_builds_strict_with_its_generated_parts(tmp_path: Path) -> None:
    site = tmp_path / "site"
    proc = build(REPO / "mkdocs.yml", site)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    for page in ("getting-started", "concepts", "data", "training", "exfm", "streaming",
                 "results", "changelog"):
        assert (site / page / "index.html").is_file(), page

    cli = (site / "reference" / "cli" / "index.html").read_text()
    root = typer.main.get_command(app)
    for path in _commands(root):  # every command and subcommand, from the app itself
        assert f"lrm {' '.join(path)}" in cli, path
    for option in ("--train.lr", "--session-gap", "--model-dir", "--cron"):
        assert option in cli, option

    pkgs = sorted(p.parent for p in (REPO / "lrm").rglob("__init__.py"))
    for pkg in pkgs:
        dotted = ".".join(pkg.relative_to(REPO).parts)
        page = site / "reference" / "api" / dotted / "index.html"
        assert page.is_file(), dotted
    train = (site / "reference" / "api" / "lrm.train" / "index.html").read_text()
    assert "build_job" in train and "TrainJob" in train

    recorded = {p.name.split(".")[0] for p in (REPO / "docs" / "records").iterdir()
                if p.suffix in (".csv", ".jsonl")}
    assert recorded >= {"scaling", "stream"}
    for name in [*DAGS, *recorded]:  # every pipeline and every recorded run, drawn
        svg = (site / "figures" / f"{name}.svg").read_bytes()
        assert svg.startswith(b"<?xml") and b"<svg" in svg, name
    results = (site / "results" / "index.html").read_text()
    for name in recorded - {"stream"}:
        assert f"figures/{name}.svg" in results, name
    assert "figures/stream.svg" in (site / "streaming" / "index.html").read_text()
    assert "Measured " in results and "at commit" in results
    changelog = (site / "changelog" / "index.html").read_text()
    assert "loader.recd" in changelog  # CHANGELOG.md's renamed keys, included whole
