"""Streaming students: which days, one model carried from day to day, the report."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from lrm.config import DistillConfig, ModelConfig, StudentModelConfig, TrainConfig
from lrm.errors import ConfigError
from lrm.exfm import students as S
from lrm.exfm.augment import TEACHER_COLUMN
from lrm.train import build_job


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


def test_stream_student_carries_one_model_through_the_days(monkeypatch, tmp_path):
    calls = []

    def fake_train_day(job, chain, day, *, owner, log_fn=None):
        calls.append((job.split.days, job.split.eval_day, chain, day, job.teacher_column,
                      job.model.student))
        ev = {"ne": 0.9 - 0.01 * day, "auc": 0.7, "calibration": 1.0, "rows": 10}
        return SimpleNamespace(steps=5, eval=ev)

    monkeypatch.setattr(S, "train_day", fake_train_day)
    model = ModelConfig(student=StudentModelConfig())
    job = build_job("student", train=TrainConfig(), model=model, data=tmp_path,
                    out=tmp_path / "m", distill=DistillConfig())
    chain = tmp_path / "chain"
    rows = S.stream_student(job, [3, 4, 5], chain, owner="student")
    assert [c[:5] for c in calls] == [([3], 4, chain, 3, TEACHER_COLUMN),
                                      ([4], 5, chain, 4, TEACHER_COLUMN),
                                      ([5], 6, chain, 5, TEACHER_COLUMN)]
    assert all(c[5].aux_head and c[5].adapter for c in calls)
    assert [(r["train_day"], r["day"]) for r in rows] == [(3, 4), (4, 5), (5, 6)]
    calls.clear()
    labels = build_job("student", train=TrainConfig(), model=model, data=tmp_path,
                       distill=DistillConfig(distill=False))
    S.stream_student(labels, [3], chain, owner="student")
    assert calls[0][4] is None and not calls[0][5].aux_head and not calls[0][5].adapter


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
