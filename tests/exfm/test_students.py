"""Streaming students: which days, warm starts from the previous day, the report."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from lrm.config import DistillConfig, StudentModelConfig, TrainConfig
from lrm.errors import ConfigError
from lrm.exfm import students as S
from lrm.exfm.augment import TEACHER_COLUMN
from tests.train.conftest import datasets  # noqa: F401  (session fixture, days 0-2)


def test_student_days(datasets):  # noqa: F811
    data = datasets["sessions"]
    assert S.student_days(data, 1) == [1]  # day 2 is the last: only evaluated on
    assert S.student_days(data, 0, [0, 1]) == [0, 1]
    with pytest.raises(ConfigError, match="no day to train on"):
        S.student_days(data, 2)
    with pytest.raises(ConfigError, match=r"need days \[3\]"):
        S.student_days(data, 1, [2])
    with pytest.raises(ConfigError, match="before T"):
        S.student_days(data, 1, [0])


def test_stream_student_warm_starts_each_day_from_the_last(monkeypatch, tmp_path):
    calls = []

    def fake_train(kind, cfg, model_cfg, data, **kw):
        split = kw["split"]
        calls.append((split.days, split.eval_day, kw["init_from"], kw["teacher_column"],
                      model_cfg.student))
        ev = {"ne": 0.9 - 0.01 * split.days[0], "auc": 0.7, "calibration": 1.0, "rows": 10}
        return SimpleNamespace(steps=5, eval=ev)

    monkeypatch.setattr(S, "train", fake_train)
    out = tmp_path / "m"
    rows = S.stream_student(StudentModelConfig(), DistillConfig(), TrainConfig(), tmp_path, [3, 4, 5],
                            out)
    assert [(c[0], c[1], c[2], c[3]) for c in calls] == [
        ([3], 4, None, TEACHER_COLUMN), ([4], 5, out, TEACHER_COLUMN),
        ([5], 6, out, TEACHER_COLUMN)]
    assert all(c[4].aux_head and c[4].adapter for c in calls)
    assert [(r["train_day"], r["day"]) for r in rows] == [(3, 4), (4, 5), (5, 6)]
    calls.clear()
    S.stream_student(StudentModelConfig(), DistillConfig(distill=False), TrainConfig(), tmp_path,
                     [3], out)
    assert calls[0][3] is None and not calls[0][4].aux_head and not calls[0][4].adapter


def _rows(ne_by_day):
    return [{"train_day": d - 1, "day": d, "ne": ne, "auc": 0.7, "calibration": 1.0}
            for d, ne in ne_by_day.items()]


def test_report_table_per_day_and_gain():
    results = {"s": {"aux_adapter": _rows({4: 0.95, 5: 0.93}),  # given out of order
                     "labels_only": _rows({4: 0.96, 5: 0.94})}}
    teacher = {4: {"ne": 0.92, "auc": 0.72}, 5: {"ne": 0.935, "auc": 0.71}}
    rep = S.report(results, teacher, teacher_days=3)
    assert rep["eval_day"] == 5
    assert [r["model"] for r in rep["table"]] == [
        "teacher (stale: trained to day 3)", "student s, labels only",
        "student s, auxiliary head + adapter"]
    assert [r["ne"] for r in rep["table"]] == [0.935, 0.94, 0.93]
    assert rep["per_day"] == [{"day": 4, "teacher": 0.92, "s/labels_only": 0.96,
                               "s/aux_adapter": 0.95},
                              {"day": 5, "teacher": 0.935, "s/labels_only": 0.94,
                               "s/aux_adapter": 0.93}]
    assert rep["gain_vs_labels_only"]["s"]["aux_adapter"] == pytest.approx(0.94 / 0.93)
    md = S.markdown(rep["table"])
    assert md.splitlines()[0] == "| model | NE | AUC |" and "| 0.9300 |" in md


def test_mean_spread():
    m = S.mean_spread([0.9, 0.92, 0.91])
    assert m["mean"] == pytest.approx(0.91) and m["spread"] == pytest.approx(0.02)
    assert S.mean_spread([1.0])["std"] == 0.0 and not math.isnan(S.mean_spread([1.0])["mean"])
