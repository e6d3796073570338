"""bench/exfm.py --smoke: the FM's lead, each vertical model's gain, augment's speed."""

from __future__ import annotations

from tests.bench._smoke import benches, cases, smoke


def test_every_exfm_case_prints_its_lines() -> None:
    lines = smoke("exfm")
    assert benches(lines) == {"exfm.teacher_gain", "exfm.student_gain", "exfm.augment"}
    assert set(cases(lines, "exfm.teacher_gain")) == {"north", "south"}  # QUICK's verticals
