"""bench/collisions.py --smoke: MCH vs hashing, and the NE bound."""

from __future__ import annotations

from tests.bench._smoke import benches, cases, smoke
from tests.conftest import CRITEO_DIR


def test_every_collisions_case_prints_its_lines() -> None:
    lines = smoke("collisions")
    assert benches(lines) == {"collisions.own_row", "collisions.ne_bound"}
    own = cases(lines, "collisions.own_row")
    assert {"synthetic-default", "synthetic-10x-ids"} <= set(own)
    assert ("criteo-sample" in own) == (CRITEO_DIR / "train.tsv").exists()
