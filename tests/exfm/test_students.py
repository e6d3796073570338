"""The vertical models: one per vertical and size, the labels-only days before the FM serves
shared by every variant, the serving pick by measurement, the report per vertical."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from lrm.config import DistillConfig, GenerateConfig, VerticalConfig
from lrm.data import synthetic
from lrm.exfm import students as S

THREE = synthetic.schema(GenerateConfig())  # feed, search, video
ONE = synthetic.schema(GenerateConfig(verticals=[VerticalConfig(name="all")]))


def test_a_vertical_model_per_vertical_and_size():
    vms = S.vertical_models(THREE, ["small", "tiny"])
    assert [(v.name, v.vertical, v.size) for v in vms] == [
        ("feed-small", 0, "small"), ("feed-tiny", 0, "tiny"), ("search-small", 1, "small"),
        ("search-tiny", 1, "tiny"), ("video-small", 2, "small"), ("video-tiny", 2, "tiny")]
    assert vms[2].verticals == [1]
    # one surface (or no vertical column): a VM per size reading every row
    for schema in (ONE, dataclasses.replace(THREE, vertical=None)):
        (vm,) = S.vertical_models(schema, ["small"])
        assert (vm.name, vm.vertical, vm.verticals) == ("small", None, [])


def test_vertical_models_are_named_by_the_column_s_values_safely():
    """A log's raw tab values name the VMs (issue 44 item 4), made safe as folder names and
    MLflow registered model names: '/', ':', quotes and spaces go, '..' or an empty value
    is never a name, two values never share one."""
    from mlflow.utils.validation import _validate_model_name

    raw = ["tab1", "tab/1", "tab:1", "", "..", "it's 2", "-rf", "tab1"]
    schema = dataclasses.replace(THREE, vertical_names=tuple(raw),
                                 vocab={**THREE.vocab, "vertical": len(raw)})
    vms = S.vertical_models(schema, ["small"])
    names = [vm.name for vm in vms]
    assert names[0] == "tab1-small" and [vm.vertical for vm in vms] == list(range(len(raw)))
    assert len(set(names)) == len(names)
    for n in names:
        _validate_model_name(f"lrm-student-{n}")
        assert Path(n).name == n and not n.startswith((".", "-")) and " " not in n
        assert "'" not in n


def test_the_variants_go_on_from_the_labels_only_model_of_the_day_before_the_fm(
        monkeypatch, tmp_path):
    """Days before the FM serves: one labels-only chain on the sessions; from then on each
    variant its own chain on the augmented data, seeded with that labels-only model."""
    calls = []

    def fake_train_day(job, chain, day, *, owner, log_fn=None, seed=None):
        calls.append((Path(job.data).name, chain.name, day, job.split.eval_day,
                      job.split.verticals, seed, job.distill.distill))
        return SimpleNamespace(steps=3, eval={"ne": 0.9 - 0.01 * day, "auc": 0.7,
                                              "calibration": 1.0, "rows": 10})

    monkeypatch.setattr(S, "train_day", fake_train_day)
    monkeypatch.setattr(S, "newest", lambda chain, before=None: chain / "newest")
    monkeypatch.setattr(S, "too_small", lambda job, days: None)

    def job_for(vm, variant, data):
        return SimpleNamespace(data=data, distill=variant,
                               but=lambda split: SimpleNamespace(data=data, distill=variant,
                                                                 split=split))

    vm = S.VerticalModel("search-small", 1, "small")
    variants = {"labels_only": DistillConfig(distill=False), "aux_head": DistillConfig()}
    out = S.train_vm(vm, variants, job_for, sessions=tmp_path / "sessions",
                     augmented=tmp_path / "augmented", days=[0, 1, 2, 3], first_served=2,
                     chains=tmp_path / "chains", owner="student").rows
    seed = tmp_path / "chains" / S.PREFIX / "newest"
    assert calls == [
        ("sessions", S.PREFIX, 0, 1, [1], None, False),
        ("sessions", S.PREFIX, 1, 2, [1], None, False),
        ("augmented", "labels_only", 2, 3, [1], seed, False),
        ("augmented", "labels_only", 3, 4, [1], seed, False),
        ("augmented", "aux_head", 2, 3, [1], seed, True),
        ("augmented", "aux_head", 3, 4, [1], seed, True)]
    assert [r["day"] for r in out["aux_head"]] == [1, 2, 3, 4]  # the shared days in each
    assert out["aux_head"][:2] == out["labels_only"][:2]


def _rows(ne_by_day):
    return [{"train_day": d - 1, "day": d, "ne": ne, "auc": 0.7, "calibration": 1.0,
             "rows": 10} for d, ne in ne_by_day.items()]


def test_the_report_per_vertical_shows_the_served_variant_and_the_fm_on_the_last_day():
    from lrm.exfm.pick import FM, Pick

    vms = S.vertical_models(THREE, ["small"])  # feed, search, video
    results = {  # the table is day 5
        "feed-small": {"labels_only": _rows({4: 0.96, 5: 0.94}),
                       "aux_head": _rows({4: 0.95, 5: 0.945})},
        "search-small": {"labels_only": _rows({4: 0.90, 5: 0.89}),
                         "aux_head": _rows({4: 0.91, 5: 0.85})},
        "video-small": {}}  # a small surface: no VM
    by_vertical = {"feed": {"ne": 0.93, "auc": 0.75}, "search": {"ne": 0.88, "auc": 0.8},
                   "video": {"ne": 0.97, "auc": 0.7}}
    teacher = {d: {"ne": 0.9, "auc": 0.7, "teacher": "v3", "by_vertical": by_vertical}
               for d in (4, 5)}
    pick = Pick(served="aux_head", prior="aux_head", reason="r", ne={"aux_head": 0.95},
                against={}, rows=10, days=[3, 4])
    served = {"feed-small": "aux_head", "search-small": "labels_only", "video-small": FM}
    rep = S.report(results, vms, THREE, teacher, served=served,
                   picks={"feed-small": pick}, trained={"video-small": "under min_share"})
    assert rep["eval_day"] == 5 and rep["validation_days"] == [3, 4]
    feed, search = rep["verticals"]["feed"], rep["verticals"]["search"]
    assert feed["teacher"]["ne"] == 0.93 and search["teacher"]["ne"] == 0.88
    assert feed["students"]["small"]["serving"] == "aux_head"
    assert feed["students"]["small"]["pick"]["days"] == [3, 4]
    assert search["students"]["small"]["serving"] == "labels_only"
    assert feed["students"]["small"]["gain_vs_labels_only"]["aux_head"] == pytest.approx(
        0.94 / 0.945)
    assert feed["students"]["small"]["teacher_gain"] == pytest.approx(0.94 / 0.93)
    # the FM's own prediction is a variant of every VM (the summary's headline reads it)
    assert feed["students"]["small"]["variants"][FM]["ne"] == 0.93
    video = rep["verticals"]["video"]["students"]["small"]
    assert video["serving"] == FM and video["not_trained"] == "under min_share"
    assert rep["serving"] == served
    assert [(r["vertical"], r["model"]) for r in rep["table"]] == [
        ("feed", "foundation model (teacher)"), ("feed", "small, labels only"),
        ("feed", "small, auxiliary head (served)"),
        ("search", "foundation model (teacher)"), ("search", "small, labels only (served)"),
        ("search", "small, auxiliary head"),
        ("video", "foundation model (teacher)"),
        ("video", "small: serves the foundation model (no VM: a small surface)")]
    md = S.markdown(rep["table"])
    assert md.splitlines()[0] == "| vertical | model | NE | AUC |" and "| 0.8500 |" in md


def test_mean_spread():
    m = S.mean_spread([0.9, 0.92, 0.91])
    assert m["mean"] == pytest.approx(0.91) and m["spread"] == pytest.approx(0.02)
    assert S.mean_spread([1.0])["std"] == 0.0 and not math.isnan(S.mean_spread([1.0])["mean"])


@pytest.mark.parametrize("score_all", [False, True])
def test_the_pick_never_sees_the_held_out_last_day(monkeypatch, tmp_path, score_all):
    """auto picks on the validation days before the held-out last one; with score_all (the
    benchmark's, to judge the pick on each held-out day) every evaluation day is scored, the
    last too, and still the pick pools only the days before it. aux_head is far ahead on
    the last day alone: the prior serves. Red with the pooled days not cut to the
    validation days (the last day's scores seen)."""
    import torch

    from lrm.exfm.pick import Scores

    seen = []

    def fake_train_vm(vm, variants, job_for, *, validation, **kw):
        seen.append(list(validation))
        g = torch.Generator().manual_seed(0)
        y = (torch.rand(3000, generator=g) < 0.2).double()
        x = torch.randn(3000, generator=g, dtype=torch.float64) - 1.4
        scores = {d: Scores(y, {"labels_only": x, "aux_head": x + (2.0 if d == 6 else 0.0)
                                * (2 * y - 1)}) for d in validation}
        return S.VMRun({v: [] for v in variants}, scores)

    monkeypatch.setattr(S, "train_vm", fake_train_vm)
    monkeypatch.setattr(S, "last_model", lambda chains, variant: chains / variant)
    (tmp_path / "augmented" / "day=2").mkdir(parents=True)
    (tmp_path / "augmented" / "day=2" / "part-0.parquet").touch()  # the teacher serves day 2 on
    vm = S.VerticalModel("search-small", 1, "small")
    variants = {"labels_only": DistillConfig(distill=False), "aux_head": DistillConfig()}
    run = S.train_students([vm], variants, None, sessions=tmp_path, days=[0, 1, 2, 3, 4, 5],
                           augmented=tmp_path / "augmented", chains=tmp_path / "chains",
                           owner="student", rule="auto", prior="labels_only", pick_days=3,
                           fm=False, score_all=score_all)
    assert seen == [[3, 4, 5, 6] if score_all else [3, 4, 5]]
    assert run.validation == [3, 4, 5] and run.picks[vm.name].days == [3, 4, 5]
    assert run.served[vm.name] == "labels_only", run.picks[vm.name].reason
    assert sorted(run.scores[vm.name]) == seen[0]
