"""docs/hooks/record.py: a run's output becomes a figure's record with its provenance."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from lrm.streaming import ledger
from lrm.streaming.layout import StreamPaths
from tests.docs._pages import REPO


def _record() -> Any:
    spec = importlib.util.spec_from_file_location("docs_record", REPO / "docs/hooks/record.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _decision(ne: float, champion: float | None, promoted: bool) -> dict[str, Any]:
    return {"name": "lrm-student-feed-small", "version": "2", "promoted": promoted,
            "challenger": {"ne": ne}, "champion": None if champion is None else {"ne": champion}}


def test_stream_rows_follow_the_champion_after_each_decision(tmp_path: Path) -> None:
    """Day 2: a first version (no champion) is promoted; day 3: kept, the champion stays;
    day 4: promoted, the champion is the day's challenger. Written as the flow writes them."""
    paths = StreamPaths(tmp_path)
    for day, d in ((2, _decision(0.95, None, True)), (3, _decision(0.96, 0.94, False)),
                   (4, _decision(0.92, 0.94, True))):
        ledger.write(paths, day, {"day": day, "students": {"feed-small": {"decision": d}}})
    columns, rows = _record().stream_rows(tmp_path)
    assert columns == ["day", "champion/feed-small", "challenger/feed-small"]
    assert [(r["day"], r["champion/feed-small"], r["challenger/feed-small"]) for r in rows] == \
        [(2, 0.95, 0.95), (3, 0.94, 0.96), (4, 0.92, 0.92)]


def test_a_record_carries_its_provenance_and_the_runs_lines(tmp_path: Path,
                                                            monkeypatch: Any) -> None:
    rec = _record()
    monkeypatch.setattr(rec, "RECORDS", tmp_path)
    src = tmp_path / "out.jsonl"
    line = {"bench": "scaling.fm", "case": "xs x 1d", "candidate": 0.93}
    src.write_text("[scaling] a progress line\n" + json.dumps(line) + "\n")
    rec.main(["scaling", str(src), "--command", "python bench/scaling.py", "--commit",
              "b751c6b0", "--date", "2026-11-29", "--machine", "2 cores"])
    text = (tmp_path / "scaling.jsonl").read_text().splitlines()
    assert text[:4] == ["# date: 2026-11-29", "# commit: b751c6b", "# machine: 2 cores",
                        "# command: python bench/scaling.py"]
    assert [json.loads(t) for t in text[4:]] == [line]  # the JSON lines, not the progress
