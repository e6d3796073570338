"""bench/checkpoint.py --smoke: bytes, stall, restore and NE lines."""

from __future__ import annotations

from tests.bench._smoke import benches, smoke


def test_every_checkpoint_case_prints_its_lines() -> None:
    lines = smoke("checkpoint")
    assert benches(lines) == {"checkpoint.bytes", "checkpoint.stall", "checkpoint.restore",
                              "checkpoint.ne"}
