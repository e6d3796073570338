"""Stage `summary`: the headline of the evaluated and ExFM models; metrics files that are
not what their stages write exit 2 naming the file and field, writing nothing."""

from __future__ import annotations

import json

import pytest

from lrm.errors import DataError
from stages import summary as stage

EVAL = {"student": {"ne": 0.95, "auc": 0.71, "day": 2}, "teacher": {"ne": 0.93, "auc": 0.74,
                                                                    "day": 2}}
EXFM = {"eval_day": 6, "verticals": {"all": {
    "teacher": {"ne": 0.9, "auc": 0.75, "calibration": 1.0},
    "students": {"small": {"model": "small", "serving": "labels+fm", "variants": {
        "labels": {"ne": 0.97, "auc": 0.7, "calibration": 1.0, "rows": 10},
        "labels+fm": {"ne": 0.96, "auc": 0.69, "calibration": 1.0, "rows": 10}}}}}}}


def _run(tmp_path, ev, ex):
    (tmp_path / "eval.json").write_text(json.dumps(ev))
    (tmp_path / "exfm.json").write_text(json.dumps(ex))
    return stage.run(evaluation=tmp_path / "eval.json", exfm=tmp_path / "exfm.json",
                     out=tmp_path / "summary.json", table=tmp_path / "summary.md")


def test_the_headline_of_every_model(tmp_path):
    _run(tmp_path, EVAL, EXFM)
    assert json.loads((tmp_path / "summary.json").read_text()) == {
        "student": {"ne": 0.95, "auc": 0.71}, "teacher": {"ne": 0.93, "auc": 0.74},
        "exfm_teacher": {"ne": 0.9, "auc": 0.75}, "exfm_small": {"ne": 0.96, "auc": 0.69}}
    assert "| day 2 | student | 0.9500 | 0.7100 |" in (tmp_path / "summary.md").read_text()
    pooled = {"student": {"ne": 0.95, "auc": 0.71, "days": [3, 4, 5], "per_day": {}}}
    _run(tmp_path, pooled, {})  # `lrm evaluate --days 3..5` (it said "day ")
    assert "| days 3-5 pooled | student | 0.9500 |" in (tmp_path / "summary.md").read_text()


def _cut(doc, *path):
    """`doc` with the value at `path` replaced by the last item of `path`."""
    doc = json.loads(json.dumps(doc))
    at = doc
    for k in path[:-2]:
        at = at[k]
    at[path[-2]] = path[-1]
    return doc


@pytest.mark.parametrize("ev, ex, says", [
    # the ops probe: a flat file without AUC was a row "day  | model | 1.0000 | nan", rc 0
    ({"ne": 1}, {}, "eval.json, field auc: expected a number, got null"),
    (_cut(EVAL, "student", "ne", "0.9"), EXFM, "eval.json, field student.ne: expected a "
                                                "number, got \"0.9\""),
    # ... and an ExFM file of another shape a traceback (AttributeError: 'int' ... 'items')
    (EVAL, {"verticals": 5}, "exfm.json, field verticals: expected an object, got 5"),
    (EVAL, _cut(EXFM, "verticals", "all", "students", "small", "variants", []),
     "exfm.json, field verticals.all.students.small.variants: expected an object, got []"),
    (EVAL, _cut(EXFM, "verticals", "all", "students", "small", "variants", "labels", "ne",
                None),
     "field verticals.all.students.small.variants.labels.ne: expected a number, got null"),
])
def test_metrics_not_of_their_stage_are_named_and_nothing_is_written(tmp_path, ev, ex, says):
    with pytest.raises(DataError) as e:
        _run(tmp_path, ev, ex)
    assert says in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "summary.json").exists() and not (tmp_path / "summary.md").exists()
