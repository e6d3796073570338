"""What the strict build must refuse, planted in a copy of the docs: a broken link, a link to
an anchor that is not there, a page the nav names that is gone, and a reference to a function
that no longer exists. The same mkdocs.yml, only its docs_dir and site_dir moved. And the
figure hook's own refusals: a record without its provenance, a figure no code draws."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from mkdocs.exceptions import PluginError

from tests.docs._pages import REPO
from tests.docs.test_site import build


def _hook(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}",
                                                  REPO / "docs" / "hooks" / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_strict_build_fails_on_a_broken_link_a_gone_page_and_a_gone_function(
        tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs)
    with (docs / "getting-started.md").open("a") as f:
        f.write("\nSee [the tuning page](tuning.md) and [the knobs](exfm.md#no-such-knob).\n")
    with (docs / "training.md").open("a") as f:
        f.write("\nCall [`lrm.train.fit`][lrm.train.fit_everything] instead.\n")
    (docs / "streaming.md").unlink()  # the nav still names it
    cfg = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    cfg["docs_dir"] = str(docs)
    cfg["hooks"] = [str(REPO / h) for h in cfg["hooks"]]
    config = tmp_path / "mkdocs.yml"
    config.write_text(yaml.safe_dump(cfg))

    proc = build(config, tmp_path / "site")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "Aborted with" in out and "in strict mode" in out, out[-3000:]
    # each a warning (what strict refuses), not a line of information
    warned = "\n".join(line for line in out.splitlines() if line.startswith("WARNING"))
    assert "'tuning.md'" in warned, out[-3000:]  # the broken link
    assert "#no-such-knob" in warned, out[-3000:]  # the anchor that is not there
    assert "'streaming.md'" in warned, out[-3000:]  # the page the nav names, gone
    assert "lrm.train.fit_everything" in warned, out[-3000:]  # the function that is not there


def test_a_record_without_its_provenance_or_an_unknown_figure_fails(tmp_path: Path) -> None:
    figures = _hook("figures")
    bare = tmp_path / "exfm_ne.csv"
    bare.write_text("# date: 2026-11-29\n# machine: 2 cores\nday,feed-small/labels_only\n3,0.95\n")
    with pytest.raises(PluginError, match="no commit, command"):
        figures.read_record(bare)

    class Page:
        class file:
            src_uri = "results.md"

    with pytest.raises(PluginError, match="no such figure"):
        figures.on_page_markdown("[[figure champion_ne]]\n", Page, {}, None)
    monkey = tmp_path / "records"
    monkey.mkdir()
    figures.RECORDS = monkey  # no run recorded: a page placing the figure fails
    with pytest.raises(PluginError, match="expected one record"):
        figures.on_page_markdown("[[figure scaling]]\n", Page, {}, None)
