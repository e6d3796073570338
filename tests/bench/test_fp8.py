"""bench/fp8.py --smoke: layers, models and mods."""

from __future__ import annotations

from tests.bench._smoke import benches, smoke


def test_every_fp8_case_prints_its_lines() -> None:
    lines = smoke("fp8")
    assert benches(lines) == {"fp8.layer", "fp8.model", "fp8.mod"}
