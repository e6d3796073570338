"""bench/scale.py --smoke: each stage's cost per impression and peak memory, per size."""

from __future__ import annotations

from tests.bench._smoke import benches, smoke


def test_every_scale_stage_prints_its_lines() -> None:
    lines = smoke("scale")
    stages = {"generate", "dedup", "train", "evaluate"}
    assert benches(lines) == {f"scale.{s}" for s in stages}
    assert len(lines) == len(stages) * 2  # (seconds, memory) at its one size
