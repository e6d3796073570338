"""The day's report says what happened on that day: a teacher retrained into a model the
registry already holds (the stream's first teacher is often the very model `make run`
registered) is "no new version", not the old version's first-day promotion replayed; the
one-line description names the teacher's outcome beside the students'."""

from __future__ import annotations

from lrm.registry import Decision
from lrm.streaming import report


def _decision(name: str, version: str, promoted: bool, reason: str, earlier: bool = False,
              champion: float | None = None) -> dict:
    return Decision(name=name, version=version, promoted=promoted, reason=reason,
                    challenger={"ne": 0.93, "auc": 0.7, "calibration": 1.0, "rows": 100},
                    champion=None if champion is None else
                    {"ne": champion, "auc": 0.69, "calibration": 1.01, "rows": 100},
                    champion_version=None if champion is None else "1",
                    evaluated_on="day 3", margin=0.001, earlier=earlier).as_dict()


def _record(teacher: dict) -> dict:
    student = _decision("lrm-student-small", "2", False,
                        "NE 0.93000 vs the champion's 0.92000: gain -0.01000 < margin 0.001",
                        champion=0.92)
    return {"day": 3, "next_day": True, "evaluated_on": "day 4", "teacher": teacher,
            "augmented_by": "lrm-teacher v1", "collisions": {},
            "students": {"small": {"decision": student, "champion": "1"}}}


def test_a_teacher_registered_before_is_reported_as_no_new_version():
    first_day = "no champion yet: the first version becomes champion"
    teacher = {"due": True, "window": [0, 1, 2], "champion": "1",
               "decision": _decision("lrm-teacher", "1", True, first_day, earlier=True)}
    rec = _record(teacher)
    md = report.markdown(rec)
    assert "**lrm-teacher v1: no new version**" in md, md
    assert "lrm-teacher v1: promoted to @champion" not in md, md
    assert "| lrm-teacher | v1 | unchanged" in md
    assert "nothing was decided today" in md
    assert "lrm-teacher @champion = v1" in md
    assert report.summary(rec) == ("lrm stream day 3: lrm-teacher v1 unchanged (the same "
                                   "model was registered before); lrm-student-small v2 kept")


def test_a_decision_made_on_the_day_is_reported_with_its_scores():
    teacher = {"due": True, "window": [3], "champion": "2",
               "decision": _decision("lrm-teacher", "2", True, "NE 0.93 beats ...",
                                     champion=0.95)}
    rec = _record(teacher)
    md = report.markdown(rec)
    assert "**lrm-teacher v2: promoted to @champion**: NE 0.93 beats ..." in md
    assert "| lrm-teacher | v2 | challenger | 0.9300 |" in md
    assert "| lrm-teacher | v1 | champion | 0.9500 |" in md
    assert report.summary(rec) == ("lrm stream day 3: lrm-teacher v2 promoted; "
                                   "lrm-student-small v2 kept")
    rec["teacher"] = {"due": False, "until": 3, "next": 5}
    assert report.summary(rec) == "lrm stream day 3: teacher not due; lrm-student-small v2 kept"
