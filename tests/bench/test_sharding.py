"""bench/sharding.py --smoke: a plan against torchrec's, and the cost model against 2 ranks."""

from __future__ import annotations

from tests.bench._smoke import benches, smoke


def test_every_sharding_case_prints_its_lines() -> None:
    lines = smoke("sharding")
    assert benches(lines) == {"sharding.imbalance", "sharding.plan_time", "sharding.estimate"}
