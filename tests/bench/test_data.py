"""bench/data.py --smoke: every data case runs and prints its lines."""

from __future__ import annotations

from tests.bench._smoke import benches, cases, smoke


def test_every_data_case_prints_its_lines() -> None:
    lines = smoke("data")
    assert benches(lines) == {"data.generate", "data.storage", "data.loader", "data.ingest",
                              "data.logs"}
    assert len(cases(lines, "data.generate")) == 2  # vs the naive loop; vs the bare write
    storage = cases(lines, "data.storage")
    assert "history_heavy" in storage and len(storage) == 6  # 2 profiles x 3 baselines
    assert len(cases(lines, "data.loader")) == 4
    logs = cases(lines, "data.logs")
    assert any("peak_rss" in c for c in logs) and any(c.endswith("_vs_floor") for c in logs)
    floor = next(x for x in lines if x["case"].endswith("_vs_floor"))  # issue 49's figures
    assert floor["aim"] == 0.8 and floor["cpu_seconds"] > 0 and floor["cpu_ratio"] > 0
